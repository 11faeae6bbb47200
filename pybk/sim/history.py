"""The recorded history of one simulated run: what every process asked and what it got back.

The checker (:mod:`pybk.sim.checker`) works on this record alone, so it can be unit-tested
with hand-made histories. Events are kept in the order they happened (their index is the
real-time order; ``t`` is the virtual time) and each carries the trace line number where it
was logged, so a violation report can quote the lines that matter.

Outcomes follow Jepsen: ``ok`` (it happened), ``fail`` (it definitely did not happen) and
``info`` (indeterminate: a timeout, a fenced add, a crash).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "FAIL",
    "INFO",
    "OK",
    "Event",
    "History",
]

OK = "ok"
FAIL = "fail"
INFO = "info"


def _show(payload: bytes) -> str:
    """A payload for the trace: the workload's are text; a log's entries (envelopes) are
    shown by their size and their records' visible text."""
    if payload[:2] == b"PE":
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in payload[32:])
        return f"<envelope {len(payload)} B> {text[-60:]}"
    return payload.decode(errors="replace")


@dataclass(slots=True, eq=False)
class Event:
    """One history event. ``kind`` decides which fields mean something (see History methods).

    Never changed once recorded (not a frozen dataclass only because those are several times
    slower to make, and a run records tens of thousands); compared by identity."""

    index: int
    t: float
    kind: str
    process: str
    ledger: int = -1
    entry: int = -1
    payload: bytes | None = None
    value: int = -1
    outcome: str = ""
    detail: str = ""
    line: int = -1
    #: a log record's position (segment, entry, slot), for the log events
    pos: tuple[int, int, int] | None = None


