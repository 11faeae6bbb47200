"""Load drivers for anything with ``append() -> asyncio.Future``: closed loop and open loop.

* :func:`closed_loop`: ``inflight`` appends outstanding; each completion issues the next
  (from the done-callback: no task per append, so the driver costs as little as it can),
  until ``duration`` has passed. Throughput is what the system sustains at that depth;
  latency is from the call to the completion. ``inflight=1`` is a lone writer.
* :func:`open_loop`: appends issued at a fixed ``rate`` whatever the system does, each
  latency counted from when the append was *due* (not when it was issued), so a stall is
  charged to every append it delayed (no coordinated omission). It reports when the system
  fell behind (``behind``) and stops issuing once ``max_outstanding`` are in flight.

Both stop at the first failed append and raise its error.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from pybk.bench.stats import LatencySummary

__all__ = ["MIN_TICK", "Run", "closed_loop", "open_loop"]

Append = Callable[[], "asyncio.Future[Any]"]


@dataclass
class Run:
    """What a driver measured: completions, seconds, latencies (s)."""

    count: int
    elapsed: float
    latencies: list[float] = field(repr=False)
    #: open loop: the rate asked for (entries/s); closed loop: NaN
    target_rate: float = math.nan
    #: open loop: the most appends the system was behind the schedule (never issued yet
    #: because ``max_outstanding`` were in flight); 0 when it kept up
    behind: int = 0

    @property
    def rate(self) -> float:
        return self.count / self.elapsed if self.elapsed > 0 else math.nan

    def summary(self) -> LatencySummary:
        return LatencySummary.of(self.latencies)


async def closed_loop(append: Append, inflight: int, duration: float = math.inf, *,
                      count: int | None = None) -> Run:
    """Keep ``inflight`` appends outstanding for ``duration`` seconds, or until ``count``
    appends were issued (module doc)."""
    if inflight < 1:
        raise ValueError(f"inflight must be >= 1, got {inflight}")
    if duration <= 0 or (count is not None and count < 1):
        raise ValueError(f"duration and count must be > 0, got {duration} and {count}")
    if math.isinf(duration) and count is None:
        raise ValueError("give a duration or a count")
    limit = count if count is not None else math.inf
    issued = 0
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    lat: list[float] = []
    finished: asyncio.Future[None] = loop.create_future()
    outstanding = 0
    stop = clock() + duration

    def issue() -> None:
        nonlocal outstanding, issued
        t0 = clock()
        try:
            fut = append()
        except BaseException as exc:
            if not finished.done():
                finished.set_exception(exc)
            return
        outstanding += 1
        issued += 1
        fut.add_done_callback(lambda f: done(f, t0))

    def done(f: asyncio.Future[Any], t0: float) -> None:
        nonlocal outstanding
        outstanding -= 1
        now = clock()
        error = _failure(f)
        if error is not None:
            if not finished.done():
                finished.set_exception(error)
            return
        lat.append(now - t0)
        if now < stop and issued < limit and not finished.done():
            issue()
        elif outstanding == 0 and not finished.done():
            finished.set_result(None)

    start = clock()
    for _ in range(int(min(inflight, limit))):
        issue()
    try:
        await finished
    finally:
        elapsed = clock() - start
    return Run(len(lat), elapsed, lat)


#: the shortest ``open_loop`` tick: event loops' timers resolve whole milliseconds (asyncio
#: waits in ``epoll_wait``, whose timeout is in ms: a 0.5 ms timer fires after about 1.1 ms;
#: uvloop's libuv timers count ms and fire a 0.5 ms one at the very next pass, so a shorter
#: tick made the driver spin there, issuing an append or two per pass: measured here over
#: TCP at half the peak, 11 us of CPU per append instead of 7 and a p50 of 13 ms instead of 5)
MIN_TICK: Final = 0.001


async def open_loop(append: Append, rate: float, duration: float, *,
                    max_outstanding: int = 100_000, tick: float = MIN_TICK) -> Run:
    """Issue appends at ``rate`` per second for ``duration`` seconds (module doc). Every
    ``tick`` seconds of loop time (at least :data:`MIN_TICK`), the appends due since the
    last tick are issued."""
    if rate <= 0 or duration <= 0:
        raise ValueError(f"rate and duration must be > 0, got {rate} and {duration}")
    if tick < MIN_TICK:
        raise ValueError(f"tick must be >= {MIN_TICK} s (event loops' timers resolve whole "
                         f"milliseconds), got {tick}")
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    lat: list[float] = []
    finished: asyncio.Future[None] = loop.create_future()
    total = max(1, int(rate * duration))
    interval = 1.0 / rate
    issued = 0
    outstanding = 0
    behind = 0
    start = clock()

    def done(f: asyncio.Future[Any], *, due: float) -> None:
        nonlocal outstanding
        outstanding -= 1
        now = clock()
        error = _failure(f)
        if error is not None:
            if not finished.done():
                finished.set_exception(error)
            return
        lat.append(now - due)
        if issued == total and outstanding == 0 and not finished.done():
            finished.set_result(None)

    def pump() -> None:
        nonlocal issued, outstanding, behind
        if finished.done():
            return
        due_now = min(total, int((clock() - start) / interval) + 1)
        while issued < due_now and outstanding < max_outstanding:
            due = start + issued * interval
            try:
                fut = append()
            except BaseException as exc:
                finished.set_exception(exc)
                return
            issued += 1
            outstanding += 1
            fut.add_done_callback(partial(done, due=due))
        behind = max(behind, due_now - issued)
        if issued < total:
            loop.call_later(tick, pump)

    pump()
    try:
        await finished
    finally:
        elapsed = clock() - start
    return Run(len(lat), elapsed, lat, target_rate=rate, behind=behind)


def _failure(f: asyncio.Future[Any]) -> BaseException | None:
    if f.cancelled():
        return RuntimeError("an append was cancelled")
    return f.exception()
