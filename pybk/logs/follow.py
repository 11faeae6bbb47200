"""A log's records as a follower takes them: every record up to a point (a replay), or
the records as they are acknowledged, a list at a time (the WAL facades' ``replay`` and
``follow``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pybk.logs.config import ReaderOptions
from pybk.logs.log import Log
from pybk.logs.position import Position

__all__ = ["follow_batches", "pairs"]

#: records a follower reads ahead of its consumer (in batches of what the reader has ready)
_FOLLOW_AHEAD = 4


async def pairs(
    log: Log, start: Position | None, last: Position | None, options: ReaderOptions | None
) -> AsyncIterator[tuple[Position, bytes]]:
    """``(position, data)`` of every record from ``start`` (None: the oldest kept) up to
    ``last``, streamed."""
    if last is None or (start is not None and start > last):
        return
    async with log.reader(start, stop_at=last, stop_at_acknowledged=True,
                          options=options) as reader:
        while True:
            batch = await reader.read_batch(1024)
            if not batch:
                return
            for rec in batch:
                yield rec.position, rec.data


async def follow_batches(log: Log, start: Position | None, timeout: float | None,
                         options: ReaderOptions | None,
                         ) -> AsyncIterator[list[tuple[Position, bytes]]]:
    """What a tailing reader of ``log`` has ready, a list at a time, until ``timeout`` seconds
    pass with nothing new. The reader runs in a task of its own that reads ahead into a
    bounded queue: waiting with a timeout never cancels a read in the middle."""
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
    if start is not None and not isinstance(start, Position):
        raise TypeError(f"start must be a Position or None, not {type(start).__name__}")
    queue: asyncio.Queue[list[tuple[Position, bytes]] | BaseException | None] = \
        asyncio.Queue(_FOLLOW_AHEAD)
    reader = log.reader(start, options=options)

    async def pump() -> None:
        try:
            while batch := await reader.read_batch(1024):
                await queue.put([(rec.position, rec.data) for rec in batch])
            await queue.put(None)  # the log ended (end of stream)
        except Exception as exc:  # handed to the consumer, raised there
            await queue.put(exc)

    task = asyncio.ensure_future(pump())
    try:
        while True:
            if timeout is None:
                item = await queue.get()
            else:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError:
                    return
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await reader.aclose()
