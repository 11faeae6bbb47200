"""The single writer of a log: its state, opening, flush, truncation, end of stream, close.

The writer's other sides are its mixins: the appending side (records into batches, batches
into envelopes, acknowledgements) is :class:`pybk.logs.appends.AppendsMixin`; segments and
rolls are :class:`pybk.logs.rolling.RollingMixin`. Retention, the backlog quota and offloads
are a part of its own, :class:`pybk.logs.housekeeping.Housekeeper`, built here with what it
needs. The takeover that opening starts with is :mod:`pybk.logs.takeover`.

Design notes: docs/internals.md, "pybk/logs/writer.py".
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from pybk.client.writer import LedgerHandle
from pybk.errors import (
    ClientClosedError,
    LedgerFencedError,
    WriterConflictError,
    fresh_copy,
)
from pybk.logs import envelope
from pybk.logs.backlog import BacklogStats, has_backlog_quota
from pybk.logs.batch import Batch, Group, Sink
from pybk.logs.config import WriterOptions
from pybk.logs.housekeeping import Housekeeper
from pybk.logs.meta import LogMetadata, SegmentInfo
from pybk.logs.position import Position
from pybk.logs.rolling import RollingMixin
from pybk.logs.tail import register_writer, unregister_writer
from pybk.logs.takeover import take_over
from pybk.logs.truncation import plan_truncation

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["LogWriter"]


class LogWriter(RollingMixin):
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
        self._buf_sinks: list[Sink] = []
        #: runs of consecutive slots of one append_many call: [group, start, stop]
        self._buf_runs: list[list[Any]] = []
        self._buf_raw = 0  # the open batch's raw body size (lengths, txids, data)
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        # sealed batches waiting for a segment (during a roll)
        self._queued: deque[Batch] = deque()
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
        #: 4-12 bytes of length/txid each), the bytes stored (envelopes, compressed), and the
        #: records ``append_now`` sent at once (nothing else in flight: no batching delay)
        self.stats = {"entries": 0, "records": 0, "raw_bytes": 0, "stored_bytes": 0,
                      "lone_sends": 0}
        self._closed = False
        self._closing = False
        self._ended = md.end_of_stream
        #: any of error / closing / closed / ended: appends take the checked path
        self._blocked = self._ended
        #: set at the next acknowledgement (read-your-writes readers wait on it)
        self._ack_event: asyncio.Event | None = None
        #: retention, the backlog quota and offloads: a part of its own (pybk.logs.housekeeping)
        self._housekeeper = Housekeeper(
            catalog, self._epoch, options, self._loop, label,
            set_metadata=self._set_metadata, current_bytes=self._current_bytes,
            stopped=self._stopped, on_refusal=self._refusal_changed)
        #: the log's backlog quota as this writer last checked it (pybk.logs.backlog)
        self.backlog: BacklogStats = self._housekeeper.stats

    # -- opening (takeover) ------------------------------------------------------------------

    @classmethod
    async def open(cls, catalog: LogCatalog, options: WriterOptions, label: str) -> LogWriter:
        """Take the writer lock, recover what an earlier writer left, start a segment."""
        md = await take_over(catalog, label, "while this one was opening")
        writer = cls(catalog, md, options, label)
        register_writer(catalog, writer)
        writer._housekeeper.start()
        if has_backlog_quota(md.config) and not md.end_of_stream:
            await writer._housekeeper.check_at_open()
        if not md.end_of_stream:
            try:
                await writer._start_segment(None)
            except LedgerFencedError as exc:
                unregister_writer(catalog, writer)
                writer._housekeeper.stop()
                raise WriterConflictError(
                    f"log {catalog.name!r}: another writer took it over while this one was "
                    f"opening ({exc})"
                ) from exc
        return writer

    # -- what the housekeeper is told and asks ------------------------------------------------

    def _set_metadata(self, md: LogMetadata) -> None:
        self._md = md

    def _current_bytes(self) -> int:
        return self._seg_bytes

    def _stopped(self) -> bool:
        return self._closed or self._error is not None

    def _refusal_changed(self, refusal: str | None) -> None:
        """Appends are refused (the backlog quota) or may resume: the checked path decides."""
        self._blocked = (refusal is not None or self._error is not None or self._closing
                         or self._closed or self._ended)

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
            self._housekeeper.stop()
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
            self._housekeeper.stop()
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
        assert in_runs == [x if x.__class__ is Group else None for x in self._buf_sinks]
        per = envelope.PER_RECORD_OVERHEAD + (
            0 if self._buf_txids is None else envelope.TXID_OVERHEAD)
        assert self._buf_raw == sum(map(len, self._buf)) + per * len(self._buf)
        assert self._blocked == (self._error is not None or self._closing or self._closed
                                 or self._ended or self._housekeeper.refusal is not None)
        assert self._acked_serial <= self._serial
        assert not self._queued or self._rolling or self._lh is None or self._error is not None
