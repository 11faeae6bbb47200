"""Logs for synchronous code: the async namespace, log, writer and reader driven by the event
loop of :class:`pybk.sync.runner.LoopThread` in its background thread.

``pybk.sync.Client.namespace(name)`` gives a :class:`SyncNamespace`. Readers are plain
iterators that fetch a batch of records per hop to the loop's thread (not one per record).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pybk.logs.backlog import Backlog
from pybk.logs.config import WriterOptions
from pybk.logs.cursor import Cursor
from pybk.logs.cursor_consumer import CursorConsumer
from pybk.logs.log import Log
from pybk.logs.meta import LogMetadata, SegmentInfo
from pybk.logs.namespace import Namespace
from pybk.logs.position import LogRecord, Position
from pybk.logs.reader import LogReader
from pybk.logs.writer import LogWriter

if TYPE_CHECKING:
    from pybk.sync.runner import LoopThread

__all__ = ["SyncCursor", "SyncCursorConsumer", "SyncLog", "SyncLogReader", "SyncLogWriter",
           "SyncNamespace"]

T = TypeVar("T")


class _Bound:
    def __init__(self, runner: LoopThread) -> None:
        self._runner = runner

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)


class SyncNamespace(_Bound):
    """Synchronous :class:`pybk.logs.Namespace`."""

    def __init__(self, runner: LoopThread, ns: Namespace) -> None:
        super().__init__(runner)
        self._ns = ns

    def create_log(self, name: str, **knobs: Any) -> SyncLog:
        return SyncLog(self._runner, self._run(self._ns.create_log(name, **knobs)))

    def open_log(self, name: str) -> SyncLog:
        return SyncLog(self._runner, self._run(self._ns.open_log(name)))

    def list_logs(self) -> list[str]:
        return self._run(self._ns.list_logs())

    def delete_log(self, name: str) -> None:
        self._run(self._ns.delete_log(name))


class SyncLog(_Bound):
    """Synchronous :class:`pybk.logs.Log`."""

    def __init__(self, runner: LoopThread, log: Log) -> None:
        super().__init__(runner)
        self.log = log

    @property
    def name(self) -> str:
        return self.log.name

    def writer(self, options: WriterOptions | None = None, **kwargs: Any) -> SyncLogWriter:
        return SyncLogWriter(self._runner, self._run(self.log.writer(options, **kwargs)))

    def reader(self, start: Position | None = None, **kwargs: Any) -> SyncLogReader:
        return SyncLogReader(self._runner, self.log.reader(start, **kwargs))

    def metadata(self) -> LogMetadata:
        return self._run(self.log.metadata())

    def segments(self) -> list[SegmentInfo]:
        return self._run(self.log.segments())

    def first_position(self) -> Position | None:
        return self._run(self.log.first_position())

    def last_position(self) -> Position | None:
        return self._run(self.log.last_position())

    def truncate(self, before: Position) -> None:
        self._run(self.log.truncate(before))

    def subscribe(self, name: str, start: str | Position = "earliest",
                  **kwargs: Any) -> SyncCursor:
        return SyncCursor(self._runner, self._run(self.log.subscribe(name, start, **kwargs)))

    def cursors(self) -> dict[str, Position | None]:
        return self._run(self.log.cursors())

    def delete_cursor(self, name: str) -> None:
        self._run(self.log.delete_cursor(name))

    def cursor_resume_point(self, name: str) -> Position | None:
        return self._run(self.log.cursor_resume_point(name))

    def reset_cursor(self, name: str, position: Position, *, create: bool = False) -> None:
        self._run(self.log.reset_cursor(name, position, create=create))

    def set_retention(self, max_age: float | None = None, max_bytes: int | None = None,
                      after_consumed: bool = False) -> None:
        self._run(self.log.set_retention(max_age, max_bytes, after_consumed))

    def apply_retention(self) -> None:
        self._run(self.log.apply_retention())

    def set_backlog_quota(self, max_bytes: int | None = None, max_age: float | None = None,
                          policy: str = "refuse") -> None:
        self._run(self.log.set_backlog_quota(max_bytes, max_age, policy))

    def backlog(self) -> Backlog:
        return self._run(self.log.backlog())

    def set_offload(self, url: str | None, **kwargs: Any) -> None:
        self._run(self.log.set_offload(url, **kwargs))

    def offload(self, before: Position | None = None) -> list[int]:
        return self._run(self.log.offload(before))

    def sweep_tier(self, grace: float = 3600.0) -> list[str]:
        return self._run(self.log.sweep_tier(grace))


class SyncCursor(_Bound):
    """Synchronous :class:`pybk.logs.Cursor`: ``receive()`` waits for the next record;
    iterating ends at the end of stream; acknowledgements return once durable."""

    def __init__(self, runner: LoopThread, cursor: Cursor) -> None:
        super().__init__(runner)
        self.cursor = cursor

    def receive(self, timeout: float | None = None) -> LogRecord | None:
        """The next record (None at the end of stream); TimeoutError after ``timeout``."""
        return self._run(_receive(self.cursor, timeout))

    def __iter__(self) -> Iterator[LogRecord]:
        while (rec := self.receive()) is not None:
            yield rec

    def ack(self, position: Position) -> None:
        self._run(self.cursor.ack(position))

    def ack_cumulative(self, position: Position) -> None:
        self._run(self.cursor.ack_cumulative(position))

    def nack(self, position: Position, delay: float | None = None) -> None:
        self._run(_nack(self.cursor, position, delay))

    def mark_delete_position(self) -> Position | None:
        return self._run(self.cursor.mark_delete_position())

    def consumer(self, name: str | None = None) -> SyncCursorConsumer:
        """A consumer sharing this cursor (one per worker thread; see
        :meth:`pybk.logs.Cursor.consumer`)."""
        return SyncCursorConsumer(self._runner, self._run(_consumer(self.cursor, name)))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._run(self.cursor.close())

    def __enter__(self) -> SyncCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncCursorConsumer(_Bound):
    """Synchronous :class:`pybk.logs.CursorConsumer`: a worker thread's share of a cursor."""

    def __init__(self, runner: LoopThread, consumer: CursorConsumer) -> None:
        super().__init__(runner)
        self.consumer = consumer

    def receive(self, timeout: float | None = None) -> LogRecord | None:
        """The next record for this consumer (None at the end of stream); TimeoutError
        after ``timeout``."""
        return self._run(_receive(self.consumer, timeout))

    def __iter__(self) -> Iterator[LogRecord]:
        while (rec := self.receive()) is not None:
            yield rec

    def ack(self, position: Position | LogRecord) -> None:
        self._run(self.consumer.ack(position))

    def nack(self, position: Position | LogRecord, delay: float | None = None) -> None:
        self._run(_nack(self.consumer, position, delay))

    def pending(self) -> list[Position]:
        return self.consumer.pending()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._run(_close_consumer(self.consumer))

    def __enter__(self) -> SyncCursorConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncLogWriter(_Bound):
    """Synchronous :class:`pybk.logs.LogWriter`: each call returns once durable."""

    def __init__(self, runner: LoopThread, writer: LogWriter) -> None:
        super().__init__(runner)
        self.writer = writer

    @property
    def last_position(self) -> Position | None:
        return self.writer.last_position

    def append(self, data: bytes, txid: int | None = None) -> Position:
        return self._run(_append(self.writer, data, txid))

    def append_many(self, records: Sequence[bytes],
                    txids: Sequence[int | None] | None = None) -> list[Position]:
        return self._run(_append_many(self.writer, records, txids))

    def flush(self) -> None:
        self._run(self.writer.flush())

    def roll(self) -> None:
        self._run(self.writer.roll())

    def truncate(self, before: Position) -> None:
        self._run(self.writer.truncate(before))

    def mark_end_of_stream(self) -> None:
        self._run(self.writer.mark_end_of_stream())

    def close(self) -> None:
        self._run(self.writer.close())

    def __enter__(self) -> SyncLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncLogReader(_Bound):
    """A log reader as a plain iterator (``for rec in reader``); it follows the tail like the
    async one, so a loop over it ends only at ``stop_at`` or the end of stream."""

    def __init__(self, runner: LoopThread, reader: LogReader, batch: int = 1000) -> None:
        super().__init__(runner)
        self.reader = reader
        self._batch = batch

    def __iter__(self) -> Iterator[LogRecord]:
        try:
            while True:
                records = self._run(self.reader.read_batch(self._batch))
                if not records:
                    return
                yield from records
        finally:
            self.close()

    def read_batch(self, max_records: int = 1000) -> list[LogRecord]:
        return self._run(self.reader.read_batch(max_records))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            self._run(self.reader.aclose())

    def __enter__(self) -> SyncLogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _receive(cursor: Cursor | CursorConsumer,
                   timeout: float | None) -> LogRecord | None:
    return await asyncio.wait_for(cursor.receive(), timeout)


async def _nack(cursor: Cursor | CursorConsumer, position: Any, delay: float | None) -> None:
    cursor.nack(position, delay)


async def _consumer(cursor: Cursor, name: str | None) -> CursorConsumer:
    return cursor.consumer(name)


async def _close_consumer(consumer: CursorConsumer) -> None:
    consumer.close()


async def _append(writer: LogWriter, data: bytes, txid: int | None) -> Position:
    return await writer.append(data, txid)


async def _append_many(writer: LogWriter, records: Sequence[bytes],
                       txids: Sequence[int | None] | None) -> list[Position]:
    return await writer.append_many(records, txids)

