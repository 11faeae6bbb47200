"""Reading a log: from a position or a txid, across segments, following the tail.

A reader walks the segment list of the log's metadata (kept current by a watch on its key).
A completed segment is read to its last entry; the in-progress one up to the LAC, then with
long polls (``read_last_add_confirmed_and_entry``) that the bookies answer as soon as the
writer's next entry, or its explicit LAC, arrives. When the segment is completed, removed or
followed by a new one, the metadata watch wakes the reader (DistributedLog's
``ReadAheadEntryReader``, in one loop).

Memory stays flat: entries are read ``read_ahead_entries`` at a time with one such read in
flight ahead of the records being handed out, never a whole range. Records before the log's
truncation point are never returned: starting before it, or falling behind it while reading,
raises AlreadyTruncatedError. The reader ends at ``stop_at`` (inclusive) or at the end of a
stream marked ended, and otherwise follows the tail for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Final

from pybk.client.reader import LedgerEntry, ReadHandle
from pybk.errors import (
    AlreadyTruncatedError,
    BKError,
    CorruptRecordError,
    NoSuchEntryError,
    NoSuchLedgerError,
)
from pybk.logs import envelope
from pybk.logs.config import ReaderOptions
from pybk.logs.meta import OFFLOADED, TRUNCATED, LogMetadata, SegmentInfo
from pybk.logs.offload import OffloadedHandle
from pybk.logs.position import LogRecord, Position, make_position
from pybk.logs.tail import live_writer

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["TAIL_READER_SKIPS_ON_ERROR", "LogReader"]

#: mutation switch (a name in ``ClientConfig.mutations``; registry: ``pybk.testing.mutations``):
#: a reader whose read of a range of entries fails (bookies slow, partitioned) swallows the
#: error and goes on after the range, as if it held nothing
TAIL_READER_SKIPS_ON_ERROR: Final = "tail_reader_skips_on_error"

_FIRST = Position(1, 0, 0)


class LogReader:
    """Records of one log, in position order: ``async for rec in reader`` (a
    :class:`~pybk.logs.LogRecord` each) or ``await reader.read_batch(n)``. Close it (or use
    ``async with``) to stop its watch and reads."""

    def __init__(
        self,
        catalog: LogCatalog,
        *,
        start: Position | None = None,
        txid: int | None = None,
        stop_at: Position | None = None,
        stop_at_acknowledged: bool = False,
        options: ReaderOptions | None = None,
    ) -> None:
        if start is not None and not isinstance(start, Position):
            raise TypeError(f"start must be a Position or None, not {type(start).__name__}")
        if stop_at is not None and not isinstance(stop_at, Position):
            raise TypeError(f"stop_at must be a Position or None, not {type(stop_at).__name__}")
        if txid is not None:
            if isinstance(txid, bool) or not isinstance(txid, int) or txid < 0:
                raise ValueError(f"txid must be an int >= 0, got {txid!r}")
            if start is not None:
                raise ValueError("give start or txid, not both")
        self._cat = catalog
        self._start = start
        self._txid = txid
        self._stop_at = stop_at
        #: stop_at is known acknowledged (a writer's own position): entries up to it may be
        #: read without waiting for the bookies' LAC to reach them
        self._stop_acked = stop_at_acknowledged and stop_at is not None
        self._opts = options if options is not None else ReaderOptions()
        self._skip_on_error = TAIL_READER_SKIPS_ON_ERROR in catalog.client.config.mutations
        self._md: LogMetadata | None = None
        self._changed = asyncio.Event()
        self._gen: AsyncGenerator[list[LogRecord], None] | None = None
        self._ready: list[LogRecord] = []
        self._index = 0
        self._ended = False
        self._closed = False
        #: a corrupt entry found after good records in one read: raised once those are out
        self._corrupt: CorruptRecordError | None = None
        #: the next position this reader may return (records before it are skipped)
        self._from = start if start is not None else _FIRST
        self._txid_floor = txid  # skip records until one with a txid >= this one

    # -- public ------------------------------------------------------------------------------

    def __aiter__(self) -> LogReader:
        return self

    async def __anext__(self) -> LogRecord:
        while self._index >= len(self._ready):
            chunk = await self._next_chunk()
            if chunk is None:
                raise StopAsyncIteration
            self._ready, self._index = chunk, 0
        rec = self._ready[self._index]
        self._index += 1
        return rec

    async def read_batch(self, max_records: int = 1000) -> list[LogRecord]:
        """Up to ``max_records`` next records (waiting for at least one while following the
        tail); an empty list once the reader reached its end."""
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        while self._index >= len(self._ready):
            chunk = await self._next_chunk()
            if chunk is None:
                return []
            self._ready, self._index = chunk, 0
        out = self._ready[self._index : self._index + max_records]
        self._index += len(out)
        return out

    async def aclose(self) -> None:
        """Stop reading: cancel reads in flight and the metadata watch. Idempotent."""
        self._closed = True
        self._ready, self._index = [], 0
        if self._gen is not None:
            await self._gen.aclose()

    close = aclose

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing ----------------------------------------------------------------------------

    async def _next_chunk(self) -> list[LogRecord] | None:
        if self._corrupt is not None:  # (the reader ends with it, as with any read error)
            err, self._corrupt = self._corrupt, None
            self._ended = True
            if self._gen is not None:
                await self._gen.aclose()
            raise err
        if self._closed or self._ended:
            return None
        if self._gen is None:
            self._gen = self._chunks()
        try:
            return await self._gen.__anext__()
        except StopAsyncIteration:
            self._ended = True
            return None

    def _on_md_change(self, _key: str) -> None:
        self._changed.set()

    async def _refresh(self) -> LogMetadata:
        self._changed.clear()
        self._md = await self._cat.read()
        return self._md

    def _check_truncation(self, pos: Position) -> None:
        assert self._md is not None
        tb = self._md.truncated_before
        if tb is not None and pos < tb:
            raise AlreadyTruncatedError(
                f"log {self._cat.name!r}: position {pos} is before the truncation point {tb}"
            )

    async def _chunks(self) -> AsyncGenerator[list[LogRecord], None]:
        cat = self._cat
        watch = cat.store.watch_value(cat.key, self._on_md_change)
        try:
            md = await self._refresh()
            pos = self._initial_position(md)
            while True:
                stop = self._stop_at
                if stop is not None and pos > stop:
                    return
                seg = self._segment_at(pos)
                if seg is None:
                    assert self._md is not None
                    if self._md.end_of_stream:
                        return
                    await self._changed.wait()
                    await self._refresh()
                    continue
                if seg.seq > pos.segment:
                    pos = make_position(seg.seq, 0, 0)
                async for chunk in self._read_segment(seg.seq, pos):
                    yield chunk
                    if self._ended:
                        return
                pos = make_position(seg.seq + 1, 0, 0)
        finally:
            watch.cancel()

    def _initial_position(self, md: LogMetadata) -> Position:
        tb = md.truncated_before
        if self._start is not None:
            self._check_truncation(self._start)
            return self._start
        first = tb if tb is not None else _FIRST
        self._from = first
        if self._txid is not None:
            for s in md.live_segments:
                if s.is_completed and s.max_txid < self._txid:
                    continue  # every txid in it (and before it) is smaller
                return max(first, make_position(s.seq, 0, 0))
            return max(first, make_position(md.next_seq, 0, 0))
        return first

    def _segment_at(self, pos: Position) -> SegmentInfo | None:
        """The first segment at or after ``pos``'s; AlreadyTruncatedError when the reader
        stands in the truncated part."""
        self._check_truncation(pos)
        assert self._md is not None
        for s in self._md.segments:
            if s.seq >= pos.segment and s.state != TRUNCATED:
                return s
        return None

    async def _open(self, seq: int, pos: Position) -> ReadHandle | OffloadedHandle | None:
        """A read handle on segment ``seq``'s ledger, or on its objects in the tier when
        the bookies' copy is deleted (None when the segment is gone)."""
        assert self._md is not None
        seg = self._md.segment(seq)
        if seg is None or seg.state == TRUNCATED:
            self._check_truncation(pos)
            return None
        if seg.tier == OFFLOADED:
            return await OffloadedHandle.open(self._cat, self._md, seg)
        try:
            return await self._cat.client.open_ledger(seg.ledger_id, recovery=False)
        except NoSuchLedgerError:
            await self._refresh()  # deleted: an empty segment removed, a truncation, an offload
            self._check_truncation(pos)
            now = self._md.segment(seq)
            if now is None or now.state == TRUNCATED:
                return None
            if now.offload is not None and now.offload.complete:
                return await OffloadedHandle.open(self._cat, self._md, now)
            raise

    async def _read_segment(
        self, seq: int, pos: Position
    ) -> AsyncGenerator[list[LogRecord], None]:
        rh: Any = await self._open(seq, pos)
        if rh is None:
            return
        entry = pos.entry
        batch = self._opts.read_ahead_entries
        ahead: tuple[int, asyncio.Task[list[LedgerEntry]]] | None = None
        backoff = 0.0
        try:
            while True:
                md = self._md
                assert md is not None
                seg = md.segment(seq)
                if seg is None or seg.state == TRUNCATED:
                    self._check_truncation(make_position(seq, entry, 0))
                    return
                if seg.is_completed:
                    last = seg.last_entry
                    if entry > last:
                        return
                    if rh.last_add_confirmed < last:
                        await rh.read_last_add_confirmed()  # the ledger is closed by now
                else:
                    last = rh.last_add_confirmed
                    stop = self._stop_at
                    if self._stop_acked and stop is not None and stop.segment == seq:
                        last = max(last, stop.entry)
                    own = live_writer(self._cat)  # read-your-writes: its acknowledged
                    mine = own.last_position if own is not None else None
                    if mine is not None and mine.segment == seq:
                        last = max(last, mine.entry)
                if entry <= last:
                    if ahead is not None and ahead[0] == entry:
                        task = ahead[1]
                    else:
                        if ahead is not None:
                            _drop(ahead[1])
                        task = asyncio.ensure_future(
                            _read(rh, entry, min(last, entry + batch - 1))
                        )
                    ahead = None
                    hi = min(last, entry + batch - 1)
                    if hi + 1 <= last:
                        nxt = hi + 1
                        ahead = (nxt, asyncio.ensure_future(
                            _read(rh, nxt, min(last, nxt + batch - 1))))
                    try:
                        entries = await task
                    except (NoSuchEntryError, NoSuchLedgerError):
                        await self._refresh()
                        self._check_truncation(make_position(seq, entry, 0))
                        raise
                    except BKError:
                        if not self._skip_on_error:
                            raise
                        entry = hi + 1  # broken build: the range is skipped, unread
                        continue
                    if not entries:
                        continue
                    entry = entries[-1].entry_id + 1
                    records = self._decode(seq, entries)
                    if records:
                        yield records
                    if self._ended:
                        return
                    backoff = 0.0
                    continue
                # the in-progress segment, read up to its LAC: wait for more
                if self._changed.is_set():
                    await self._refresh()
                    continue
                if rh.is_closed:  # sealed by a new writer: wait for the metadata to say so
                    await self._changed.wait()
                    await self._refresh()
                    continue
                if backoff:
                    await self._wait_changed(backoff)
                got, quick = await self._long_poll(rh, entry)
                if got is not None:
                    entry += 1
                    records = self._decode(seq, [got])
                    if records:
                        yield records
                    if self._ended:
                        return
                    backoff = 0.0
                elif quick:
                    # answered at once without the entry (a fenced ledger, bookies down):
                    # look at the ledger, and poll less often until something changes
                    with contextlib.suppress(BKError):
                        await rh.read_last_add_confirmed()
                    backoff = min(max(backoff * 2, 0.01), self._opts.long_poll_timeout)
        finally:
            if ahead is not None:
                _drop(ahead[1])
            await rh.close()

    async def _wait_changed(self, timeout: float) -> None:
        """Wait up to ``timeout`` for a metadata change (asyncio.wait, which never swallows
        a cancellation of the reader, unlike wait_for in Python 3.11)."""
        waiter = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait({waiter}, timeout=timeout)
        finally:
            waiter.cancel()

    async def _long_poll(self, rh: ReadHandle, entry: int) -> tuple[LedgerEntry | None, bool]:
        """Wait for ``entry`` or a metadata change: (the entry or None, answered quickly)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        timeout = self._opts.long_poll_timeout
        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(entry, timeout))
        wake = asyncio.ensure_future(self._changed.wait())
        waits: set[asyncio.Future[Any]] = {poll, wake}
        own = live_writer(self._cat)
        acked = asyncio.ensure_future(own.acked_event().wait()) if own is not None else None
        if acked is not None:
            waits.add(acked)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wake.cancel()
            if acked is not None:
                acked.cancel()
            if not poll.done():
                poll.cancel()
        got: LedgerEntry | None = None
        if poll.done() and not poll.cancelled():
            exc = poll.exception()
            if exc is None:
                got = poll.result()
            elif not isinstance(exc, BKError):
                raise exc
        else:
            _drop(poll)  # never awaited: awaiting it here could swallow our own cancellation
        quick = got is None and not self._changed.is_set() and (
            loop.time() - t0 < timeout / 10
        ) and (acked is None or not acked.done())
        return got, quick

    def _decode(self, seq: int, entries: list[LedgerEntry]) -> list[LogRecord]:
        """The records of ``entries`` that this reader returns, in order."""
        out: list[LogRecord] = []
        start = self._from
        stop = self._stop_at
        floor = self._txid_floor
        assert self._md is not None
        tb = self._md.truncated_before
        for e in entries:
            try:
                env = envelope.decode(e.data)
            except CorruptRecordError as exc:
                if not out:
                    raise
                self._corrupt = exc  # the good records before it first
                break
            eid = e.entry_id
            txids = env.txids
            keys = env.keys
            for slot, data in enumerate(env.records):
                pos = make_position(seq, eid, slot)
                if pos < start:
                    continue
                if stop is not None and pos > stop:
                    self._ended = True
                    return out
                txid = txids[slot] if txids is not None else None
                if floor is not None:
                    if txid is None or txid < floor:
                        continue
                    floor = self._txid_floor = None
                if tb is not None and not out and pos < tb:
                    self._check_truncation(pos)
                key = keys[slot] if keys is not None else None
                out.append(LogRecord(pos, data, txid, key))
        if out:
            self._from = out[-1].position.next_slot()
        if stop is not None and out and out[-1].position >= stop:
            self._ended = True
        return out


async def _read(rh: ReadHandle, first: int, last: int) -> list[LedgerEntry]:
    """Entries ``first..last``: beyond the handle's LAC only when the caller knows them
    acknowledged (a completed segment, or up to a writer's own position)."""
    if last <= rh.last_add_confirmed:
        return await rh.read(first, last)
    return await rh.read_unconfirmed(first, last)


def _drop(task: asyncio.Future[Any]) -> None:
    """Forget a read nobody needs any more (its outcome is retrieved, not logged)."""
    if not task.done():
        task.cancel()
    task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
