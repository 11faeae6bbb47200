"""The invariant checker: turns a recorded :class:`~pybk.sim.history.History` into violations.

Each violation names the invariant it breaks (the safety properties of BookKeeper's TLA+ model
and of Jepsen-style checkers); the invariants are listed in docs/internals.md,
"pybk/sim/checker.py", and docs/simulation.md.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pybk.sim.history import FAIL, INFO, OK, Event, History


@dataclass(frozen=True)
class Violation:
    invariant: str
    ledger: int
    entry: int
    message: str
    lines: tuple[int, ...] = ()

    def render(self, trace: list[str] | None = None) -> str:
        if self.invariant.startswith("LG"):
            where = "log"
        elif self.ledger < 0:
            where = "run"
        else:
            where = f"ledger {self.ledger}" + (f" entry {self.entry}" if self.entry >= 0 else "")
        out = [f"[{self.invariant}] {where}: {self.message}"]
        if trace is not None:
            for n in sorted(set(self.lines)):
                if 0 <= n < len(trace):
                    out.append(f"    {n:6d}: {trace[n]}")
        return "\n".join(out)


class Collector:
    """The violations of one check, at most ``max_per`` kept per invariant; calling it with
    (invariant, message, events...) records one (events name the trace lines to show)."""

    def __init__(self, max_per: int = 5) -> None:
        self.max_per = max_per
        self.out: list[Violation] = []
        self.counts: dict[str, int] = defaultdict(int)

    def __call__(self, inv: str, msg: str, *events: Event | None) -> None:
        self.counts[inv] += 1
        if self.counts[inv] <= self.max_per:
            lines = tuple(e.line for e in events if e is not None and e.line >= 0)
            self.out.append(Violation(inv, -1, -1, msg, lines))


@dataclass
class _Ledger:
    invoked: dict[int, Event] = field(default_factory=dict)  # entry -> add_invoke
    done: dict[int, Event] = field(default_factory=dict)  # entry -> add_done
    oks: list[Event] = field(default_factory=list)  # ok completions, in completion order
    closes: list[Event] = field(default_factory=list)  # successful close_done events
    first_recovery_done: Event | None = None
    first_close_start: Event | None = None
    final_reads: dict[int, Event] = field(default_factory=dict)
    final_errors: list[Event] = field(default_factory=list)
    deleted_at: int | None = None  # history index of the delete invoke/complete
    meta_closed: list[Event] = field(default_factory=list)


class Checker:
    """Check one history. ``beyond_tolerance`` relaxes availability (errors allowed, no I12)."""

    def __init__(self, history: History, *, beyond_tolerance: bool = False,
                 max_per_invariant: int = 5) -> None:
        self.h = history
        self.beyond = beyond_tolerance
        self.max_per = max_per_invariant
        self.violations: list[Violation] = []
        self._counts: dict[str, int] = defaultdict(int)
        self.ledgers: dict[int, _Ledger] = defaultdict(_Ledger)
        self.payload_home: dict[bytes, tuple[int, int, Event]] = {}

    def _v(self, inv: str, ledger: int, entry: int, msg: str, *events: Event | None) -> None:
        self._counts[inv] += 1
        if self._counts[inv] > self.max_per:
            return
        lines = tuple(e.line for e in events if e is not None and e.line >= 0)
        self.violations.append(Violation(inv, ledger, entry, msg, lines))

    # -- pass 1: index the history ------------------------------------------------------------

    #: the event streams the checks walk, each in history order: (name, kinds)
    _STREAMS = (("reads", ("read", "bookie_served")),
                ("lacs", ("create", "lac", "add_done", "close_invoke", "bookie_ack", "metadata",
                          "ensembles")),
                ("bookies", ("bookie_ack", "bookie_absent", "fault")),
                ("gc", ("gc_collect",)),
                ("liveness", ("liveness",)),
                ("index_mismatch", ("index_mismatch",)),
                ("tail_gap", ("tail_gap",)),
                ("exception", ("exception",)))

    def _index(self) -> None:
        # one walk over the history: the ledgers' indexes, and each check's stream of events
        self.streams: dict[str, list[Event]] = {name: [] for name, _ in self._STREAMS}
        into: dict[str, list[list[Event]]] = {}
        for name, kinds in self._STREAMS:
            for kind in kinds:
                into.setdefault(kind, []).append(self.streams[name])
        ledgers = self.ledgers
        for ev in self.h.events:
            kind = ev.kind
            for stream in into.get(kind, ()):
                stream.append(ev)
            if ev.ledger < 0:
                continue
            lg = ledgers[ev.ledger]
            if kind == "add_invoke":
                lg.invoked[ev.entry] = ev
                assert ev.payload is not None
                self.payload_home.setdefault(ev.payload, (ev.ledger, ev.entry, ev))
            elif kind == "add_done":
                lg.done[ev.entry] = ev
                if ev.outcome == OK:
                    lg.oks.append(ev)
            elif kind == "close_invoke":
                if lg.first_close_start is None and ev.detail != "close":
                    lg.first_close_start = ev
            elif kind == "close_done" and ev.outcome == OK:
                lg.closes.append(ev)
                if ev.detail.split("|")[0] != "close" and lg.first_recovery_done is None:
                    lg.first_recovery_done = ev
            elif kind == "metadata" and ev.detail == "CLOSED":
                lg.meta_closed.append(ev)
            elif kind == "delete" and lg.deleted_at is None:
                lg.deleted_at = ev.index
            elif kind == "read" and ev.detail == "final":
                lg.final_reads.setdefault(ev.entry, ev)
            elif kind == "read_error" and ev.outcome == "final":
                lg.final_errors.append(ev)

    # -- checks --------------------------------------------------------------------------------

    def run(self) -> list[Violation]:
        self._index()
        self._check_reads()
        self._check_acks_in_order()
        self._check_closes()
        self._check_lac()
        self._check_bookies()
        self._check_liveness()
        for ev in self.streams["tail_gap"]:
            self._v("L10", ev.ledger, ev.entry,
                    f"{ev.process}'s tail() skipped entries {ev.entry}..{ev.value - 1}", ev)
        for ev in self.streams["gc"]:
            deleted_at = self.ledgers[ev.ledger].deleted_at
            if deleted_at is None or deleted_at > ev.index:
                self._v("I16", ev.ledger, -1, f"bookie {ev.process}'s garbage collector "
                        "deleted a ledger the metadata still had", ev)
        for ev in self.streams["index_mismatch"]:
            self._v("I14", -1, -1, f"bookie {ev.process}: index checkpoint {ev.detail}", ev)
        for ev in self.streams["exception"]:
            where, _, what = ev.detail.partition("|")
            self._v("X1", ev.ledger, -1, f"{ev.process} {where}: unexpected {what}", ev)
        return self.violations

    def _expected(self, ledger: int, entry: int) -> Event | None:
        return self.ledgers[ledger].invoked.get(entry) if ledger in self.ledgers else None

    def _check_reads(self) -> None:
        served: dict[tuple[int, int], Event] = {}
        for ev in self.streams["reads"]:
            lg = self.ledgers[ev.ledger]
            inv = lg.invoked.get(ev.entry)
            if ev.kind == "bookie_served" and ev.payload is None:
                if lg.deleted_at is None or ev.index < lg.deleted_at:
                    self._v("I10", ev.ledger, ev.entry,
                            f"bookie {ev.process} served bytes that fail the digest", ev)
                continue
            payload = ev.payload
            assert payload is not None
            if ev.kind == "bookie_served":
                first = served.setdefault((ev.ledger, ev.entry), ev)
                if first.payload != payload and (lg.deleted_at is None
                                                  or ev.index < lg.deleted_at):
                    self._v("I5", ev.ledger, ev.entry,
                            f"bookie {ev.process} served {payload[:40]!r}, bookie "
                            f"{first.process} {(first.payload or b'')[:40]!r}", first, ev)
                if not lg.invoked:
                    continue  # (a ledger of the log workload: its entries are envelopes)
            if inv is None:
                home = self.payload_home.get(payload)
                if home is not None:
                    self._v("L9", ev.ledger, ev.entry,
                            f"payload written to ledger {home[0]} entry {home[1]} read here",
                            home[2], ev)
                else:
                    self._v("L2", ev.ledger, ev.entry,
                            f"{ev.process} got a payload nobody wrote ({payload[:40]!r})", ev)
                continue
            if inv.payload != payload:
                home = self.payload_home.get(payload)
                inv_code = "L9" if home is not None and home[0] != ev.ledger else "L3"
                self._v(inv_code if ev.kind == "read" else "I5", ev.ledger, ev.entry,
                        f"{ev.process} got {payload[:40]!r}, the writer sent "
                        f"{(inv.payload or b'')[:40]!r}", inv, ev)
                continue
            done = lg.done.get(ev.entry)
            if done is not None and done.outcome == FAIL and done.index < ev.index:
                self._v("L2", ev.ledger, ev.entry,
                        f"aborted read: {ev.process} read an add that definitely failed",
                        inv, done, ev)
            if ev.kind == "read" and ev.detail == "tail" and ev.entry > ev.value:
                self._v("L5", ev.ledger, ev.entry,
                        f"{ev.process} read entry {ev.entry} above the LAC {ev.value} it was shown",
                        ev)

    def _check_acks_in_order(self) -> None:
        for lid, lg in sorted(self.ledgers.items()):
            acked: set[int] = set()
            for ev in lg.oks:
                if ev.entry > 0 and (ev.entry - 1) not in acked:
                    prev = lg.done.get(ev.entry - 1)
                    self._v("L6", lid, ev.entry,
                            f"entry {ev.entry} acknowledged before entry {ev.entry - 1}", ev,
                            prev)
                acked.add(ev.entry)

    def _check_closes(self) -> None:
        for lid, lg in sorted(self.ledgers.items()):
            ends = lg.closes + lg.meta_closed
            if not ends:
                continue
            first = ends[0]
            last = first.value
            for other in ends[1:]:
                if other.value != last:
                    self._v("I7", lid, other.value,
                            f"closed ledger changed: last entry {last} then {other.value}",
                            first, other)
            # L8: the old writer never gets an ok for an entry beyond what a completed
            # recovery sealed (an ok for an entry inside the sealed range may arrive late).
            rec = lg.first_recovery_done
            flagged: set[int] = set()
            if rec is not None:
                for ev in lg.oks:
                    if ev.index > rec.index and ev.entry > last:
                        flagged.add(ev.entry)
                        self._v("L8", lid, ev.entry,
                                f"writer got ok for entry {ev.entry} after recovery closed the "
                                f"ledger at {rec.value}", rec, ev)
            # L1: every ok add is inside the closed range.
            for ev in lg.oks:
                if ev.entry > last and ev.entry not in flagged:
                    self._v("L1", lid, ev.entry,
                            f"acknowledged entry {ev.entry} is beyond the closed last entry "
                            f"{last} (lost write, closed short)", ev, first)
            # L4: every entry up to last was attempted by the writer.
            for e in range(0, last + 1):
                if e not in lg.invoked:
                    self._v("L4", lid, e, f"closed range 0..{last} holds entry {e} that was "
                            "never written", first)
                    break
            # Final reads (when the runner made them): every ok entry read back.
            if lg.deleted_at is not None or not (lg.final_reads or lg.final_errors):
                continue
            for ev in lg.oks:
                if ev.entry <= last and ev.entry not in lg.final_reads:
                    if lg.final_errors and self.beyond:
                        continue
                    errs = lg.final_errors[:1]
                    self._v("L1", lid, ev.entry,
                            f"acknowledged entry {ev.entry} was not read back after close"
                            + (f" ({errs[0].detail})" if errs else ""), ev, *errs)

    def _check_lac(self) -> None:
        last: dict[tuple[str, int, str], Event] = {}
        ack_frontier: dict[int, int] = defaultdict(lambda: -1)
        acked: dict[int, set[int]] = defaultdict(set)
        # entries 0..n each acknowledged by at least Qa bookies: what any LAC may cover
        quorum_frontier: dict[int, int] = defaultdict(lambda: -1)
        bookie_acks: dict[tuple[int, int], set[str]] = defaultdict(set)
        qa: dict[int, int] = {}
        exempt: set[int] = set()  # being recovered, or written in batches
        #: ledger -> (E, Qw, [(first entry, ensemble)]) as its metadata names them now
        layouts: dict[int, _Layout] = {}
        for ev in self.streams["lacs"]:
            lid = ev.ledger
            kind = ev.kind
            if kind == "ensembles":
                layouts[lid] = History.parse_ensembles(ev.detail)
                continue
            if kind == "bookie_ack":
                layout = layouts.get(lid)
                if (ev.detail != "recovery" and layout is not None
                        and ev.process not in _write_set(layout, ev.entry)):
                    continue  # not of the entry's write set now: no quorum vote
                bookie_acks[(lid, ev.entry)].add(ev.process)
                need = max(1, qa.get(lid, 1))
                while len(bookie_acks.get((lid, quorum_frontier[lid] + 1), ())) >= need:
                    quorum_frontier[lid] += 1
                continue
            if kind == "create":
                qa[lid] = ev.value
                if "batched" in ev.detail:
                    exempt.add(lid)
                continue
            if kind == "add_done":
                layout = layouts.get(lid)
                if ev.outcome == OK and layout is not None:
                    ws = _write_set(layout, ev.entry)
                    voters = {b for b in bookie_acks.get((lid, ev.entry), ()) if b in ws}
                    if len(voters) < qa.get(lid, 1):
                        self._v("I15", lid, ev.entry,
                                f"the writer acknowledged entry {ev.entry} with "
                                f"{len(voters)} acks from its write set "
                                f"({', '.join(sorted(voters)) or 'none'}), under Qa "
                                f"{qa.get(lid, 1)}", ev)
                if ev.outcome == OK:
                    acked[lid].add(ev.entry)
                    while ack_frontier[lid] + 1 in acked[lid]:
                        ack_frontier[lid] += 1
                continue
            if kind == "close_invoke":
                if ev.detail != "close":  # a recovery (the writer's own close changes nothing)
                    exempt.add(lid)
                continue
            if kind == "metadata":  # auto-recovery's workers recovering the ledger (fencing)
                if ev.detail in ("IN_RECOVERY", "CLOSED"):
                    exempt.add(lid)
                continue
            key = (ev.process, lid, ev.detail)  # detail: the reader's handle number
            prev = last.get(key)
            if prev is not None and ev.value < prev.value:
                self._v("L7", lid, ev.value,
                        f"{ev.process} saw the LAC go back from {prev.value} to {ev.value}",
                        prev, ev)
            last[key] = ev
            if ev.value > ack_frontier[lid] and not (
                    lid in exempt and ev.value <= quorum_frontier[lid]):
                self._v("I3", lid, ev.value,
                        f"{ev.process} saw LAC {ev.value} but the writer had only "
                        f"acknowledged up to {ack_frontier[lid]} and Qa bookies had "
                        f"acknowledged entries up to {quorum_frontier[lid]}", ev)
            lg = self.ledgers[lid]
            ends = lg.closes + lg.meta_closed
            if ends and ev.value > ends[0].value:
                self._v("I1", lid, ev.value,
                        f"{ev.process} saw LAC {ev.value} above the closed last entry "
                        f"{ends[0].value}", ev, ends[0])

    def _check_bookies(self) -> None:
        acked: dict[tuple[str, int, int], Event] = {}
        fsync_failed: dict[str, Event] = {}
        for ev in self.streams["bookies"]:
            if ev.kind == "fault":
                if ev.detail.startswith("fsync_eio"):
                    fsync_failed.setdefault(ev.process, ev)
                continue
            key = (ev.process, ev.ledger, ev.entry)
            if ev.kind == "bookie_ack":
                acked.setdefault(key, ev)
                continue
            ack = acked.get(key)
            if ack is None:
                continue
            lg = self.ledgers.get(ev.ledger)
            if lg is not None and lg.deleted_at is not None and lg.deleted_at < ev.index:
                continue
            failed = fsync_failed.get(ev.process)
            # "list": a restarted bookie's index lost it (replay, or a failed fsync);
            # otherwise a read answered "absent" for data it holds or held: a lying bookie.
            replay_lost = "list" in ev.detail
            inv = ("I11" if failed is not None else "I10") if replay_lost else "I9"
            self._v(inv, ev.ledger, ev.entry,
                    f"bookie {ev.process} acknowledged this entry, later said absent "
                    f"({ev.detail})", ack, failed, ev)

    def _check_liveness(self) -> None:
        if self.beyond:
            return
        for ev in self.streams["liveness"]:
            if ev.outcome != OK:
                self._v("I12", ev.ledger, -1, f"no progress after heal: {ev.detail}", ev)


def check(history: History, *, beyond_tolerance: bool = False) -> list[Violation]:
    """All invariant violations in ``history`` (empty list: the run is correct)."""
    return Checker(history, beyond_tolerance=beyond_tolerance).run()


__all__ = ["FAIL", "INFO", "OK", "Checker", "Violation", "check"]


#: (E, Qw, [(first entry, ensemble), ...] ascending): a ledger's striping as its metadata says
_Layout = tuple[int, int, list[tuple[int, tuple[str, ...]]]]


def _write_set(layout: _Layout, entry: int) -> set[str]:
    """The bookies that hold ``entry`` under ``layout``."""
    e, qw, segments = layout
    ensemble = segments[0][1]
    for first, bookies in segments:
        if first > entry:
            break
        ensemble = bookies
    return {ensemble[(entry + i) % e] for i in range(qw)}
