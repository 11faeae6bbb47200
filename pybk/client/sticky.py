"""Sticky reads (BookKeeper's ``stickyReadsEnabled``): a reader keeps reading a ledger from one
bookie while it answers, for that bookie's read-ahead and page cache.

Only when every bookie of the ensemble holds every entry (ensemble size == write quorum):
then any bookie can serve any read. The bookie is an ensemble slot chosen at random when the
handle opens; every read asks it first, the others in ensemble order after it; when it fails
a read (an error, no answer in time) the handle moves on to the next slot, as BookKeeper does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pybk.metadata.base import LedgerMetadata

__all__ = ["StickyReads"]


class StickyReads:
    """The ensemble slot a handle's reads go to first."""

    def __init__(self, ensemble_size: int, rng: random.Random) -> None:
        self.ensemble_size = ensemble_size
        self.slot = rng.randrange(ensemble_size)
        #: times the handle moved on to another slot
        self.switches = 0

    @classmethod
    def for_ledger(cls, enabled: bool, md: LedgerMetadata, rng: random.Random,
                   ) -> StickyReads | None:
        """A sticky state for a reader of ``md`` when ``enabled`` and E == Qw, else None."""
        if not enabled or md.ensemble_size != md.write_quorum:
            return None
        return cls(md.ensemble_size, rng)

    def order(self, ensemble: Sequence[str]) -> list[str]:
        """Every bookie of ``ensemble``, the sticky one first, then the next slots."""
        n = len(ensemble)
        return [ensemble[(self.slot + i) % n] for i in range(n)]

    def failed(self, ensemble: Sequence[str], bookie: str) -> None:
        """``bookie`` failed a read: if it is the sticky one, stick to the next slot."""
        if ensemble[self.slot % len(ensemble)] == bookie:
            self.slot = (self.slot + 1) % len(ensemble)
            self.switches += 1
