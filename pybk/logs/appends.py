"""The writer's appending side: records into batches, batches into envelopes on the ledger.

How a record travels: ``append`` puts it in the open batch and returns a future; the batch is
sealed into an envelope (one ledger entry) when it reaches the size or count limit, or at the
end of the current pass of the event loop (``flush_delay`` later if set; at once for
``append_now``'s lone record), and pushed to the
current segment's ledger; when the ledger acknowledges the entry (Qa bookies, in entry order)
every record's future gets its ``Position(segment, entry, slot)``. Per record the writer keeps
a reference and a future; lengths are packed as one array per envelope.

:class:`AppendsMixin` is :class:`pybk.logs.LogWriter`'s (a mixin: the writer's state is one,
set up by ``LogWriter.__init__``); it is apart so the hot path reads on its own.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from itertools import accumulate, repeat
from typing import TYPE_CHECKING, Any

from pybk.client.writer import LedgerHandle
from pybk.errors import (
    BacklogQuotaExceededError,
    ClientClosedError,
    EndOfStreamError,
    LedgerClosedError,
    RecordTooLargeError,
    TooManyRequestsError,
    fresh_copy,
)
from pybk.logs import envelope
from pybk.logs.backlog import BacklogStats
from pybk.logs.batch import Batch, Group, Sink, fail_sinks
from pybk.logs.config import WriterOptions
from pybk.logs.meta import SegmentInfo
from pybk.logs.position import Position
from pybk.logs.tail import unregister_writer

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog
    from pybk.logs.housekeeping import Housekeeper

__all__ = ["AppendsMixin"]

#: the writer's logger (its messages kept one name across the writer's modules)
log = logging.getLogger("pybk.logs.writer")

_new_tuple = tuple.__new__
_drain = deque  # deque(iterator, 0): run an iterator to its end in C
_OVERHEAD = envelope.PER_RECORD_OVERHEAD
_TXID_OVERHEAD = envelope.TXID_OVERHEAD


class AppendsMixin:
    """:class:`pybk.logs.LogWriter`'s appends, sealing, sending, acknowledgements and failure."""

    _cat: LogCatalog
    _opts: WriterOptions
    _loop: asyncio.AbstractEventLoop
    _set_result: Callable[[asyncio.Future[Any], Any], None]
    _codec: int
    _compressor: Any
    _max_record: int
    _room: int
    _flush_bytes: int
    _flush_records: int
    # the current segment
    _seg: SegmentInfo | None
    _lh: LedgerHandle | None
    _seg_records: int
    _seg_entries: int
    _seg_bytes: int
    _last_count: int
    # the open batch, the sealed batches waiting for a segment, what is in flight
    _buf: list[bytes]
    _buf_txids: list[int] | None
    _buf_sinks: list[Sink]
    _buf_runs: list[list[Any]]
    _buf_raw: int
    _flush_handle: asyncio.Handle | asyncio.TimerHandle | None
    _queued: deque[Batch]
    _rolling: bool
    _serial: int
    _acked_serial: int
    _flush_waiters: deque[tuple[int, asyncio.Future[None]]]
    _pending_bytes: int
    _max_pending: int
    _max_txid: int
    _sent_max_txid: int
    _last_acked: Position | None
    _error: BaseException | None
    stats: dict[str, int]
    _closed: bool
    _closing: bool
    _ended: bool
    _blocked: bool
    _ack_event: asyncio.Event | None
    backlog: BacklogStats
    # the writer's other sides (rolling; housekeeping, a part of its own)
    _maybe_roll: Callable[[], None]
    _housekeeper: Housekeeper

    # -- appending ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._error is not None:
            raise fresh_copy(self._error)
        if self._ended:
            raise EndOfStreamError(f"log {self._cat.name!r} is marked ended; no more records")
        if self._closed or self._closing:
            raise LedgerClosedError(f"log {self._cat.name!r}: this writer is closed")
        refusal = self._housekeeper.refusal
        if refusal is not None:
            self.backlog.refused_appends += 1
            raise BacklogQuotaExceededError(
                f"log {self._cat.name!r}: its slowest cursor is {refusal}; "
                "appends are refused until the cursors catch up (backlog_policy 'refuse')")

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

    def append_now(self, data: bytes) -> asyncio.Future[Position]:
        """:meth:`append`, for a caller that appends one record and waits for it (the
        synchronous WAL): with nothing else in flight or in the open batch the record is
        sent at once, not at the end of the loop pass (a batch that can hold only it)."""
        fut = self.append(data)
        if self._flush_handle is not None and not self._pending_bytes and len(self._buf) == 1:
            self.stats["lone_sends"] += 1
            self._seal()
        return fut

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

    def _add(self, data: bytes, n: int, txid: int | None, sink: Sink) -> None:
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
        if sink.__class__ is Group:
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
        group = Group(fut, len(items))
        if txids is None and self._buf_txids is None:
            self._add_many(items, group)
        else:
            for data, t in zip(items, ids if txids is not None else [None] * len(items),
                               strict=True):
                self._add(data, len(data), t, group)
        return fut

    def _add_many(self, items: list[bytes], group: Group) -> None:
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
        batch = Batch(self._buf, self._buf_txids, self._buf_sinks, self._buf_runs,
                       self._buf_raw, self._max_txid, self._serial)
        self._pending_bytes += self._buf_raw
        self._buf, self._buf_txids, self._buf_sinks, self._buf_runs = [], None, [], []
        self._buf_raw = 0
        if self._rolling or self._queued or self._lh is None:
            self._queued.append(batch)
        else:
            self._send(batch)

    def _send(self, batch: Batch) -> None:
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

    def _on_acked(self, batch: Batch, seq: int, fut: asyncio.Future[int]) -> None:
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
                group_cls = Group
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
            self._housekeeper.stop()
            if self._ack_event is not None:
                self._ack_event.set()
                self._ack_event = None
        self._blocked = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        sinks, self._buf_sinks = self._buf_sinks, []
        self._buf, self._buf_txids, self._buf_raw, self._buf_runs = [], None, 0, []
        fail_sinks(sinks, exc)
        while self._queued:
            batch = self._queued.popleft()
            self._pending_bytes -= batch.nbytes
            batch.fail(exc)
        while self._flush_waiters:
            _, w = self._flush_waiters.popleft()
            if not w.done():
                w.set_exception(fresh_copy(exc))

