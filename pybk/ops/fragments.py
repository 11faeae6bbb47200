"""Fragments of a ledger and what each bookie of a fragment must hold (pure functions).

A *fragment* is the run of entries written with one ensemble: from its first entry id to
the entry before the next fragment's (or to the ledger's last entry once it is closed; a
ledger that is not closed has an *open* last fragment, whose end nobody knows yet). Slot
``i`` of a fragment must hold exactly the entries ``e`` of the fragment whose write set
includes ``i`` (``(i - e) % E < Qw``). Auto-recovery repairs ledgers fragment by fragment,
slot by slot (BookKeeper's ``LedgerFragment``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from pybk.client.quorum import Quorums
from pybk.metadata.base import LedgerMetadata

__all__ = ["Fragment", "Repair", "fragments", "plan_repairs"]


@dataclass(frozen=True, slots=True)
class Fragment:
    """Entries ``first..last`` (``last`` None: the open last fragment) on ``ensemble``."""

    first: int
    last: int | None
    ensemble: tuple[str, ...]

    @property
    def is_open(self) -> bool:
        return self.last is None

    @property
    def is_empty(self) -> bool:
        return self.last is not None and self.last < self.first

    def entries_of(self, index: int, quorums: Quorums) -> Iterator[int]:
        """The entries slot ``index`` holds (a closed fragment only)."""
        if self.last is None:
            raise ValueError("the entries of an open fragment are not known")
        has_entry = quorums.has_entry
        for entry_id in range(self.first, self.last + 1):
            if has_entry(entry_id, index):
                yield entry_id

    def count_of(self, index: int, quorums: Quorums) -> int:
        return sum(1 for _ in self.entries_of(index, quorums))


def fragments(md: LedgerMetadata) -> list[Fragment]:
    """The fragments of a ledger, in order."""
    starts = sorted(md.ensembles)
    out = []
    for n, first in enumerate(starts):
        if n + 1 < len(starts):
            last: int | None = starts[n + 1] - 1
        else:
            last = md.last_entry_id if md.is_closed else None
        if md.is_closed and last is not None and md.last_entry_id < last:
            last = md.last_entry_id  # fragments past the ledger's end hold nothing
        out.append(Fragment(first, last, tuple(md.ensembles[first])))
    return out


@dataclass(frozen=True, slots=True)
class Repair:
    """One slot of one fragment to repair: ``bookie`` is gone (``replace``: copy its
    entries to another bookie and put that one in its place) or still there but suspected
    of missing or damaged entries (``verify``: look, then copy what is missing in place or
    replace it)."""

    fragment: Fragment
    index: int
    bookie: str
    replace: bool


def plan_repairs(md: LedgerMetadata, marked: Collection[str],
                 live: Collection[str]) -> list[Repair]:
    """The slots of ``md`` that name a bookie of the under-replication mark ``marked``:
    to be replaced when that bookie is not ``live``, verified when it is. Bookies not in the
    mark are left alone even when they look down: the auditor decides when a missing bookie
    is lost (after its recovery delay), not a worker that sees it restart."""
    out = []
    for fragment in fragments(md):
        for index, bookie in enumerate(fragment.ensemble):
            if bookie in marked:
                out.append(Repair(fragment, index, bookie, replace=bookie not in live))
    return out
