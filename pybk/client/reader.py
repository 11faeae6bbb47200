"""The read path: entries with replica failover, LAC reads, long polls, tailing.

An entry is read from its write set, one replica at a time: on an error or a digest
mismatch the next replica is asked, and when ``speculative_read_delay`` passes without an
answer the next one is asked too (the first valid copy wins). A corrupted replica is
therefore skipped, never returned.

A non-recovery LAC read asks every bookie of the last ensemble for its LAC and completes
once the answers cover every write set (:class:`~pybk.client.quorum.CoverageSet`);
it never fences, so the writer is not disturbed.

A long poll (``read_last_add_confirmed_and_entry``) asks the last ensemble's bookies to
answer once their LAC passes the entry before the one wanted, with that entry when they hold
it: one bookie at a time by default (BookKeeper's ``parallel=false``: the next one on a
failure, an early empty answer or silence past the timeout), or all of them at once
(``ClientConfig.long_poll_parallel``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Final

from pybk.client.reads import (
    LedgerEntry,
    drop_pending,
    in_order,
    read_lac_covered,
    read_range,
)
from pybk.client.sticky import StickyReads
from pybk.errors import (
    BKError,
    DigestMismatchError,
    EntryNotConfirmedError,
    NoSuchEntryError,
)
from pybk.metadata.base import LedgerMetadata
from pybk.runtime.eventloop import wait
from pybk.wire import (
    LAST_ENTRY,
    DigestManager,
    ReadRequest,
    ReadResponse,
    Response,
    Status,
)

if TYPE_CHECKING:
    from pybk.client.context import ClientContext

# (a module constant: each ``Status.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_OK = Status.OK

__all__ = ["LEDGER_TAIL_SKIPS_ON_ERROR", "LedgerEntry", "ReadHandle"]

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``): a
#: ledger's ``tail()`` that swallows a failed read and skips the range it asked for
LEDGER_TAIL_SKIPS_ON_ERROR: Final = "ledger_tail_skips_on_error"

#: what one long-poll answer says (besides the entry itself): the LAC covers the entry but
#: the answer did not bring it; the LAC is not there yet; an error or a bad body
_CONFIRMED, _EMPTY, _FAILED = object(), object(), object()


class ReadHandle:
    """A ledger opened for reading (after recovery, or without it).

    ``last_add_confirmed`` is what this handle knows; reads beyond it are refused unless
    unconfirmed reads are asked for. It rises as entries are read (their piggybacked LAC),
    on :meth:`read_last_add_confirmed`, on long polls and when the ledger is closed.
    """

    def __init__(
        self, ctx: ClientContext, metadata: LedgerMetadata, digest: DigestManager, lac: int
    ) -> None:
        self._ctx = ctx
        self._md = metadata
        self._digest = digest
        self._lac = metadata.last_entry_id if metadata.is_closed else lac
        self._closed = False
        #: how far a sequential long poll's first bookie is moved on: one more after each
        #: poll that ended without the entry
        self._poll_turn = 0
        #: the bookie this handle reads from first (ClientConfig.sticky_reads), or None
        self.sticky = StickyReads.for_ledger(ctx.config.sticky_reads, metadata, ctx.rng)

    @property
    def id(self) -> int:
        return self._md.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def is_closed(self) -> bool:
        """Is the *ledger* closed (sealed), as far as this handle knows?"""
        return self._md.is_closed

    @property
    def length(self) -> int:
        return self._md.length

    def _raise_lac(self, lac: int) -> None:
        if not self._md.is_closed and lac > self._lac:
            self._lac = lac

    def _check_range(self, first: int, last: int) -> None:
        for name, value in (("first", first), ("last", last)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, not {value!r}")
        if first < 0:
            raise ValueError(f"first must be >= 0, got {first}")
        if last < first:
            raise ValueError(f"last ({last}) must be >= first ({first})")

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` inclusive; ``last`` must be <= the last add confirmed."""
        self._check_range(first, last)
        if last > self._lac:
            raise EntryNotConfirmedError(
                f"ledger {self.id} has no confirmed entry {last}: its last add confirmed is "
                f"{self._lac}"
            )
        return await self._read(first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` without the LAC check (they may not be confirmed yet)."""
        self._check_range(first, last)
        if self._md.is_closed and last > self._md.last_entry_id:
            raise NoSuchEntryError(
                f"ledger {self.id} is closed at entry {self._md.last_entry_id}; "
                f"entry {last} does not exist"
            )
        return await self._read(first, last)

    async def _read(self, first: int, last: int) -> list[LedgerEntry]:
        try:
            entries, lac = await read_range(self._ctx, self._md, self._digest, first, last,
                                           self.sticky)
        except BKError:
            # the writer may have moved entries to a new ensemble since we last looked
            before = dict(self._md.ensembles)
            if self._md.is_closed or dict((await self._refresh_metadata()).ensembles) == before:
                raise
            entries, lac = await read_range(self._ctx, self._md, self._digest, first, last,
                                           self.sticky)
        self._raise_lac(lac)
        return entries

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies for the LAC (covering every write set) and return it."""
        if self._md.is_closed:
            return self._lac
        md = await self._refresh_metadata()
        if md.is_closed:
            return self._lac
        self._raise_lac(await read_lac_covered(self._ctx, self._md, self._digest))
        return self._lac

    async def _refresh_metadata(self) -> LedgerMetadata:
        md = await self._ctx.store.read_ledger(self.id)
        self._md = md
        if md.is_closed:
            self._lac = md.last_entry_id
        return md

    async def read_last_add_confirmed_and_entry(
        self, entry_id: int, timeout: float = 1.0, *, parallel: bool | None = None
    ) -> LedgerEntry | None:
        """Long poll: wait (up to ``timeout``) until ``entry_id`` is confirmed, then return it.

        Returns None on timeout, or when the ledger is closed before ``entry_id``.
        ``parallel``: ask every bookie of the last ensemble at once, or one at a time
        (None: the client's ``ClientConfig.long_poll_parallel``).
        """
        if entry_id < 0:
            raise ValueError(f"entry_id must be >= 0, got {entry_id}")
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout}")
        if parallel is not None and not isinstance(parallel, bool):
            raise TypeError(f"parallel must be a bool or None, not {parallel!r}")
        if entry_id <= self._lac:
            return (await self._read(entry_id, entry_id))[0]
        if self._md.is_closed:
            return None
        if parallel if parallel is not None else self._ctx.config.long_poll_parallel:
            return await self._poll_parallel(entry_id, timeout)
        return await self._poll_sequential(entry_id, timeout)

    def _poll_request(self, entry_id: int, timeout: float) -> ReadRequest:
        return ReadRequest(self._md.ledger_id, entry_id, previous_lac=entry_id - 1,
                           timeout=timeout)

    def _poll_reply(self, fut: asyncio.Future[Response], entry_id: int) -> object:
        """What one long-poll answer says: the entry (a :class:`LedgerEntry`),
        :data:`_CONFIRMED` (the LAC it brought covers ``entry_id``, without the entry),
        :data:`_EMPTY` (an answer whose LAC is not there yet) or :data:`_FAILED` (an error,
        a bad body). Raises the handle's LAC to what the answer proves."""
        try:
            response = fut.result()
        except BKError:
            return _FAILED
        if response.status != _OK or not isinstance(response, ReadResponse):
            return _FAILED
        self._raise_lac(response.lac)
        if response.body is not None:
            try:
                decoded = self._digest.verify(response.body)
            except DigestMismatchError:
                return _FAILED
            self._raise_lac(decoded.lac)
            if decoded.entry_id == entry_id and entry_id <= self._lac:
                return LedgerEntry(self.id, entry_id, decoded.payload)
        return _CONFIRMED if entry_id <= self._lac else _EMPTY

    async def _poll_parallel(self, entry_id: int, timeout: float) -> LedgerEntry | None:
        """The long poll sent to every bookie of the last ensemble at once."""
        request = self._poll_request(entry_id, timeout)
        futures = {
            self._ctx.transport.send(b, request, timeout + self._ctx.config.read_timeout): b
            for b in self._md.last_ensemble
        }
        pending = set(futures)
        try:
            while pending:
                done, pending = await wait(pending, first=True)
                for fut in in_order(done, futures):
                    got = self._poll_reply(fut, entry_id)
                    if got is _CONFIRMED:
                        return (await self._read(entry_id, entry_id))[0]
                    if isinstance(got, LedgerEntry):
                        return got
        finally:
            # every reply, also those answered in the same batch as the one returned
            drop_pending(futures)
        return None

    async def _poll_sequential(self, entry_id: int, timeout: float) -> LedgerEntry | None:
        """The long poll sent to one bookie of the last ensemble at a time.

        The first asked is the first of the write set of ``entry_id + 1`` (the earliest to
        hear, piggybacked on that entry, that ``entry_id`` is confirmed, and, with a write
        quorum above 1, a holder of ``entry_id`` itself, which then comes in the answer).
        The next bookie is asked, with what is left of ``timeout`` (none left: a probe
        answered at once), when the one asked fails, answers without the entry before the
        timeout (a fenced ledger, a bookie stopping or holding too many polls), or has not
        answered ``speculative_read_delay`` after the timeout (a silent bookie: the
        transport's own timeout comes ``read_timeout`` later). An answer without the entry at
        the timeout ends the poll (None); this handle's next poll then starts one bookie
        further on, so a bookie whose view of the LAC lags cannot hold a tail back."""
        md = self._md
        ensemble = md.last_ensemble
        size = len(ensemble)
        first = (entry_id + (1 if md.write_quorum > 1 else 0) + self._poll_turn) % size
        order = [ensemble[(first + i) % size] for i in range(size)]
        ctx = self._ctx
        if ctx.policy.local_rack is not None:
            order = ctx.policy.read_order(order, ctx.topology)
        cfg = ctx.config
        spec = cfg.speculative_read_delay
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pending: dict[asyncio.Future[Response], str] = {}
        asked = 0
        speculate_at = 0.0

        def ask_next() -> None:
            nonlocal asked, speculate_at
            now = loop.time()
            wait = max(deadline - now, 0.0)
            bookie = order[asked]
            asked += 1
            pending[ctx.transport.send(bookie, self._poll_request(entry_id, wait),
                                       wait + cfg.read_timeout)] = bookie
            speculate_at = now + wait + spec

        ask_next()
        try:
            while pending:
                wait_for = None
                if spec > 0 and asked < size:
                    wait_for = max(speculate_at - loop.time(), 0.0)
                done, _ = await wait(list(pending), wait_for, first=True)
                if not done:
                    ask_next()  # speculative: the bookie asked is silent past its timeout
                    if ctx.stats is not None:
                        ctx.stats.speculative_reads += 1
                    continue
                for fut in in_order(done, pending):
                    del pending[fut]
                    got = self._poll_reply(fut, entry_id)
                    if got is _CONFIRMED:
                        return (await self._read(entry_id, entry_id))[0]
                    if isinstance(got, LedgerEntry):
                        return got
                    if got is _EMPTY and loop.time() >= deadline:
                        self._poll_turn += 1
                        return None  # answered at the timeout without it: timed out
                if not pending and asked < size:
                    ask_next()
            self._poll_turn += 1
            return None
        finally:
            drop_pending(pending)

    async def tail(self, start: int = 0) -> AsyncGenerator[LedgerEntry, None]:
        """Every entry from ``start`` on, following the writer; ends when the ledger closes.

        Long polls follow the writer; one the bookies answer at once without the entry (a
        fenced ledger whose recovery has not closed it yet, bookies stopping) is followed by
        polls spaced out exponentially up to the long-poll timeout until something changes
        (an entry, the ledger's metadata), not by polls as fast as the round trips allow."""
        next_id = start
        changed = asyncio.Event()
        watch = self._ctx.store.watch_ledger(self.id, lambda _lid: changed.set())
        # the watch reports changes after what the store last returned, which may be newer
        # than this handle's metadata (another handle of the client read it): read it now
        await self._refresh_metadata()
        loop = asyncio.get_running_loop()
        backoff = 0.0  # before the next poll, after polls answered at once without the entry
        try:
            while True:
                if next_id <= self._lac:
                    backoff = 0.0
                    last = min(self._lac, next_id + self._ctx.config.read_batch_size - 1)
                    try:
                        entries = await self._read(next_id, last)
                    except BKError:
                        if LEDGER_TAIL_SKIPS_ON_ERROR not in self._ctx.config.mutations:
                            raise
                        next_id = last + 1  # the broken build: the range is skipped
                        continue
                    for entry in entries:
                        yield entry
                        next_id = entry.entry_id + 1
                    continue
                if self._md.is_closed:
                    return
                wake = asyncio.ensure_future(changed.wait())
                try:
                    if backoff:
                        await asyncio.wait({wake}, timeout=backoff)
                    if wake.done():  # the metadata changed meanwhile: look at it first
                        polled = None
                    else:
                        timeout = self._ctx.config.long_poll_timeout
                        started = loop.time()
                        polled = await self._poll_or_change(next_id, timeout, wake)
                        quick = loop.time() - started < timeout / 10
                        if polled is not None:
                            backoff = 0.0
                            yield polled
                            next_id = polled.entry_id + 1
                            continue
                        # answered at once, empty: poll less often until something changes
                        backoff = (min(max(backoff * 2, 0.01), timeout)
                                   if quick and not wake.done() else 0.0)
                finally:
                    wake.cancel()
                changed.clear()
                await self._refresh_metadata()
        finally:
            watch.cancel()

    async def _poll_or_change(self, entry_id: int, timeout: float,
                              wake: asyncio.Future[Any]) -> LedgerEntry | None:
        """A long poll for ``entry_id``, given up when ``wake`` (a metadata change) comes
        first: the entry, or None."""
        poll = asyncio.ensure_future(self.read_last_add_confirmed_and_entry(entry_id, timeout))
        try:
            await asyncio.wait({poll, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not poll.done():
                poll.cancel()
        if not poll.cancelled() and poll.done():
            return poll.result()
        try:
            await poll
        except (asyncio.CancelledError, BKError):
            pass
        return None

    async def read_last_entry_id_unconfirmed(self) -> int:
        """The highest entry id any bookie of the last ensemble holds (no fencing)."""
        md = self._md
        request = ReadRequest(md.ledger_id, LAST_ENTRY)
        best = -1
        for bookie in md.last_ensemble:
            try:
                response = await self._ctx.transport.send(
                    bookie, request, self._ctx.config.read_timeout
                )
            except BKError:
                continue
            ok = response.status == _OK and isinstance(response, ReadResponse)
            if ok and isinstance(response, ReadResponse) and response.body:
                try:
                    best = max(best, self._digest.verify(response.body).entry_id)
                except DigestMismatchError:
                    continue
        return best

    async def close(self) -> None:
        """Release the handle (local only: a reader never changes the ledger)."""
        self._closed = True

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<ReadHandle {self.id} lac={self._lac} state={self._md.state}>"
