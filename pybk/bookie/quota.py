"""Bytes a bookie stores per namespace, for storage quotas.

Counted from the bookie's own storage: recomputed at start from its ledgers and index (each
held entry's stored size), grown as entries are admitted, and reconciled against the storage
(ledgers deleted by the garbage collector drop out) whenever a namespace is at its quota, so
a deletion lowers the count without a hook into the collector. A quota is per bookie: each
bookie holds only its share of a namespace's entries (docs/tenancy.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pybk.storage.engine import LedgerStorage

__all__ = ["StorageUsage", "ledger_bytes"]


def ledger_bytes(storage: LedgerStorage, ledger_id: int) -> int:
    """Bytes the storage holds for one ledger's entries (no disk read)."""
    total = 0
    for first, last in storage.ranges(ledger_id):
        for entry_id in range(first, last + 1):
            total += storage.entry_size(ledger_id, entry_id) or 0
    return total


class StorageUsage:
    """Per-namespace byte counts over per-ledger ones."""

    def __init__(self) -> None:
        self.by_ledger: dict[int, int] = {}
        self.ledgers: dict[str, set[int]] = {}
        self.by_namespace: dict[str, int] = {}

    def bytes(self, namespace: str) -> int:
        return self.by_namespace.get(namespace, 0)

    def add(self, namespace: str, ledger_id: int, n: int) -> None:
        self.by_ledger[ledger_id] = self.by_ledger.get(ledger_id, 0) + n
        self.ledgers.setdefault(namespace, set()).add(ledger_id)
        self.by_namespace[namespace] = self.by_namespace.get(namespace, 0) + n

    def reconcile(self, namespace: str, storage: LedgerStorage) -> int:
        """Recount ``namespace``'s ledgers from the storage (deleted ones drop out)."""
        total = 0
        for lid in list(self.ledgers.get(namespace, ())):
            n = 0 if storage.find(lid) is None else ledger_bytes(storage, lid)
            if n:
                self.by_ledger[lid] = n
                total += n
            else:
                self.by_ledger.pop(lid, None)
                self.ledgers[namespace].discard(lid)
        self.by_namespace[namespace] = total
        return total

    async def recompute(self, storage: LedgerStorage,
                        namespace_of: Callable[[int], Awaitable[str | None]]) -> None:
        """Count every held ledger of a namespace (one metadata read per ledger, cached by
        the caller)."""
        self.by_ledger.clear()
        self.ledgers.clear()
        self.by_namespace.clear()
        for lid in storage.ledger_ids():
            ns = await namespace_of(lid)
            if ns is not None:
                self.add(ns, lid, ledger_bytes(storage, lid))