@dataclass
class History:
    """Append-only event log with typed recorders."""

    events: list[Event] = field(default_factory=list)
    #: Called with a line to append to the run's trace; returns its line number.
    log: Callable[[str], int] | None = None
    now: Callable[[], float] = lambda: 0.0
    #: the trace's lines, when lines go straight to it ("<time> <text>", as ``log`` writes)
    trace: list[str] | None = None
    #: the ledgers the ledger workload created (a log's segments are ledgers too, checked by
    #: the log invariants instead)
    created: set[int] = field(default_factory=set)
    #: bookie -> its ``bookie_ack`` events, in order (what a bookie audit asks about, without
    #: a walk over every event of the run per audit)
    acks: dict[str, list[Event]] = field(default_factory=dict)
    #: the last event's time and its trace stamp ("<time> "), formatted once per instant
    _stamp_t: float = field(default=-1.0, repr=False)
    _stamp: str = field(default="", repr=False)

    def _add(self, kind: str, process: str, text: str, ledger: int = -1, entry: int = -1,
             payload: bytes | None = None, value: int = -1, outcome: str = "",
             detail: str = "", pos: tuple[int, int, int] | None = None) -> Event:
        t = self.now()
        trace = self.trace
        if trace is not None:  # (the run's trace itself, stamped as trace_line does, inlined:
            line = len(trace)  # a call per event is 0.45% of a seed's instructions)
            if t != self._stamp_t:
                self._stamp_t = t
                self._stamp = f"{t:11.6f} "
            trace.append(self._stamp + text)
        else:
            line = self.log(text) if self.log is not None else -1
        events = self.events
        ev = Event(len(events), t, kind, process, ledger, entry, payload, value, outcome, detail,
                   line, pos)
        events.append(ev)
        return ev

    def trace_line(self, text: str) -> int:
        """Append ``text`` to the trace (set) stamped with the time, as events are; its line
        number. The stamp is formatted once per instant: lines come in runs at one."""
        trace = self.trace
        assert trace is not None
        t = self.now()
        if t != self._stamp_t:
            self._stamp_t = t
            self._stamp = f"{t:11.6f} "
        trace.append(self._stamp + text)
        return len(trace) - 1

    # -- writers -----------------------------------------------------------------------------

    def create(self, process: str, ledger: int, detail: str = "", qa: int = -1) -> Event:
        """``qa``: the ledger's ack quorum (-1: unknown)."""
        self.created.add(ledger)
        return self._add("create", process, f"{process} create L{ledger} {detail}".rstrip(),
                         ledger=ledger, detail=detail, value=qa)

    def add_invoke(self, process: str, ledger: int, entry: int, payload: bytes) -> Event:
        return self._add("add_invoke", process,
                         f"{process} add L{ledger}:{entry} {payload.decode(errors='replace')}",
                         ledger=ledger, entry=entry, payload=payload)

    def add_complete(self, process: str, ledger: int, entry: int, outcome: str,
                     detail: str = "") -> Event:
        return self._add("add_done", process, f"{process} add L{ledger}:{entry} -> {outcome} "
                         f"{detail}".rstrip(), ledger=ledger, entry=entry, outcome=outcome,
                         detail=detail)

    # -- closes and recoveries -----------------------------------------------------------------

    def close_invoke(self, process: str, ledger: int, how: str) -> Event:
        return self._add("close_invoke", process, f"{process} {how} L{ledger} start",
                         ledger=ledger, detail=how)

    def close_complete(self, process: str, ledger: int, how: str, outcome: str,
                       last_entry: int = -1, detail: str = "") -> Event:
        return self._add("close_done", process,
                         f"{process} {how} L{ledger} -> {outcome} last={last_entry} {detail}"
                         .rstrip(), ledger=ledger, value=last_entry, outcome=outcome,
                         detail=how + ("|" + detail if detail else ""))

    def metadata(self, process: str, ledger: int, state: str, last_entry: int) -> Event:
        return self._add("metadata", process, f"{process} sees L{ledger} {state} "
                         f"last={last_entry}", ledger=ledger, value=last_entry, detail=state)

    def delete(self, process: str, ledger: int, outcome: str) -> Event:
        return self._add("delete", process, f"{process} delete L{ledger} -> {outcome}",
                         ledger=ledger, outcome=outcome)

    # -- readers -------------------------------------------------------------------------------

    def read(self, process: str, ledger: int, entry: int, payload: bytes, lac_seen: int,
             recovery: bool, final: bool = False) -> Event:
        mode = "final" if final else ("recovery" if recovery else "tail")
        return self._add("read", process, f"{process} read L{ledger}:{entry} "
                         f"{payload.decode(errors='replace')} lac={lac_seen} {mode}",
                         ledger=ledger, entry=entry, payload=payload, value=lac_seen,
                         detail=mode)

    def read_error(self, process: str, ledger: int, entry: int, error: str,
                   final: bool = False) -> Event:
        return self._add("read_error", process, f"{process} read L{ledger}:{entry} error "
                         f"{error}", ledger=ledger, entry=entry, detail=error,
                         outcome="final" if final else "")

    def tail_gap(self, process: str, ledger: int, expected: int, got: int) -> Event:
        """A ledger's ``tail()`` yielded ``got`` where ``expected`` was next."""
        return self._add("tail_gap", process, f"{process} tail of L{ledger} went from entry "
                         f"{expected - 1} to {got}", ledger=ledger, entry=expected, value=got)

    def lac(self, process: str, ledger: int, lac: int, handle: int = 0) -> Event:
        """``process`` saw ``lac`` through its ledger handle number ``handle`` (BookKeeper
        keeps a handle's LAC from going back; a handle opened later may start lower)."""
        return self._add("lac", process, f"{process} lac L{ledger} = {lac}", ledger=ledger,
                         value=lac, detail=str(handle))

    # -- bookies (observed by the simulated network and the restart audit) ---------------------

    def bookie_acked(self, bookie: str, ledger: int, entry: int, recovery: bool = False) -> Event:
        """``recovery``: a recovery's write-back (it may go to replacements the recovery keeps
        to itself until its close names them)."""
        ev = self._add("bookie_ack", bookie, f"{bookie} acked L{ledger}:{entry}"
                       + (" (recovery)" if recovery else ""),
                       ledger=ledger, entry=entry, detail="recovery" if recovery else "")
        self.acks.setdefault(bookie, []).append(ev)
        return ev

    def ensembles(self, ledger: int, ensemble_size: int, write_quorum: int,
                  ensembles: Mapping[int, tuple[str, ...]]) -> Event:
        """The ledger's metadata now names these ensembles (each from its first entry)."""
        detail = f"{ensemble_size}/{write_quorum}|" + ";".join(
            f"{first}:{','.join(bookies)}" for first, bookies in sorted(ensembles.items()))
        return self._add("ensembles", "meta", f"meta L{ledger} ensembles {detail}",
                         ledger=ledger, detail=detail)

    @staticmethod
    def parse_ensembles(detail: str) -> tuple[int, int, list[tuple[int, tuple[str, ...]]]]:
        """(E, Qw, [(first entry, ensemble), ...] ascending) from an ``ensembles`` event."""
        sizes, _, rest = detail.partition("|")
        e, _, qw = sizes.partition("/")
        segments = []
        for part in rest.split(";"):
            first, _, bookies = part.partition(":")
            segments.append((int(first), tuple(bookies.split(","))))
        return int(e), int(qw), segments

    def bookie_absent(self, bookie: str, ledger: int, entry: int, how: str) -> Event:
        return self._add("bookie_absent", bookie, f"{bookie} says L{ledger}:{entry} absent "
                         f"({how})", ledger=ledger, entry=entry, detail=how)

    def gc_collect(self, bookie: str, ledger: int) -> Event:
        """A bookie's garbage collector is deleting ``ledger`` (it must be deleted in the
        metadata already: I16)."""
        return self._add("gc_collect", bookie, f"{bookie} gc collects L{ledger}",
                         ledger=ledger)

    def index_mismatch(self, bookie: str, detail: str) -> Event:
        """The bookie's index checkpoint chain plus its journal is not the index its
        segments hold (the offline inspection, ``pybk.bookie.inspect``)."""
        return self._add("index_mismatch", bookie, f"{bookie} index checkpoint {detail}",
                         detail=detail)

    def bookie_served(self, bookie: str, ledger: int, entry: int, payload: bytes | None,
                      detail: str = "") -> Event:
        """A bookie answered OK with bytes: ``payload`` None means they failed the digest."""
        text = "BAD BYTES" if payload is None else _show(payload)
        return self._add("bookie_served", bookie, f"{bookie} served L{ledger}:{entry} {text}",
                         ledger=ledger, entry=entry, payload=payload, detail=detail)

    def fault(self, target: str, kind: str, detail: str = "") -> Event:
        return self._add("fault", target, f"FAULT {kind} {target} {detail}".rstrip(),
                         detail=kind + ("|" + detail if detail else ""))

    # -- logs (pybk.logs: the log workload of pybk.sim.logs) ---------------------------------
    # ``detail`` holds the log's name, ``value`` a reader's instance number or a writer's epoch

    def log_writer_open(self, process: str, log: str, epoch: int, outcome: str,
                        why: str = "") -> Event:
        return self._add("log_open", process, f"{process} opens writer of {log} -> {outcome} "
                         f"epoch={epoch} {why}".rstrip(), value=epoch, outcome=outcome,
                         detail=log)

    def log_append(self, process: str, log: str, payload: bytes) -> Event:
        return self._add("log_append", process,
                         f"{process} log-append {log} {payload.decode(errors='replace')}",
                         payload=payload, detail=log)

    def log_append_done(self, process: str, log: str, payload: bytes, outcome: str,
                        pos: tuple[int, int, int] | None, why: str = "") -> Event:
        at = "" if pos is None else "@" + ":".join(map(str, pos))
        return self._add("log_append_done", process,
                         f"{process} log-append {log} {payload.decode(errors='replace')} -> "
                         f"{outcome}{at} {why}".rstrip(), payload=payload, outcome=outcome,
                         pos=pos, detail=log)

    def log_reader_start(self, process: str, log: str, reader: int,
                         start: tuple[int, int, int] | None) -> Event:
        at = "oldest" if start is None else ":".join(map(str, start))
        return self._add("log_reader", process, f"{process} reader {reader} of {log} from {at}",
                         value=reader, pos=start, detail=log)

    def log_read(self, process: str, log: str, reader: int, pos: tuple[int, int, int],
                 payload: bytes) -> Event:
        return self._add("log_read", process,
                         f"{process} reader {reader} read {log}@{':'.join(map(str, pos))} "
                         f"{payload.decode(errors='replace')}", value=reader, pos=pos,
                         payload=payload, detail=log)

    def log_reader_end(self, process: str, log: str, reader: int, why: str) -> Event:
        return self._add("log_reader_end", process, f"{process} reader {reader} of {log} ends: "
                         f"{why}", value=reader, detail=log, outcome=why)

    def log_truncate(self, process: str, log: str, before: tuple[int, int, int],
                     outcome: str) -> Event:
        return self._add("log_truncate", process, f"{process} truncate {log} before "
                         f"{':'.join(map(str, before))} -> {outcome}", pos=before,
                         outcome=outcome, detail=log)

    # -- durable cursors of the log (pybk.sim.cursors) -----------------------------------------
    # ``value`` holds the consumer instance's number, ``detail`` the cursor's name

    def cursor_open(self, process: str, cursor: str, instance: int, outcome: str,
                    mark_delete: tuple[int, int, int] | None = None, why: str = "") -> Event:
        """A consumer subscribed (instance ``instance``); ``mark_delete`` as it recovered."""
        at = "-" if mark_delete is None else ":".join(map(str, mark_delete))
        return self._add("cursor_open", process, f"{process} subscribes {cursor} #{instance} -> "
                         f"{outcome} mark-delete={at} {why}".rstrip(), value=instance,
                         outcome=outcome, pos=mark_delete, detail=cursor)

    def cursor_deliver(self, process: str, cursor: str, instance: int,
                       pos: tuple[int, int, int], payload: bytes) -> Event:
        return self._add("cursor_deliver", process,
                         f"{process} #{instance} got {':'.join(map(str, pos))} "
                         f"{payload.decode(errors='replace')}", value=instance, pos=pos,
                         payload=payload, detail=cursor)

    def cursor_ack(self, process: str, cursor: str, instance: int, pos: tuple[int, int, int],
                   how: str) -> Event:
        """An acknowledgement asked for (``how``: ``ack``, ``cumulative`` or ``nack``)."""
        return self._add("cursor_ack", process, f"{process} #{instance} {how} "
                         f"{':'.join(map(str, pos))}", value=instance, pos=pos,
                         outcome=how, detail=cursor)

    def cursor_ack_done(self, process: str, cursor: str, instance: int,
                        pos: tuple[int, int, int], how: str, outcome: str,
                        mark_delete: tuple[int, int, int] | None = None,
                        why: str = "") -> Event:
        """An acknowledgement returned (ok: durable) or failed (info: it may be durable);
        ``detail`` is ``<cursor>|<how>|<the mark-delete position after it, or ->``."""
        at = "-" if mark_delete is None else ":".join(map(str, mark_delete))
        return self._add("cursor_ack_done", process,
                         f"{process} #{instance} {how} {':'.join(map(str, pos))} -> {outcome} "
                         f"mark-delete={at} {why}".rstrip(), value=instance, pos=pos,
                         outcome=outcome, detail=f"{cursor}|{how}|{at}")

    def cursor_end(self, process: str, cursor: str, instance: int, why: str) -> Event:
        return self._add("cursor_end", process, f"{process} #{instance} of {cursor} ends: "
                         f"{why}", value=instance, outcome=why, detail=cursor)

    def tier_check(self, invariant: str, ok: bool, detail: str) -> Event:
        """A tiered-storage check made at its instant (pybk.sim.tier): ``invariant`` held
        or not."""
        return self._add("tier_check", "tier", f"tier {invariant} {'ok' if ok else 'FAILED'} "
                         f"{detail}", outcome=OK if ok else FAIL, detail=f"{invariant}|{detail}")

    # -- failures nobody expected --------------------------------------------------------------

    def exception(self, process: str, where: str, exc: BaseException, trace: str = "") -> Event:
        """An exception no injected fault explains (not in the allow-list of
        ``pybk.sim.findings``): a finding of its own (X1), with its traceback."""
        text = f"{type(exc).__name__}: {exc}"
        line = f"{process} UNEXPECTED {where}: {text}"
        if trace:
            line += "\n" + "\n".join("      | " + t for t in trace.rstrip().splitlines())
        return self._add("exception", process, line, detail=f"{where}|{text}")

    # -- liveness ------------------------------------------------------------------------------

    def liveness(self, what: str, ok: bool, detail: str = "") -> Event:
        return self._add("liveness", "sim", f"liveness {what}: {'ok' if ok else 'FAILED'} "
                         f"{detail}".rstrip(), outcome=OK if ok else FAIL, detail=what + "|"
                         + detail)

    def of_kind(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]
