"""The single writer of a log: batching, segments, rolling, takeover, truncation, end of stream.

How a record travels: ``append`` puts it in the open batch and returns a future; the batch is
sealed into an envelope (one ledger entry) when it reaches the size or count limit, or at the
end of the current pass of the event loop (``flush_delay`` later if set), and pushed to the
current segment's ledger; when the ledger acknowledges the entry (Qa bookies, in entry order)
every record's future gets its ``Position(segment, entry, slot)``. Per record the writer keeps
a reference and a future; lengths are packed as one array per envelope.

Design notes: docs/internals.md, "pybk/logs/writer.py".
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from functools import partial
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Any

from pybk.client.writer import LedgerHandle
from pybk.errors import (
    BKError,
    ClientClosedError,
    EndOfStreamError,
    LedgerClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    RecordTooLargeError,
    TooManyRequestsError,
    UnexpectedConditionError,
    WriterConflictError,
    fresh_copy,
)
from pybk.logs import envelope
from pybk.logs.config import WriterOptions
from pybk.logs.meta import COMPLETED, LogMetadata, SegmentInfo
from pybk.logs.position import Position
from pybk.logs.retention import housekeep
from pybk.logs.tail import register_writer, unregister_writer
from pybk.logs.takeover import take_over
from pybk.logs.truncation import plan_truncation

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["LogWriter"]

log = logging.getLogger(__name__)

_new_tuple = tuple.__new__
_drain = deque  # deque(iterator, 0): run an iterator to its end in C
_OVERHEAD = envelope.PER_RECORD_OVERHEAD
_TXID_OVERHEAD = envelope.TXID_OVERHEAD


class _Group:
    """The one future of an ``append_many`` call: collects its records' positions in order
    (envelopes are acknowledged in order, and records in slot order within one).

    Its records sit in an envelope as one run of consecutive slots (more than one run only
    when another call's records came in between, through the checked path), so the writer
    resolves a run at once: :meth:`resolve` makes the run's positions in C (no Python step
    per record), and the future is set when the last run is in."""

    __slots__ = ("count", "fut", "positions")

    def __init__(self, fut: asyncio.Future[list[Position]], count: int) -> None:
        self.fut = fut
        self.positions: list[Position] = []
        self.count = count

    def resolve(self, seq: int, eid: int, start: int, stop: int) -> None:
        """Slots ``start..stop-1`` of entry ``eid`` of segment ``seq`` are this call's next
        records (acknowledged)."""
        n = stop - start
        parts = zip(repeat(seq, n), repeat(eid, n), range(start, stop), strict=True)
        self.positions.extend(map(_new_tuple, repeat(Position, n), parts))
        if len(self.positions) >= self.count and not self.fut.done():
            self.fut.set_result(self.positions)

    def done(self) -> bool:
        return self.fut.done()

    def fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(fresh_copy(exc))


_Sink = Any  # asyncio.Future[Position] | _Group (checked by class in the hot loop)


class _Batch:
    """Records sealed together: one envelope, one entry.

    ``sinks`` has one item per record: the record's future (``append``) or its call's
    :class:`_Group` (``append_many``); ``runs`` lists each group's runs of consecutive slots,
    ``[group, start, stop]``, which is how groups are resolved (the per-record items are only
    for failing them)."""

    __slots__ = ("max_txid", "nbytes", "records", "runs", "serial", "sinks", "txids")

    def __init__(self, records: list[bytes], txids: list[int] | None, sinks: list[_Sink],
                 runs: list[list[Any]], nbytes: int, max_txid: int, serial: int) -> None:
        self.records = records
        self.txids = txids
        self.sinks = sinks
        self.runs = runs
        self.nbytes = nbytes
        self.max_txid = max_txid
        self.serial = serial

    def fail(self, exc: BaseException) -> None:
        for sink in self.sinks:
            if sink.__class__ is _Group:
                sink.fail(exc)
            elif not sink.done():
                sink.set_exception(fresh_copy(exc))


def _fail_sinks(sinks: Sequence[_Sink], exc: BaseException) -> None:
    for sink in sinks:
        if sink.__class__ is _Group:
            sink.fail(exc)
        elif not sink.done():
            sink.set_exception(fresh_copy(exc))


class LogWriter:
    """The writer of one log (use :meth:`pybk.logs.Log.writer`, as ``async with``)."""

    def __init__(self, catalog: LogCatalog, md: LogMetadata, options: WriterOptions,
                 label: str) -> None:
        self._cat = catalog
        self._md = md
        self._epoch = md.epoch
        self._opts = options
        self._label = label
        self._loop = asyncio.get_running_loop()
        #: the loop's futures' own set_result (unbound): resolving an envelope's futures is
        #: then one C-level map over them
        self._set_result = type(self._loop.create_future()).set_result
        cfg = md.config
        self._codec = cfg.codec
        self._compressor = envelope.make_compressor(self._codec)
        self._max_record = options.max_record_bytes
        self._room = options.max_envelope_bytes - envelope.HEADER_SIZE
        self._flush_bytes = min(options.flush_bytes, self._room)
        self._flush_records = options.flush_records
        # current segment
        self._seg: SegmentInfo | None = None
        self._lh: LedgerHandle | None = None
        self._seg_records = 0
        self._seg_entries = 0
        self._seg_bytes = 0
        self._seg_started = 0.0
        self._last_count = 0  # records in the last envelope pushed to the segment
        self._next: asyncio.Task[LedgerHandle] | None = None  # the ledger made ahead
        # the open batch
        self._buf: list[bytes] = []
        self._buf_txids: list[int] | None = None
        self._buf_sinks: list[_Sink] = []
        #: runs of consecutive slots of one append_many call: [group, start, stop]
        self._buf_runs: list[list[Any]] = []
        self._buf_raw = 0  # the open batch's raw body size (lengths, txids, data)
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        # sealed batches waiting for a segment (during a roll)
        self._queued: deque[_Batch] = deque()
        self._rolling = False
        self._roll_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # rolls (and their retention) under way
        self._serial = 0  # batches sealed
        self._acked_serial = 0  # batches acknowledged (in order)
        self._flush_waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._pending_bytes = 0  # raw bytes of sealed batches not yet acknowledged
        self._max_pending = options.max_pending_bytes
        self._max_txid = md.max_txid  # highest txid appended (sent or not)
        self._sent_max_txid = md.max_txid  # highest txid pushed to a segment
        self._last_acked: Position | None = md.last_position()
        self._error: BaseException | None = None
        #: what this writer pushed: entries (envelopes), records, their raw bytes (with the
        #: 4-12 bytes of length/txid each) and the bytes stored (envelopes, compressed)
        self.stats = {"entries": 0, "records": 0, "raw_bytes": 0, "stored_bytes": 0}
        self._closed = False
        self._closing = False
        self._ended = md.end_of_stream
        #: any of error / closing / closed / ended: appends take the checked path
        self._blocked = self._ended
        #: set at the next acknowledgement (read-your-writes readers wait on it)
        self._ack_event: asyncio.Event | None = None
        self._keeper: asyncio.Task[None] | None = None  # retention on loop time

    # -- opening (takeover) ------------------------------------------------------------------

    @classmethod
    async def open(cls, catalog: LogCatalog, options: WriterOptions, label: str) -> LogWriter:
        """Take the writer lock, recover what an earlier writer left, start a segment."""
        md = await take_over(catalog, label, "while this one was opening")
        writer = cls(catalog, md, options, label)
        register_writer(catalog, writer)
        if options.housekeeping_interval is not None:
            writer._keeper = writer._loop.create_task(
                writer._housekeeping(options.housekeeping_interval))
            writer._keeper.add_done_callback(_retrieve)
        if not md.end_of_stream:
            try:
                await writer._start_segment(None)
            except LedgerFencedError as exc:
                unregister_writer(catalog, writer)
                writer._stop_housekeeping()
                raise WriterConflictError(
                    f"log {catalog.name!r}: another writer took it over while this one was "
                    f"opening ({exc})"
                ) from exc
        return writer

    async def _create_ledger(self) -> LedgerHandle:
        cfg = self._md.config
        return await self._cat.client.create_ledger(
            cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum, cfg.digest_type, b"",
            custom_metadata={"pybk.log": self._cat.key.encode(), **self._cat.ledger_tags},
        )

    async def _start_segment(self, completed: SegmentInfo | None) -> None:
        """Complete ``completed`` (if any) and add the next segment, in one CAS."""
        lh = await self._take_next_ledger()
        now = self._cat.now_ms()

        def transform(md: LogMetadata) -> LogMetadata:
            if completed is not None:
                md = md.replace_segment(completed)
            seg = SegmentInfo(seq=md.next_seq, ledger_id=lh.id, ctime_ms=now, mtime_ms=now)
            return md.with_changes(
                segments=(*md.segments, seg), next_seq=md.next_seq + 1,
                allocated=tuple(x for x in md.allocated if x != lh.id),
            )

        try:
            md = await self._cat.update(transform, epoch=self._epoch)
        except BaseException:
            await _abandon_ledger(self._cat, lh)
            raise
        self._md = md
        self._seg = md.segments[-1]
        self._lh = lh
        self._seg_records = self._seg_entries = self._seg_bytes = self._last_count = 0
        self._seg_started = self._loop.time()

    async def _take_next_ledger(self) -> LedgerHandle:
        task, self._next = self._next, None
        if task is not None:
            try:
                return await task
            except (BKError, OSError) as exc:  # made ahead and failed: make one now
                log.info("log %s: the ledger made ahead failed (%s); making one now",
                         self._cat.name, exc)
        return await self._create_ledger()

    async def _make_ahead(self) -> LedgerHandle:
        lh = await self._create_ledger()
        try:
            self._md = await self._cat.update(
                lambda md: md.with_changes(allocated=(*md.allocated, lh.id)), epoch=self._epoch
            )
        except BaseException:
            await _abandon_ledger(self._cat, lh)
            raise
        return lh

    # -- properties --------------------------------------------------------------------------

    @property
    def last_position(self) -> Position | None:
        """The last position this writer knows acknowledged (None when the log is empty)."""
        return self._last_acked

    @property
    def epoch(self) -> int:
        return self._epoch

    def same_loop(self, loop: asyncio.AbstractEventLoop) -> bool:
        return loop is self._loop

    def acked_event(self) -> asyncio.Event:
        """An event set at this writer's next acknowledged entry (or failure)."""
        if self._ack_event is None:
            self._ack_event = asyncio.Event()
        return self._ack_event

    @property
    def segment(self) -> SegmentInfo | None:
        """The segment being written (None after close / end of stream)."""
        return self._seg

    @property
    def metadata(self) -> LogMetadata:
        """The log's metadata as this writer last wrote or read it."""
        return self._md

    @property
    def error(self) -> BaseException | None:
        """Why this writer failed (None while healthy)."""
        return self._error

    # -- appending ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._error is not None:
            raise fresh_copy(self._error)
        if self._ended:
            raise EndOfStreamError(f"log {self._cat.name!r} is marked ended; no more records")
        if self._closed or self._closing:
            raise LedgerClosedError(f"log {self._cat.name!r}: this writer is closed")

    def _check_txid(self, txid: object, floor: int) -> int:
        if isinstance(txid, bool) or not isinstance(txid, int):
            raise TypeError(f"txid must be an int or None, not {type(txid).__name__}")
        if txid < 0:
            raise ValueError(f"txid must be >= 0, got {txid}")
        if txid < floor:
            raise ValueError(
                f"txid {txid} is below the log's last txid {floor} (txids never decrease)"
            )
        return txid

    def append(self, data: bytes, txid: int | None = None) -> asyncio.Future[Position]:
        """Add one record; the future holds its position once it is durable (Qa bookies).

        Refused at once (nothing queued) when the record is not bytes (TypeError), larger
        than ``max_record_bytes`` (RecordTooLargeError), its txid is below the log's last one
        (ValueError), too much is pending (TooManyRequestsError), or the writer failed, was
        closed or the log ended."""
        # the common case in as few steps as possible: it runs once per record
        if txid is None and data.__class__ is bytes and not self._blocked and (
                self._buf_txids is None):
            n = len(data)
            raw = self._buf_raw + n + _OVERHEAD
            if (n <= self._max_record and raw <= self._room
                    and self._pending_bytes + raw <= self._max_pending):
                fut = self._loop.create_future()
                buf = self._buf
                buf.append(data)
                self._buf_sinks.append(fut)
                self._buf_raw = raw
                if raw >= self._flush_bytes or len(buf) >= self._flush_records:
                    self._seal()
                elif self._flush_handle is None:
                    self._schedule_flush()
                return fut
        return self._append_checked(data, txid)

    def _append_checked(self, data: bytes, txid: int | None) -> asyncio.Future[Position]:
        if data.__class__ is not bytes:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(f"append() takes bytes, not {type(data).__name__}")
            data = bytes(data)
        n = len(data)
        if n > self._max_record:
            raise RecordTooLargeError(
                f"record of {n} bytes is larger than max_record_bytes ({self._max_record})"
            )
        if self._blocked:
            self._check_open()
        if txid is not None:
            self._check_txid(txid, self._max_txid)
        if self._pending_bytes + self._buf_raw + n > self._max_pending:
            raise TooManyRequestsError(
                f"log {self._cat.name!r}: {self._pending_bytes + self._buf_raw} bytes appended "
                f"and not yet acknowledged; max_pending_bytes is {self._max_pending}"
            )
        fut: asyncio.Future[Position] = self._loop.create_future()
        self._add(data, n, txid, fut)
        return fut

    def _schedule_flush(self) -> None:
        delay = self._opts.flush_delay
        if delay > 0:
            self._flush_handle = self._loop.call_later(delay, self._flush_now)
        else:
            self._flush_handle = self._loop.call_soon(self._flush_now)

    def _add(self, data: bytes, n: int, txid: int | None, sink: _Sink) -> None:
        txids = self._buf_txids
        size = n + _OVERHEAD
        widen = 0  # the first txid of a batch gives its earlier records a txid slot (-1)
        if txids is not None:
            size += _TXID_OVERHEAD
        elif txid is not None:
            size += _TXID_OVERHEAD
            widen = _TXID_OVERHEAD * len(self._buf)
        if self._buf_raw + widen + size > self._room:
            self._seal()  # the batch is full: this record starts the next one
            widen = 0
            size = n + _OVERHEAD + (0 if txid is None else _TXID_OVERHEAD)
            txids = None
        if txid is not None:
            if txids is None:
                txids = self._buf_txids = [-1] * len(self._buf)
            self._max_txid = txid
        if txids is not None:
            txids.append(-1 if txid is None else txid)
        buf = self._buf
        if sink.__class__ is _Group:
            runs, slot = self._buf_runs, len(buf)
            if runs and runs[-1][0] is sink and runs[-1][2] == slot:
                runs[-1][2] = slot + 1
            else:
                runs.append([sink, slot, slot + 1])
        buf.append(data)
        self._buf_sinks.append(sink)
        self._buf_raw += widen + size
        if self._buf_raw >= self._flush_bytes or len(buf) >= self._flush_records:
            self._seal()
        elif self._flush_handle is None:
            self._schedule_flush()

    def append_many(
        self, records: Sequence[bytes], txids: Sequence[int | None] | None = None
    ) -> asyncio.Future[list[Position]]:
        """Add several records: ``await w.append_many([...])`` is their positions once all
        are durable. Every record and txid is checked before any is queued: a bad one
        refuses the whole call (raised here). A future, not a coroutine, as for append."""
        items = list(records)
        if not set(map(type, items)) <= {bytes}:  # the common case checked at C speed
            for i, item in enumerate(items):
                if not isinstance(item, bytes | bytearray | memoryview):
                    raise TypeError(
                        f"append_many() takes bytes, item {i} is {type(item).__name__}"
                    )
            items = [b if b.__class__ is bytes else bytes(b) for b in items]
        if items and max(map(len, items)) > self._max_record:
            i = next(i for i, b in enumerate(items) if len(b) > self._max_record)
            raise RecordTooLargeError(
                f"record {i} of {len(items[i])} bytes is larger than max_record_bytes "
                f"({self._max_record})"
            )
        if txids is not None:
            ids = list(txids)
            if len(ids) != len(items):
                raise ValueError(f"{len(items)} records but {len(ids)} txids")
            floor = self._max_txid
            for t in ids:
                if t is not None:
                    floor = self._check_txid(t, floor)
        self._check_open()
        total = sum(map(len, items))
        pending = self._pending_bytes + self._buf_raw
        if pending + total > self._max_pending:
            raise TooManyRequestsError(
                f"log {self._cat.name!r}: {pending} bytes pending, {total} more "
                f"would pass max_pending_bytes ({self._max_pending})"
            )
        fut: asyncio.Future[list[Position]] = self._loop.create_future()
        if not items:
            fut.set_result([])
            return fut
        group = _Group(fut, len(items))
        if txids is None and self._buf_txids is None:
            self._add_many(items, group)
        else:
            for data, t in zip(items, ids if txids is not None else [None] * len(items),
                               strict=True):
                self._add(data, len(data), t, group)
        return fut

    def _add_many(self, items: list[bytes], group: _Group) -> None:
        """Records without txids, in runs that fit the open batch (found by bisecting the
        running total of their sizes: no per-record Python step but the list copies)."""
        # cum[j]: raw size of records 0..j-1, each with its 4-byte length
        cum = list(accumulate(map(_OVERHEAD.__add__, map(len, items)), initial=0))
        i, n = 0, len(items)
        while i < n:
            room = min(self._room, self._flush_bytes) - self._buf_raw
            fits = bisect_right(cum, cum[i] + room) - 1  # records i..fits-1 fit
            fits = min(fits, i + self._flush_records - len(self._buf))
            if fits <= i:
                if self._buf:
                    self._seal()
                    continue
                fits = i + 1  # a lone record larger than flush_bytes (but within room)
            start = len(self._buf)
            self._buf_runs.append([group, start, start + fits - i])
            self._buf.extend(items[i:fits])
            self._buf_sinks.extend([group] * (fits - i))
            self._buf_raw += cum[fits] - cum[i]
            i = fits
            if self._buf_raw >= self._flush_bytes or len(self._buf) >= self._flush_records:
                self._seal()
        if self._buf and self._flush_handle is None:
            self._schedule_flush()

    # -- sealing and sending -----------------------------------------------------------------

    def _flush_now(self) -> None:
        self._flush_handle = None
        if self._buf:
            self._seal()

    def _seal(self) -> None:
        """Close the open batch: send it, or queue it while a roll is under way."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._buf:
            return
        self._serial += 1
        batch = _Batch(self._buf, self._buf_txids, self._buf_sinks, self._buf_runs,
                       self._buf_raw, self._max_txid, self._serial)
        self._pending_bytes += self._buf_raw
        self._buf, self._buf_txids, self._buf_sinks, self._buf_runs = [], None, [], []
        self._buf_raw = 0
        if self._rolling or self._queued or self._lh is None:
            self._queued.append(batch)
        else:
            self._send(batch)

    def _send(self, batch: _Batch) -> None:
        lh, seg = self._lh, self._seg
        assert lh is not None and seg is not None
        count = len(batch.records)
        data = envelope.encode(batch.records, batch.txids, self._seg_records, batch.max_txid,
                               self._codec, self._compressor)
        try:
            fut = lh.append(data)
        except BaseException as exc:
            self._pending_bytes -= batch.nbytes
            batch.fail(exc)
            self._fail(exc)
            return
        self._sent_max_txid = batch.max_txid
        stats = self.stats
        stats["entries"] += 1
        stats["records"] += count
        stats["raw_bytes"] += batch.nbytes
        stats["stored_bytes"] += len(data)
        self._seg_records += count
        self._seg_entries += 1
        self._seg_bytes += len(data)
        self._last_count = count
        fut.add_done_callback(partial(self._on_acked, batch, seg.seq))
        self._maybe_roll()

    def _on_acked(self, batch: _Batch, seq: int, fut: asyncio.Future[int]) -> None:
        self._pending_bytes -= batch.nbytes
        if fut.cancelled():
            exc: BaseException | None = ClientClosedError("the append was cancelled")
        else:
            exc = fut.exception()
        if exc is not None:
            batch.fail(exc)
            self._fail(exc)
            return
        eid = fut.result()
        sinks, runs = batch.sinks, batch.runs
        new, pos_cls = _new_tuple, Position
        if not runs:  # futures only (append): no Python step per record
            n = len(sinks)
            parts = zip(repeat(seq, n), repeat(eid, n), range(n), strict=True)
            try:
                _drain(map(self._set_result, sinks, map(new, repeat(pos_cls, n), parts)), 0)
            except asyncio.InvalidStateError:  # a future its caller cancelled: skip it
                for slot, sink in enumerate(sinks):
                    if not sink.done():
                        sink.set_result(new(pos_cls, (seq, eid, slot)))
        else:
            if sum(stop - start for _, start, stop in runs) != len(sinks):  # futures too
                group_cls = _Group
                for slot, sink in enumerate(sinks):
                    if sink.__class__ is not group_cls and not sink.done():
                        sink.set_result(new(pos_cls, (seq, eid, slot)))
            for group, start, stop in runs:  # append_many calls: one C-level step a run
                group.resolve(seq, eid, start, stop)
        self._last_acked = new(pos_cls, (seq, eid, len(sinks) - 1))
        self._acked_serial = batch.serial
        if self._ack_event is not None:
            self._ack_event.set()
            self._ack_event = None
        waiters = self._flush_waiters
        while waiters and waiters[0][0] <= batch.serial:
            _, w = waiters.popleft()
            if not w.done():
                w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        """Fail the writer: everything not yet sent fails with ``exc``, as does every later
        call. Entries already pushed settle on their own (the ledger fails them too)."""
        if self._error is None:
            self._error = exc
            log.info("log %s: writer failed: %r", self._cat.name, exc)
            unregister_writer(self._cat, self)
            self._stop_housekeeping()
            if self._ack_event is not None:
                self._ack_event.set()
                self._ack_event = None
        self._blocked = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        sinks, self._buf_sinks = self._buf_sinks, []
        self._buf, self._buf_txids, self._buf_raw, self._buf_runs = [], None, 0, []
        _fail_sinks(sinks, exc)
        while self._queued:
            batch = self._queued.popleft()
            self._pending_bytes -= batch.nbytes
            batch.fail(exc)
        while self._flush_waiters:
            _, w = self._flush_waiters.popleft()
            if not w.done():
                w.set_exception(fresh_copy(exc))

    # -- rolling -----------------------------------------------------------------------------

    def _roll_due(self, fraction: float = 1.0) -> bool:
        cfg = self._md.config
        if cfg.roll_bytes is not None and self._seg_bytes >= cfg.roll_bytes * fraction:
            return True
        if cfg.roll_entries is not None and self._seg_entries >= cfg.roll_entries * fraction:
            return True
        return cfg.roll_seconds is not None and (
            self._loop.time() - self._seg_started >= cfg.roll_seconds * fraction
        )

    def _maybe_roll(self) -> None:
        if self._rolling or self._error is not None:
            return
        if self._roll_due():
            self._begin_roll()
        elif self._next is None and self._roll_due(0.5):
            self._next = self._loop.create_task(self._make_ahead())
            self._next.add_done_callback(_retrieve)

    def _begin_roll(self) -> None:
        self._rolling = True
        task = self._loop.create_task(self._roll())
        self._roll_task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _roll(self) -> None:
        """One roll. It owns ``_rolling`` until the next segment is in place; then the
        queued batches go out (which may begin the next roll) and retention runs."""
        try:
            completed = await self._seal_segment()
            await self._start_segment(completed)
        except BaseException as exc:
            self._rolling = False
            self._fail(_as_failure(exc))
            if not isinstance(exc, Exception):
                raise
            return
        self._rolling = False
        self._drain_queue()
        try:
            await self._apply_retention()
        except BaseException as exc:
            self._fail(_as_failure(exc))
            if not isinstance(exc, Exception):
                raise

    def _drain_queue(self) -> None:
        while self._queued and self._lh is not None and not self._rolling:
            self._send(self._queued.popleft())

    async def _seal_segment(self) -> SegmentInfo:
        """Stop writing the current segment: wait for its entries, close its ledger; the
        segment as completed (``last_entry`` -1 when it holds nothing)."""
        lh, seg = self._lh, self._seg
        if lh is None or seg is None:
            raise UnexpectedConditionError(
                f"log {self._cat.name!r}: no segment to complete (a roll without a segment)"
            )
        self._lh = None
        try:
            await lh.close()
        except BKError as exc:
            # e.g. the ledger was recovered and closed elsewhere: say so if the log moved on
            current = await self._cat.read()
            if current.epoch != self._epoch:
                raise LedgerFencedError(
                    f"log {self._cat.name!r}: another writer ({current.writer or 'unnamed'}, "
                    f"epoch {current.epoch}) took the log over from this one"
                ) from exc
            raise
        if self._error is not None:  # an entry failed (fenced: another writer took over)
            raise fresh_copy(self._error)
        if lh.last_add_confirmed < 0:
            return seg.with_changes(state=COMPLETED, mtime_ms=self._cat.now_ms())
        return seg.with_changes(
            state=COMPLETED, last_entry=lh.last_add_confirmed, last_slot=self._last_count - 1,
            records=self._seg_records, bytes=lh.length, max_txid=self._sent_max_txid,
            mtime_ms=self._cat.now_ms(),
        )

    async def roll(self) -> None:
        """Complete the current segment now and start the next one (rolls otherwise happen
        by size, entry count or age). Nothing to do while the segment is empty."""
        self._check_open()
        self._seal()
        await self._wait_roll()
        if not self._rolling and self._error is None and self._seg_entries > 0:
            self._begin_roll()
            await self._wait_roll()
        if self._error is not None:
            raise fresh_copy(self._error)

    async def _wait_roll(self) -> None:
        """Wait for every roll under way (and the retention each runs after it)."""
        while self._tasks:
            await asyncio.wait([asyncio.shield(t) for t in list(self._tasks)])

    async def _apply_retention(self) -> None:
        self._md = await housekeep(self._cat, epoch=self._epoch)

    async def _housekeeping(self, interval: float) -> None:
        """Retention and the tier's deletion lag on loop time, while the writer lives (a
        failure is logged and tried again next time; a takeover ends it)."""
        while True:
            await asyncio.sleep(interval)
            if self._stopped():
                return
            try:
                await self._apply_retention()
            except LedgerFencedError:
                return
            except (BKError, OSError) as exc:
                log.info("log %s: housekeeping failed, will retry: %s", self._cat.name, exc)

    def _stopped(self) -> bool:
        return self._closed or self._error is not None

    def _stop_housekeeping(self) -> None:
        task, self._keeper = self._keeper, None
        if task is not None:
            task.cancel()

    # -- flush, truncate, end of stream, close -------------------------------------------------

    async def flush(self) -> None:
        """Send what is batched and wait until everything appended so far is durable."""
        if self._error is not None:
            raise fresh_copy(self._error)
        self._seal()
        target = self._serial
        if self._acked_serial >= target:
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        self._flush_waiters.append((target, fut))
        await fut

    async def truncate(self, before: Position) -> None:
        """Drop every record before ``before`` (readers get AlreadyTruncatedError there).

        ``before`` may be at most just past the last acknowledged record
        (``last_position.next_slot()``): records not yet written cannot be dropped."""
        if not isinstance(before, Position):
            raise TypeError(f"truncate(before=...) takes a Position, not {type(before).__name__}")
        if self._error is not None:
            raise fresh_copy(self._error)
        done = self._md.truncated_before
        if done is not None and before <= done:
            return
        end = self._last_acked.next_slot() if self._last_acked is not None else None
        if end is None or before > end:
            raise ValueError(
                f"cannot truncate before {before}: the last acknowledged record is "
                f"{self._last_acked} (truncate at most up to just after it)"
            )
        await self._truncate(before)

    async def _truncate(self, before: Position) -> None:
        md = await self._cat.update(lambda md: plan_truncation(md, before), epoch=self._epoch)
        self._md = await self._cat.purge_truncated(md, epoch=self._epoch)

    async def mark_end_of_stream(self) -> None:
        """Flush, complete the segment and mark the log ended: later appends (by any writer)
        raise EndOfStreamError; readers stop once they read everything before the mark."""
        self._check_open()
        self._closing = self._blocked = True
        try:
            await self._finish(end_of_stream=True)
            self._ended = True
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._closed = True
            unregister_writer(self._cat, self)
            self._stop_housekeeping()
            await self._release()

    async def close(self) -> None:
        """Flush, complete the current segment (or delete it when empty) and release the
        ledger made ahead. A failed writer (e.g. fenced by a newer one) closes locally."""
        if self._closed or self._closing:
            return
        self._closing = self._blocked = True
        try:
            if self._error is None and not self._ended:
                await self._finish(end_of_stream=False)
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._closed = True
            unregister_writer(self._cat, self)
            self._stop_housekeeping()
            await self._release()

    async def _finish(self, *, end_of_stream: bool) -> None:
        """Send everything, wait for it (and for rolls), then complete the segment."""
        self._seal()
        while True:
            await self._wait_roll()
            if self._error is not None:
                raise fresh_copy(self._error)
            await self.flush()
            if not self._rolling:
                break
        completed = await self._seal_segment()
        self._seg = None
        drop = completed.last_entry < 0  # an empty segment goes

        def transform(md: LogMetadata) -> LogMetadata:
            md = md.without_segments([completed.seq]) if drop else md.replace_segment(completed)
            return md.with_changes(end_of_stream=md.end_of_stream or end_of_stream)

        self._md = await self._cat.update(transform, epoch=self._epoch)
        if drop:
            await self._cat.delete_ledger(completed.ledger_id)

    async def _release(self) -> None:
        """Give back the ledger made ahead (deleted, and dropped from ``allocated``)."""
        task, self._next = self._next, None
        if task is None:
            return
        await asyncio.wait([task])  # (a creation cut short would leave its ledger behind)
        if task.cancelled() or task.exception() is not None:
            return
        lh = task.result()
        await _abandon_ledger(self._cat, lh)
        if self._error is None:
            self._md = await self._cat.update(
                lambda md: md.with_changes(allocated=tuple(x for x in md.allocated
                                                           if x != lh.id))
                if lh.id in md.allocated else None,
                epoch=self._epoch,
            )

    async def abort(self) -> None:
        """Stop at once, as if the process died: nothing is completed or released (the next
        writer recovers the segment). Records not yet sent fail with ClientClosedError;
        records already pushed may still be acknowledged."""
        self._closed = self._blocked = True
        self._fail(ClientClosedError(f"log {self._cat.name!r}: the writer was aborted"))
        for task in (*self._tasks, self._next):
            if task is not None and not task.done():
                task.cancel()

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        seg = self._seg.seq if self._seg is not None else None
        return (f"<LogWriter {self._cat.namespace}/{self._cat.name} epoch={self._epoch} "
                f"segment={seg} last={self._last_acked}>")

    def _check(self) -> None:
        """Invariants (tests): the open batch's bookkeeping adds up; queued batches exist
        only while no ledger takes them."""
        assert len(self._buf) == len(self._buf_sinks)
        assert self._buf_txids is None or len(self._buf_txids) == len(self._buf)
        in_runs = [None] * len(self._buf_sinks)
        for group, start, stop in self._buf_runs:
            assert 0 <= start < stop <= len(self._buf_sinks)
            for slot in range(start, stop):
                assert in_runs[slot] is None  # runs do not overlap
                in_runs[slot] = group
        assert in_runs == [x if x.__class__ is _Group else None for x in self._buf_sinks]
        per = _OVERHEAD + (0 if self._buf_txids is None else _TXID_OVERHEAD)
        assert self._buf_raw == sum(map(len, self._buf)) + per * len(self._buf)
        assert self._blocked == (self._error is not None or self._closing or self._closed
                                 or self._ended)
        assert self._acked_serial <= self._serial
        assert not self._queued or self._rolling or self._lh is None or self._error is not None


def _as_failure(exc: BaseException) -> BaseException:
    """What the writer's appends fail with when a roll ends in ``exc``: a roll cancelled (the
    writer's task torn down with its loop or process) is a closed client to them, never a
    bare CancelledError in an append's future."""
    if isinstance(exc, Exception):
        return exc
    failure = ClientClosedError(f"the log writer was stopped while rolling ({type(exc).__name__})")
    failure.__cause__ = exc
    return failure


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _abandon_ledger(cat: LogCatalog, lh: LedgerHandle) -> None:
    """A ledger this writer made and no longer needs (a segment that never made it into the
    metadata, a ledger made ahead): delete it, unless a segment names it after all (a CAS
    whose reply was lost, "outcome unknown", may have been applied). Deleting one still
    listed in ``allocated`` is harmless: whoever clears the list deletes it again."""
    try:
        md = await cat.read()
    except BKError as exc:
        log.warning("log %s: cannot tell whether ledger %d is in use (%s); keeping it",
                    cat.name, lh.id, exc)
        return
    if any(s.ledger_id == lh.id for s in md.segments):
        return
    try:
        await lh.close()
    except NoSuchLedgerError:
        return  # already deleted (by the writer that took the log over)
    except BKError as exc:
        log.info("log %s: unused ledger %d did not close: %s", cat.name, lh.id, exc)
    try:
        await cat.delete_ledger(lh.id)
    except BKError as exc:
        log.warning("log %s: could not delete unused ledger %d: %s", cat.name, lh.id, exc)
