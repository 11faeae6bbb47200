"""Lines of stdin as they arrive, for the commands that append them (``pybk ledger append -``,
``pybk log append NAME -``): each line is one entry or record, sent as soon as it is read, so
a live pipe feeds a long-running append and a tail can follow it."""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import threading
from collections.abc import AsyncGenerator, Callable
from typing import IO

__all__ = ["StdinLines", "from_args"]

#: bytes read from stdin at a time
_CHUNK = 1 << 16


class StdinLines:
    """Lines of a binary stream (the newline removed), read a chunk at a time on a daemon
    thread, so the command's loop runs (and acknowledges, and prints) while the input is
    quiet, and a Ctrl-C never waits for a read that may never return. A line longer than
    ``limit`` bytes is refused (``too_long(message)`` raised, the message ending with
    ``what`` the limit is) before it is all in memory."""

    def __init__(self, stream: IO[bytes], limit: int,
                 too_long: Callable[[str], BaseException], what: str) -> None:
        self._stream = stream
        self._limit = limit
        self._too_long = too_long
        self._what = what
        self._asks: queue.SimpleQueue[Callable[[bytes | BaseException], object] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def _serve(self) -> None:
        read = _chunk_reader(self._stream)
        while True:
            answer = self._asks.get()
            if answer is None:
                return
            try:
                chunk: bytes | BaseException = read(_CHUNK)
            except Exception as exc:  # handed to the loop, which raises it
                chunk = exc
            try:
                answer(chunk)
            except RuntimeError:  # the loop is gone (the command ended)
                return
            if not chunk:
                return

    async def _read(self) -> bytes:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()

        def settle(chunk: bytes | BaseException) -> None:
            if fut.done():
                return
            if isinstance(chunk, BaseException):
                fut.set_exception(chunk)
            else:
                fut.set_result(chunk)

        self._asks.put(lambda chunk: loop.call_soon_threadsafe(settle, chunk))
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="pybk-stdin", daemon=True)
            self._thread.start()
        return await fut

    async def batches(self) -> AsyncGenerator[list[bytes], None]:
        """The complete lines of each chunk read, as it is read (a last line without a
        newline at the end of the input counts too)."""
        partial = bytearray()
        try:
            while True:
                chunk = await self._read()
                if not chunk:
                    if partial:
                        yield [bytes(partial)]
                    return
                partial += chunk
                if b"\n" not in chunk:
                    self._check(partial)
                    continue
                *lines, rest = bytes(partial).split(b"\n")
                partial = bytearray(rest)
                self._check(partial)
                yield lines
        finally:
            self._asks.put(None)

    def _check(self, partial: bytearray) -> None:
        if len(partial) > self._limit:
            raise self._too_long(
                f"a line of stdin is longer than {self._limit} bytes ({self._what})")


def _chunk_reader(stream: IO[bytes]) -> Callable[[int], bytes]:
    """What returns the bytes available (waiting for some): ``os.read`` on the descriptor
    when there is one, so a read left blocked when the command ends holds no lock that the
    interpreter's exit would wait for (a buffered stream's does); else ``read1``."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # an in-memory stream (tests)
        read1: Callable[[int], bytes] | None = getattr(stream, "read1", None)
        return read1 if read1 is not None else stream.readline
    return functools.partial(os.read, fd)


async def from_args(items: list[bytes]) -> AsyncGenerator[list[bytes], None]:
    """``items`` (given on the command line) as one batch, in the shape of
    :meth:`StdinLines.batches`."""
    yield items
