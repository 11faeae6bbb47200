"""Reading and changing one log's metadata record, and deleting its ledgers.

Every change goes through :meth:`LogCatalog.update`: the store's read-transform-CAS loop on
the log's key, where the transform also checks the caller's writer epoch. A writer whose
epoch is no longer the log's (another writer opened it since) gets LedgerFencedError and
changes nothing: that check, inside the compare-and-set, is the writer lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pybk.errors import (
    LedgerFencedError,
    LogNotFoundError,
    NoSuchKeyError,
    NoSuchLedgerError,
)
from pybk.logs.meta import LogMetadata, log_key
from pybk.logs.offload import delete_objects
from pybk.logs.tier_access import TierAccess, TierOpener, open_threaded_tier
from pybk.logs.truncation import truncated_segments
from pybk.metadata.base import MetadataStore, VersionedValue
from pybk.metadata.tenancy import NAMESPACE_KEY

if TYPE_CHECKING:
    from pybk.client import Client

__all__ = ["LogCatalog", "Transform"]

log = logging.getLogger(__name__)

#: Gets the current metadata, returns the new one or None for "no change".
Transform = Callable[[LogMetadata], "LogMetadata | None"]


class LogCatalog:
    """One log's metadata in one namespace, through one client."""

    def __init__(
        self, client: Client, namespace: str, name: str, clock: Callable[[], float],
        *, tenancy: str | None = None, tiers: TierOpener | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.key = log_key(namespace, name)
        self._clock = clock
        self._tiers = tiers if tiers is not None else open_threaded_tier
        #: custom metadata every ledger of this log carries besides its own tag: the tenancy
        #: namespace (``tenant/namespace``) a bookie enforces policies by, when there is one
        self.ledger_tags: dict[str, bytes] = (
            {} if tenancy is None else {NAMESPACE_KEY: tenancy.encode()})

    @property
    def store(self) -> MetadataStore:
        return self.client.store

    async def open_tier(self, url: str, options: dict[str, Any] | None) -> TierAccess:
        """The tier at ``url`` through the namespace's opener (fsspec in worker threads by
        default; the simulator's own store under it)."""
        return await self._tiers(url, dict(options or {}))

    def now_ms(self) -> int:
        """Wall-clock milliseconds (segment ages for retention; from the injected clock)."""
        return int(self._clock() * 1000)

    def _parse(self, value: VersionedValue) -> LogMetadata:
        md = LogMetadata.from_bytes(value.value, value.version)
        if md.deleting:
            raise LogNotFoundError(f"log {self.name!r} in namespace {self.namespace!r} is being "
                                   "deleted")
        return md

    async def read(self) -> LogMetadata:
        """The current metadata; LogNotFoundError when the log does not exist."""
        try:
            value = await self.store.read_value(self.key)
        except NoSuchKeyError:
            raise LogNotFoundError(
                f"log {self.name!r} does not exist in namespace {self.namespace!r}"
            ) from None
        return self._parse(value)

    async def update(self, transform: Transform, *, epoch: int | None = None) -> LogMetadata:
        """CAS loop: apply ``transform`` to the current metadata until it sticks.

        With ``epoch``, the transform is applied only while the log's writer epoch is
        ``epoch``; otherwise LedgerFencedError (another writer took the log over)."""
        name = self.name

        def apply(value: VersionedValue) -> bytes | None:
            md = self._parse(value)
            if epoch is not None and md.epoch != epoch:
                raise LedgerFencedError(
                    f"log {name!r}: another writer ({md.writer or 'unnamed'}, epoch {md.epoch})"
                    f" took the log over from this one (epoch {epoch})"
                )
            new = transform(md)
            if new is None:
                return None
            new._check()  # never store a record that readers would refuse
            return new.to_bytes()

        try:
            value = await self.store.update_value(self.key, apply)
        except NoSuchKeyError:
            raise LogNotFoundError(
                f"log {self.name!r} was deleted from namespace {self.namespace!r}"
            ) from None
        return self._parse(value)

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger of this log; one that is already gone is fine (idempotent)."""
        try:
            await self.client.delete_ledger(ledger_id)
        except NoSuchLedgerError:
            pass

    async def purge_truncated(self, md: LogMetadata, *, epoch: int | None = None) -> LogMetadata:
        """Delete the ledgers of ``truncated`` segments, then drop them from the list."""
        gone = truncated_segments(md)
        if not gone:
            return md
        await delete_objects(self, md, gone)  # offloaded copies too
        for s in gone:
            await self.delete_ledger(s.ledger_id)
        seqs = {s.seq for s in gone}
        return await self.update(
            lambda cur: cur.without_segments(seqs)
            if any(s.seq in seqs for s in truncated_segments(cur)) else None,
            epoch=epoch,
        )
