"""Requests about ledgers a bookie has never stored, checked against the metadata before
they leave any state (issue: ledger-id squatting).

Ledger ids are handed out in ascending blocks, so the next ones are easy to guess. A FENCE or
an ADD (single, batched, recovery) for a ledger the bookie did not know used to create it
under whatever master key it carried. Such a request is now served only when the metadata
holds the ledger (made there first) and, when it keeps the ledger's master key, the keys
match. Once the bookie holds the ledger, its own recorded key decides: no more reads.

Requests about one ledger that arrive while its metadata read is under way wait for that one
read: each is then judged by its own key. The refusal for a ledger the metadata lacks is
"unknown" (never "absent": a recovering client must not count a fence that did not happen).
At most ``limit`` ledgers are looked up at once, shared per connection
(:data:`pybk.runtime.origin.REQUEST_ORIGIN`): a peer holding some gets ``limit`` over the
peers holding some, one holding none gets one beyond ``limit`` (up to twice it); one more is
refused TOO_MANY_REQUESTS. Why and how: docs/internals.md, "pybk/bookie/unknown.py". A
ledger the tenancy gate found just before is judged by its read (:mod:`pybk.bookie.lookups`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Hashable
from typing import Final

from pybk.bookie.lookups import LedgerLookups
from pybk.errors import (
    TooManyRequestsError,
    UnauthorizedError,
    UnknownLedgerStateError,
    fresh_copy,
)
from pybk.metadata.base import MetadataStore
from pybk.runtime import sometimes
from pybk.runtime.origin import REQUEST_ORIGIN
from pybk.storage.engine import LedgerStorage

__all__ = ["UNKNOWN_LEDGER_CHECKS", "UnknownLedgerCheck", "Vouched", "fence_checked"]

log = logging.getLogger(__name__)

#: ledgers looked up in the metadata at once, per bookie
UNKNOWN_LEDGER_CHECKS: Final = 64

_SHARED = sometimes.point(
    "bookie.unknown_ledger_check_shared",
    "a request about a ledger not held here waited for the metadata read another one began "
    "(a pipelined writer's adds share one check)")

#: ``then(error)``: None when the request may create the ledger, else why not
Vouched = Callable[[Exception | None], None]


class _Lookup:
    """One metadata read of a ledger and the requests waiting for it."""

    __slots__ = ("origin", "task", "waiters")

    def __init__(self, waiters: list[tuple[bytes, str, Vouched]] | None = None,
                 origin: Hashable | None = None) -> None:
        self.waiters: list[tuple[bytes, str, Vouched]] = waiters or []
        self.task: asyncio.Future[None] | None = None
        #: the peer whose request started it (its slot is counted against that peer)
        self.origin = origin


class UnknownLedgerCheck:
    """Checks requests about ledgers this bookie does not hold against ``store``: one
    metadata read per ledger at a time, shared by every request that arrives meanwhile
    (and by the tenancy gate, through ``lookups``)."""

    def __init__(self, store: MetadataStore, limit: int = UNKNOWN_LEDGER_CHECKS, *,
                 lookups: LedgerLookups | None = None) -> None:
        self.store = store
        self.limit = limit
        #: the reads (shared with the tenancy gate when the bookie gives its own)
        self.ledger_lookups = lookups if lookups is not None else LedgerLookups(store)
        self._pending: dict[int, _Lookup] = {}
        #: lookups under way per peer that started them
        self._held: dict[Hashable | None, int] = {}
        #: lookups started (each one metadata read, or two when a lagging store is synced)
        self.lookups = 0
        #: refused requests (tests, operators)
        self.refused = 0

    @property
    def in_flight(self) -> int:
        """Ledgers being looked up now."""
        return len(self._pending)

    def vouch(self, ledger_id: int, master_key: bytes, what: str, then: Vouched) -> None:
        """Call ``then(None)`` once the metadata holds ``ledger_id`` (under ``master_key``,
        when it keeps keys), else ``then(error)``: UnknownLedgerStateError (not in the
        metadata), UnauthorizedError (another key), TooManyRequestsError (too many ledgers
        being looked up) or the metadata's own error. ``what`` (e.g. "an add") names the
        request in errors. ``then`` may run before this returns."""
        lookup = self._pending.get(ledger_id)
        if lookup is None:
            found = self.ledger_lookups.recent(ledger_id)
            if found is not None:  # (the tenancy gate's read, just now)
                self._answer(ledger_id, _Lookup([(master_key, what, then)]), found.master_key)
                return
            origin = REQUEST_ORIGIN.get()
            if not self._may_start(origin):
                self.refused += 1
                then(TooManyRequestsError(f"{what} of ledger {ledger_id}: {self.limit} ledgers "
                                          "this bookie does not hold are being looked up"))
                return
            lookup = self._pending[ledger_id] = _Lookup(origin=origin)
            self._held[origin] = self._held.get(origin, 0) + 1
            self.lookups += 1
            lookup.task = asyncio.ensure_future(self._look_up(ledger_id, lookup))
        else:
            _SHARED()
        lookup.waiters.append((master_key, what, then))

    def _may_start(self, origin: Hashable | None) -> bool:
        """Whether ``origin`` may start one more lookup (the module doc's fair share)."""
        total, held = len(self._pending), self._held.get(origin, 0)
        if not held:
            return total < 2 * self.limit
        return total < self.limit and held < max(1, self.limit // len(self._held))

    def _ended(self, lookup: _Lookup) -> None:
        """``lookup``'s slot is free: its peer holds one less."""
        left = self._held.get(lookup.origin, 0) - 1
        if left > 0:
            self._held[lookup.origin] = left
        else:
            self._held.pop(lookup.origin, None)

    async def check(self, ledger_id: int, master_key: bytes, what: str) -> None:
        """:meth:`vouch` awaited: return if allowed, else raise its error."""
        fut: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

        def then(error: Exception | None) -> None:
            if not fut.done():
                fut.set_result(error)

        self.vouch(ledger_id, master_key, what, then)
        error = await fut
        if error is not None:
            raise error

    def abandon(self, error: Exception) -> None:
        """Stop every lookup under way; their requests get ``error`` (the bookie stopped)."""
        pending, self._pending = self._pending, {}
        self._held.clear()
        for ledger_id, lookup in pending.items():
            if lookup.task is not None:
                lookup.task.cancel()
            self._answer(ledger_id, lookup, error)

    async def _look_up(self, ledger_id: int, lookup: _Lookup) -> None:
        found: bytes | Exception | None
        try:
            found = await self._read_key(ledger_id)
        except asyncio.CancelledError:
            raise  # (abandoned: its requests were answered)
        except Exception as exc:
            found = exc
        if self._pending.get(ledger_id) is lookup:
            del self._pending[ledger_id]
            self._ended(lookup)
        self._answer(ledger_id, lookup, found)

    async def _read_key(self, ledger_id: int) -> bytes | None:
        """The ledger's master key in the metadata (b"": not kept), None when absent. A
        store whose reads may lag (ZooKeeper) is caught up and read again before "absent":
        the creator made the ledger there before its first add."""
        for last in (False, True):
            md = await self.ledger_lookups.read(ledger_id)
            if md is not None:
                return md.master_key
            if last or not await self.store.sync_reads():
                return None
        return None

    def _answer(self, ledger_id: int, lookup: _Lookup, found: bytes | Exception | None) -> None:
        """Judge each waiting request (in arrival order) by ``found``: the metadata's key
        (b"": not kept), None (no such ledger) or the error every one of them gets."""
        waiters, lookup.waiters = lookup.waiters, []
        for key, what, then in waiters:
            error: Exception | None = None
            if found is None:
                error = UnknownLedgerStateError(
                    f"{what} of ledger {ledger_id} refused: this bookie does not hold it and "
                    "the metadata does not either (a ledger is created in the metadata first)")
            elif isinstance(found, Exception):
                copy = fresh_copy(found)
                error = copy if isinstance(copy, Exception) else found
            elif found and not hmac.compare_digest(found, key):
                error = UnauthorizedError(f"{what} of ledger {ledger_id}: master key does not "
                                          "match")
            if error is not None:
                self.refused += 1
            try:
                then(error)
            except Exception:  # one request's bug must not leave the others unanswered
                log.exception("answering a checked request failed")


async def fence_checked(check: UnknownLedgerCheck | None, store: LedgerStorage, ledger_id: int,
                        key: bytes) -> None:
    """Fence durably (``store.fence``); a ledger ``store`` does not hold only once ``check``
    (None: no check) let it."""
    if (check is not None and store.find(ledger_id) is None
            and not store.is_deleted(ledger_id)):
        await check.check(ledger_id, key, "a fence")
    await store.fence(ledger_id, key)
