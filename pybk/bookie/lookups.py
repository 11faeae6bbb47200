"""A bookie's metadata reads of ledgers, shared by the checks that need them (issue 34).

The tenancy gate (:mod:`pybk.bookie.tenancy`) reads a ledger's metadata for its namespace;
the unknown-ledger check (:mod:`pybk.bookie.unknown`) for its existence and master key. On a
new ledger's first add both ask, the gate first (in the transport), the check when the add
reaches the bookie: the check takes what the gate's read found rather than reading again.

A read under way is shared by whoever asks meanwhile. A ledger the gate found is remembered
with the loop time its read ended and handed out by :meth:`LedgerLookups.recent` for
``fresh`` seconds: a ledger deleted within them may still be vouched for, as it may by a read
that was under way when a request arrived (the check's rule since it shares reads). Absence
is never remembered: the check reads again (after syncing a store whose reads lag) before it
refuses; nor are the check's own findings (each request it refuses had a read of its own).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Final

from pybk.errors import NoSuchLedgerError
from pybk.metadata.base import LedgerMetadata, MetadataStore

__all__ = ["FRESH_SECONDS", "RECENT_LEDGERS", "LedgerLookups"]

#: how long a read's finding is handed out again (loop seconds)
FRESH_SECONDS: Final = 1.0
#: ledgers found remembered at most (least recently read ones forgotten first)
RECENT_LEDGERS: Final = 4096


class LedgerLookups:
    """One metadata read per ledger at a time against ``store``, and what it found."""

    def __init__(self, store: MetadataStore, *, fresh: float = FRESH_SECONDS,
                 capacity: int = RECENT_LEDGERS) -> None:
        if fresh < 0 or capacity < 1:
            raise ValueError(f"need fresh >= 0 and capacity >= 1, got {fresh} and {capacity}")
        self.store = store
        self.fresh = fresh
        self.capacity = capacity
        self._reading: dict[int, asyncio.Future[LedgerMetadata | None]] = {}
        self._recent: collections.OrderedDict[int, tuple[float, LedgerMetadata]] = (
            collections.OrderedDict())
        #: metadata reads made (tests, operators)
        self.reads = 0

    async def read(self, ledger_id: int, *, remember: bool = False) -> LedgerMetadata | None:
        """The ledger's metadata read now (or by a read under way), None when the metadata
        does not hold it; the store's errors are raised. ``remember``: hand a ledger found
        to :meth:`recent` (the gate's reads; the check's own are not, so each request it
        refuses is judged by a read of its own, as before the reads were shared)."""
        while True:
            pending = self._reading.get(ledger_id)
            try:
                if pending is None:
                    md = await self._read_now(ledger_id)
                else:
                    md = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if pending is None or not pending.cancelled():
                    raise  # (this caller was cancelled)
                continue  # the caller that read was cancelled: read again
            if remember and md is not None:
                self._remember(ledger_id, md)
            return md

    def recent(self, ledger_id: int) -> LedgerMetadata | None:
        """The metadata a read that ended at most ``fresh`` seconds ago found, else None."""
        found = self._recent.get(ledger_id)
        if found is None:
            return None
        if asyncio.get_running_loop().time() - found[0] > self.fresh:
            del self._recent[ledger_id]
            return None
        return found[1]

    async def _read_now(self, ledger_id: int) -> LedgerMetadata | None:
        pending: asyncio.Future[LedgerMetadata | None] = (
            asyncio.get_running_loop().create_future())
        self._reading[ledger_id] = pending
        self.reads += 1
        try:
            try:
                md: LedgerMetadata | None = await self.store.read_ledger(ledger_id)
            except NoSuchLedgerError:
                md = None
        except asyncio.CancelledError:
            pending.cancel()
            raise
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # (retrieved: nobody else may be waiting)
            raise
        finally:
            del self._reading[ledger_id]
        pending.set_result(md)
        return md

    def _remember(self, ledger_id: int, md: LedgerMetadata) -> None:
        self._recent[ledger_id] = (asyncio.get_running_loop().time(), md)
        self._recent.move_to_end(ledger_id)
        while len(self._recent) > self.capacity:
            self._recent.popitem(last=False)
