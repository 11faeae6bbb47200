"""Journal records that may wait for the next batch: a writer's explicit LAC.

A record nothing waits on before going on (an explicit LAC: a hint for tailing readers,
learnt again from the entries after a crash) need not cost a batch and a sync of its own.
While the journal's buffer is empty such a record is held here; it joins the next batch
written for any other record or, when none comes within ``wait`` seconds (loop time), is
written on its own. A lone writer's journal then syncs once per entry, not twice: the LAC
record sent after each acknowledgement no longer holds the next entry behind a sync of its
own (serial group commit). Its future still resolves only once the record is synced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["LazyRecords"]


class LazyRecords:
    """Held records and their futures, and the timer that releases them."""

    __slots__ = ("_handle", "_release", "data", "futs", "wait")

    def __init__(self, wait: float, release: Callable[[], None]) -> None:
        if wait < 0:
            raise ValueError(f"lazy wait must be >= 0 seconds, got {wait!r}")
        self.wait = wait
        self._release = release
        self.data: list[bytes] = []
        self.futs: list[asyncio.Future[None]] = []
        self._handle: asyncio.TimerHandle | None = None

    def hold(self, loop: asyncio.AbstractEventLoop, data: bytes,
             fut: asyncio.Future[None]) -> None:
        self.data.append(data)
        self.futs.append(fut)
        if self._handle is None:
            self._handle = loop.call_later(self.wait, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._release()

    def take(self) -> tuple[list[bytes], list[asyncio.Future[None]]]:
        """Everything held, in order, now no longer held (the timer cancelled)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        data, futs = self.data, self.futs
        self.data, self.futs = [], []
        return data, futs

    def _check(self, buffered: list[bytes]) -> None:
        assert len(self.data) == len(self.futs)
        assert not (self.data and buffered)  # held only while the journal buffers nothing
        assert (self._handle is not None) == bool(self.data)
