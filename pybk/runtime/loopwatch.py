"""How long the event loop was held: a timer every ``interval`` seconds notes how late it
ran, so an operator (``pybk_loop_stall_seconds_max``) and the abuse benchmark see the longest
stretch any one request or callback kept the loop from everything else."""

from __future__ import annotations

import asyncio

__all__ = ["LoopWatch"]


class LoopWatch:
    """The longest lateness of a periodic timer on the running loop (its own clock)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        #: the longest lateness seen, seconds (a stall of the loop)
        self.max_stall = 0.0
        #: ticks later than 100 ms
        self.long_stalls = 0
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._arm(self._loop.time())

    def _arm(self, now: float) -> None:
        assert self._loop is not None
        due = now + self.interval
        self._handle = self._loop.call_at(due, self._tick, due)

    def _tick(self, due: float) -> None:
        assert self._loop is not None
        now = self._loop.time()
        late = now - due
        if late > self.max_stall:
            self.max_stall = late
        if late > 0.1:
            self.long_stalls += 1
        self._arm(now)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
