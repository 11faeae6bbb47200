"""The collector's view of the metadata in the simulator: a replica that learns of each new
ledger ``lag`` seconds late, as a ZooKeeper follower or an etcd learner can.

A bookie's garbage collector reads the metadata from its own session, which in production
may be served by a replica behind the one a client created the ledger on. A ledger the
bookie already holds entries of can therefore be missing from the collector's listing, and
"no such ledger" to its reads, for a while. ``gc_min_ledger_age`` is what keeps such a
ledger (docs/operations.md, "Space"); with the view below the simulator runs that guard
instead of a metadata store that is never behind. Only creations are late: a deletion seen
late keeps data longer, which is safe and needs no model.
"""

from __future__ import annotations

from collections.abc import Callable

from pybk.errors import NoSuchLedgerError
from pybk.metadata.base import LedgerMetadata, MetadataStore

__all__ = ["CreationLog", "FollowerView"]


class CreationLog:
    """When each ledger was created (loop time), from the store's applied operations."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.created_at: dict[int, float] = {}

    def applied(self, op: str, key: object) -> None:
        """A listener of the simulated store's applied operations."""
        if op == "create_ledger" and isinstance(key, int):
            self.created_at[key] = self.clock()


class FollowerView:
    """``list_ledgers`` and ``read_ledger`` of ``store`` as a replica ``lag`` seconds behind
    for creations: a ledger created less than ``lag`` ago is not listed and not found."""

    def __init__(self, store: MetadataStore, creations: CreationLog, lag: float) -> None:
        self.store = store
        self.creations = creations
        self.lag = lag

    def _unseen(self, ledger_id: int) -> bool:
        created = self.creations.created_at.get(ledger_id)
        return created is not None and self.creations.clock() - created < self.lag

    async def list_ledgers(self) -> list[int]:
        return [lid for lid in await self.store.list_ledgers() if not self._unseen(lid)]

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        if self._unseen(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist (not replicated yet)")
        return await self.store.read_ledger(ledger_id)
