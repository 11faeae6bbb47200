"""What the ledger-mode workload (:mod:`pybk.sim.ledger_modes`) records, and its invariants.

Two kinds of ledger, each with what its writer's acknowledgements promise:

* **adv** (caller-chosen ids, ``create_ledger_adv``): an acknowledged id and every id before
  it are durable. AV1: every acknowledged id survives every seal (a recovery's, the final
  one) and reads back with its payload. AV2: a LAC a reader sees covers only ids that Qa
  bookies had acknowledged (as the bookies' answers show) when it saw it.
* **deferred** (``write_flags={"deferred_sync"}``): an append's acknowledgement promises
  nothing durable; a completed ``force()`` makes every entry up to the LAC it returned
  durable. DS1: every entry at or below a LAC a completed force returned survives every seal
  and crash and reads back. DS2: until the ledger is recovered or closed, a LAC a reader sees
  never passes what a completed force had returned. Entries acknowledged and not forced may
  be lost: nothing flags them (the run's history keeps deferred acks out of the durable set:
  :class:`pybk.sim.observer.RunObserver`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from pybk.sim.checker import Violation
from pybk.sim.history import Event

__all__ = ["ModeLedger", "check_modes"]


@dataclass
class ModeLedger:
    """One ledger of the workload and what was seen of it. Times are ``(history length,
    tick)``: the first orders them against the bookies' answers in the history, the second
    among the workload's own records."""

    lid: int
    kind: str  # "adv" or "deferred"
    qa: int
    writer: str
    payloads: dict[int, bytes] = field(default_factory=dict)
    #: acknowledged id -> its trace line
    acked: dict[int, int] = field(default_factory=dict)
    #: (time, LAC, trace line) of each completed force
    forces: list[tuple[tuple[int, int], int, int]] = field(default_factory=list)
    #: when a recovery or the writer's close began (DS2 no longer applies from then on)
    exempt_at: tuple[int, int] | None = None
    #: (time, LAC, reader, trace line, the reader's handle saw the ledger closed)
    lacs: list[tuple[tuple[int, int], int, str, int, bool]] = field(default_factory=list)
    #: (who, last entry, trace line) of each seal seen (a recovery's, the final one)
    seals: list[tuple[str, int, int]] = field(default_factory=list)
    #: entry -> payload read by a reader or the final read (the first of each)
    reads: dict[int, tuple[bytes, int]] = field(default_factory=dict)
    final_last: int | None = None
    final_error: str = ""

    @property
    def forced(self) -> int:
        return max((lac for _t, lac, _line in self.forces), default=-1)


class _Out:
    def __init__(self, max_per: int) -> None:
        self.max_per = max_per
        self.out: list[Violation] = []
        self.counts: dict[str, int] = defaultdict(int)

    def __call__(self, inv: str, lid: int, entry: int, msg: str, *lines: int) -> None:
        self.counts[inv] += 1
        if self.counts[inv] <= self.max_per:
            self.out.append(Violation(inv, lid, entry, msg, tuple(n for n in lines if n >= 0)))


def check_modes(ledgers: dict[int, ModeLedger], events: list[Event], *,
                beyond_tolerance: bool = False, max_per: int = 5) -> list[Violation]:
    """AV1, AV2, DS1, DS2 over the workload's ``ledgers`` (``events``: the run's history)."""
    v = _Out(max_per)
    for _lid, lg in sorted(ledgers.items()):
        if lg.kind == "adv":
            _durable(v, "AV1", lg, sorted(lg.acked), "acknowledged", beyond_tolerance)
        else:
            forced = lg.forced
            line = max((ln for _t, lac, ln in lg.forces if lac == forced), default=-1)
            _durable(v, "DS1", lg, list(range(forced + 1)), f"forced (LAC {forced})",
                     beyond_tolerance, line)
            _lac_within_force(v, lg)
    _lac_within_quorum(v, {lid: lg for lid, lg in ledgers.items() if lg.kind == "adv"},
                       events)
    return v.out


def _durable(v: _Out, inv: str, lg: ModeLedger, promised: list[int], what: str,
             beyond: bool, line: int = -1) -> None:
    """Every entry of ``promised`` is inside every seal and, once read back at the end,
    reads back with its payload."""
    if not promised:
        return
    top = promised[-1]
    for who, last, seal_line in lg.seals:
        if top > last:
            first = next(e for e in promised if e > last)
            v(inv, lg.lid, first, f"{what} entry {first} is beyond the last entry {last} "
              f"{who} sealed the ledger at", lg.acked.get(first, line), seal_line)
            return
    if lg.final_last is None:
        return
    for e in promised:
        got = lg.reads.get(e)
        if got is None:
            if lg.final_error and beyond:
                return
            v(inv, lg.lid, e, f"{what} entry {e} was not read back at the end"
              + (f" ({lg.final_error})" if lg.final_error else ""), lg.acked.get(e, line))
            return
        if got[0] != lg.payloads.get(e):
            v(inv, lg.lid, e, f"{what} entry {e} read back as {got[0][:40]!r}, the writer "
              f"sent {lg.payloads.get(e, b'')[:40]!r}", lg.acked.get(e, line), got[1])
            return


def _lac_within_force(v: _Out, lg: ModeLedger) -> None:
    """DS2: before any recovery or close, a reader's LAC is at most the last force's."""
    for t, lac, reader, line, closed in lg.lacs:
        if closed or (lg.exempt_at is not None and t >= lg.exempt_at):
            continue
        forced = max((f for ft, f, _ln in lg.forces if ft < t), default=-1)
        if lac > forced:
            v("DS2", lg.lid, lac, f"{reader} saw LAC {lac} but completed forces had made "
              f"entries up to {forced} durable", line)
            return


def _lac_within_quorum(v: _Out, adv: dict[int, ModeLedger], events: list[Event]) -> None:
    """AV2: a reader's LAC covers only ids each acknowledged by Qa bookies before."""
    seen = sorted((t[0], lid, lac, reader, line) for lid, lg in adv.items()
                  for t, lac, reader, line, _closed in lg.lacs)
    if not seen:
        return
    acks: dict[tuple[int, int], set[str]] = defaultdict(set)
    frontier: dict[int, int] = defaultdict(lambda: -1)
    flagged: set[int] = set()
    i = 0
    for at, lid, lac, reader, line in seen:
        while i < min(at, len(events)):
            ev = events[i]
            i += 1
            if ev.kind != "bookie_ack" or ev.ledger not in adv:
                continue
            acks[(ev.ledger, ev.entry)].add(ev.process)
            need = max(1, adv[ev.ledger].qa)
            while len(acks.get((ev.ledger, frontier[ev.ledger] + 1), ())) >= need:
                frontier[ev.ledger] += 1
        if lac > frontier[lid] and lid not in flagged:
            flagged.add(lid)
            v("AV2", lid, lac, f"{reader} saw LAC {lac} but Qa bookies held the ids up to "
              f"{frontier[lid]} only", line)
