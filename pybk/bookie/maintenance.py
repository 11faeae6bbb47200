"""The bookie's upkeep on request: delete a ledger, collect garbage, compact, checkpoint.

A mixin of :class:`pybk.bookie.bookie.Bookie` (one object: the bookie's store, state and
garbage collector): what operators, the admin API and the collector itself ask a running
bookie to do, kept apart from its life cycle, state and request handling. The scheduled
collector is :mod:`pybk.bookie.gc`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pybk.bookie.gc import GarbageCollector, GcResult
from pybk.errors import BookieStateError, ReadOnlyBookieError
from pybk.storage.engine import LedgerStorage
from pybk.storage.store import CompactionResult

__all__ = ["BookieMaintenance"]


class BookieMaintenance:
    """:class:`pybk.bookie.bookie.Bookie`'s upkeep (a mixin: the bookie's state is one)."""

    bookie_id: str
    #: the garbage collector (pybk.bookie.gc), while started with a metadata store
    gc: GarbageCollector | None
    _journal_failed: bool
    _reason: str
    _store: Callable[[], LedgerStorage]

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's data on this bookie (journaled tombstone; durable on return)."""
        await self._store().delete_ledger(ledger_id)

    async def run_gc(self, *, force: bool = True) -> GcResult:
        """One run of the garbage collector now (the scheduled run's code; ``force``: major
        compaction too). Raises BookieStateError without a metadata store to ask."""
        self._store()
        if self.gc is None:
            raise BookieStateError(f"bookie {self.bookie_id} has no metadata store: "
                                   "nothing to collect against")
        return await self.gc.run(force=force)

    async def collect_garbage(
        self, is_live: Callable[[int], Awaitable[bool]], *, compact: bool = True
    ) -> list[int]:
        """Delete local ledgers ``is_live`` calls gone, then compact (``run_gc`` is the
        scheduled collector's run, against the metadata store).

        ``is_live(ledger_id)`` asks the metadata; it is asked twice per candidate, the second
        time right before deleting (rule R8: never delete on a stale or transient answer).
        Returns the deleted ledger ids."""
        store = self._store()
        deleted = []
        candidates = [lid for lid in store.ledger_ids() if not await is_live(lid)]
        for lid in candidates:
            if await is_live(lid):
                continue
            await store.delete_ledger(lid)
            deleted.append(lid)
        if compact:
            await self.compact()
        return deleted

    async def compact(self, threshold: float | None = None) -> CompactionResult:
        """Rewrite mostly-dead journal segments (see LedgerStore.compact)."""
        store = self._store()
        if self._journal_failed:
            raise ReadOnlyBookieError(f"bookie {self.bookie_id} is read-only: {self._reason}")
        return await store.compact(threshold)

    async def checkpoint(self) -> None:
        await self._store().checkpoint()
