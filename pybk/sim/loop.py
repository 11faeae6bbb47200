"""A virtual-time asyncio event loop: the whole simulated cluster runs on one of these.

Why a loop and not a mocked clock: the protocol code (client, bookie, journal, metadata) uses
the running loop's ``time()``, ``call_later()``, ``sleep()``, futures and tasks and nothing
else, so swapping the loop is enough to make a run a pure function of its seed.

Design notes: docs/internals.md, "pybk/sim/loop.py".
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import contextvars
import gc
import sys
import threading
from asyncio.events import Handle, TimerHandle
from collections.abc import Awaitable, Callable, Coroutine, Generator
from heapq import heapify, heappop, heappush
from itertools import count
from typing import Any, TypeVar

from pybk.runtime.eventloop import yield_now

__all__ = [
    "SimDeadlock",
    "SimLoop",
    "SimTimeLimit",
    "next_timer",
    "run",
    "sleep",
]

T = TypeVar("T")


def sleep(seconds: float) -> Awaitable[None]:
    """``await sleep(seconds)``: ``asyncio.sleep(seconds)``, on the simulated loop as its bare
    timer future (:meth:`SimLoop.timer_future`: the same timer in the same order, without a
    coroutine, a timer handle and a context copy per call); ``seconds <= 0`` takes a turn
    as ``asyncio.sleep(0)`` does. What a simulated disk's sync and the workload's pacing
    await, thousands of times a run. (A waiter cancelled meanwhile leaves the timer to
    fire into nothing, where asyncio's would cancel its handle.)"""
    if seconds <= 0:
        return yield_now
    loop = asyncio.get_running_loop()
    if isinstance(loop, SimLoop):
        return loop.timer_future(seconds)
    return asyncio.sleep(seconds)


def _resolve_unless_cancelled(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


#: a handle without running its ``__init__`` (the stdlib's probes the debug mode per handle)
_new_handle = object.__new__


class SimDeadlock(RuntimeError):
    """Nothing can ever run again: no ready callback and no pending timer."""


class SimTimeLimit(RuntimeError):
    """The run went past its virtual-time or step budget (a livelock or a runaway workload)."""


class SimLoop(asyncio.base_events.BaseEventLoop):
    """Deterministic event loop with a virtual clock starting at ``start`` seconds."""

    def __init__(
        self,
        start: float = 0.0,
        *,
        max_time: float | None = None,
        max_steps: int | None = None,
    ) -> None:
        super().__init__()
        self._now = float(start)
        self._clock_resolution = 1e-9
        self._max_time = max_time
        self._max_steps = max_steps
        self.steps = 0
        #: Iterations allowed at one instant before the run counts as a livelock.
        self.max_still_steps = 50_000
        self._still = 0
        self._task_seq = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._tasks_live = 0  # live tasks at the last pruning of ``_tasks``
        #: the timer heap: (when, sequence, handle)
        self._timers: list[tuple[float, int, Any]] = []
        self._timer_seq = count()
        self._timers_cancelled = 0
        #: what reached the exception handler: (message, exception or None)
        self.unhandled: list[tuple[str, BaseException | None]] = []
        self.set_exception_handler(self._on_exception)

    # -- clock -------------------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def advance_to(self, when: float) -> None:
        """Move the clock forward (tests). Never backwards: virtual time is monotone."""
        if when < self._now:
            raise ValueError(f"cannot move virtual time back from {self._now} to {when}")
        self._now = when

    def stall(self, seconds: float) -> None:
        """The loop's thread is blocked for ``seconds`` (a blocking call made on it, such as
        an fsync made inline): the clock moves on and nothing else runs meanwhile; timers
        that fell due run late, on the next turn."""
        if seconds < 0:
            raise ValueError(f"cannot stall for a negative time ({seconds})")
        self._now += seconds

    def jump(self, seconds: float) -> None:
        """A forward jump of the monotonic clock (a suspended VM, a stopped process): the same
        as :meth:`stall`, named for the fault it models."""
        self.stall(seconds)

    # -- scheduling: the hot path of a simulated run -------------------------------------------

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any,
        context: contextvars.Context | None = None,
    ) -> Handle:
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        handle: Any = _new_handle(Handle)  # (private slots: Any for mypy)
        handle._context = context if context is not None else contextvars.copy_context()
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle  # type: ignore[no-any-return]

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        """A timer handle built without the stdlib's debug probes, on the heap."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        timer: Any = _new_handle(TimerHandle)
        timer._context = context if context is not None else contextvars.copy_context()
        timer._loop = self
        timer._callback = callback
        timer._args = args
        timer._cancelled = False
        timer._repr = None
        timer._source_traceback = None
        timer._when = when
        timer._scheduled = True
        heappush(self._timers, (when, next(self._timer_seq), timer))
        return timer  # type: ignore[no-any-return]

    def deliver_at(self, when: float, callback: Callable[..., object],
                   args: tuple[Any, ...]) -> None:
        """``call_at(when, callback, *args)`` for what is never cancelled (the simulated
        network's deliveries, thousands per run): the heap holds ``(callback, args)`` itself,
        no timer handle and no context copy (it runs in the loop's own context: the
        simulator's code sets no context variables), in the same order as any timer."""
        if self._closed:  # type: ignore[attr-defined]
            raise RuntimeError("Event loop is closed")
        heappush(self._timers, (when, next(self._timer_seq), (callback, args)))

    def timer_future(self, delay: float) -> asyncio.Future[None]:
        """``asyncio.sleep(delay)`` as a bare future (what a simulated disk's sync awaits,
        about two thousand times a run): done ``delay`` seconds from now, through the timer
        heap in the same order as any timer, with no coroutine, timer handle or context copy.
        A waiter cancelled meanwhile leaves the heap entry to fire into nothing. (For
        ``delay <= 0`` ``asyncio.sleep`` takes a turn instead of a timer: await
        :data:`pybk.runtime.eventloop.yield_now` for that.)"""
        fut = self.create_future()
        self.deliver_at(self._now + delay, _resolve_unless_cancelled, (fut,))
        return fut

    def call_later(  # type: ignore[override]
        self, delay: float, callback: Callable[..., object], *args: Any,
        context: contextvars.Context | None = None,
    ) -> TimerHandle:
        return self.call_at(self._now + delay, callback, *args, context=context)

    def _timer_handle_cancelled(self, handle: Any) -> None:
        if handle._scheduled:
            self._timers_cancelled += 1

    def _run_once(self) -> None:
        """One turn (see :meth:`_turns`, which runs them back to back)."""
        self._turns(1)

    def run_forever(self) -> None:
        """Run until stop() is called: the stdlib's, with the turns run by :meth:`_turns`
        (one call for the whole run instead of one per turn)."""
        self._check_closed()  # type: ignore[attr-defined]
        self._check_running()  # type: ignore[attr-defined]
        old_agen_hooks = sys.get_asyncgen_hooks()
        try:
            self._thread_id = threading.get_ident()
            sys.set_asyncgen_hooks(firstiter=self._asyncgen_firstiter_hook,  # type: ignore[attr-defined]
                                   finalizer=self._asyncgen_finalizer_hook)
            asyncio.events._set_running_loop(self)
            self._turns(None)
        finally:
            self._stopping = False
            self._thread_id = None  # type: ignore[assignment]
            asyncio.events._set_running_loop(None)
            sys.set_asyncgen_hooks(*old_agen_hooks)

    def _turns(self, limit: int | None) -> None:
        """Turns until ``stop()`` (or ``limit`` turns). A turn: advance the clock if nothing
        is ready, queue the timers now due, run what was ready at the start of the turn
        (callbacks queued meanwhile wait a turn). The turn and livelock counters live in
        locals while it runs (written back on the way out, whatever the way)."""
        ready = self._ready  # type: ignore[attr-defined]
        popleft = ready.popleft
        append = ready.append
        max_steps = self._max_steps if self._max_steps is not None else float("inf")
        max_still = self.max_still_steps
        steps = self.steps
        still = self._still
        stop_at = steps + limit if limit is not None else float("inf")
        try:
            while True:
                steps += 1
                if steps > max_steps:
                    raise SimTimeLimit(
                        f"more than {self._max_steps} loop iterations at t={self._now:.6f}")
                timers = self._timers
                if self._timers_cancelled > 64 and self._timers_cancelled * 2 > len(timers):
                    timers = self._drop_cancelled()
                if ready or self._stopping:
                    still += 1
                else:
                    while timers and type(first := timers[0][2]) is not tuple \
                            and first._cancelled:
                        heappop(timers)[2]._scheduled = False
                        self._timers_cancelled -= 1
                    if not timers:
                        waiting = [t.get_name() for t in self._tasks if not t.done()]
                        raise SimDeadlock(
                            f"deadlock at t={self._now:.6f}: nothing runnable and no timer "
                            f"pending; waiting tasks: {', '.join(waiting) or '(none)'}"
                        )
                    when = timers[0][0]
                    if when > self._now:
                        if self._max_time is not None and when > self._max_time:
                            raise SimTimeLimit(
                                f"virtual time would pass the limit {self._max_time:.3f}s "
                                f"(next timer at {when:.3f}s)"
                            )
                        self._now = when
                        still = 0
                    else:
                        still += 1
                if still > max_still:
                    raise SimTimeLimit(
                        f"livelock: {still} loop iterations without virtual time advancing "
                        f"at t={self._now:.6f}"
                    )
                end = self._now + 1e-9
                while timers and timers[0][0] < end:
                    handle = heappop(timers)[2]
                    if type(handle) is tuple:  # a delivery: (callback, args)
                        append(handle)
                        continue
                    handle._scheduled = False
                    if handle._cancelled:
                        self._timers_cancelled -= 1
                    else:
                        append(handle)
                for _ in range(len(ready)):
                    handle = popleft()
                    if type(handle) is tuple:  # a delivery (see deliver_at)
                        try:
                            handle[0](*handle[1])
                        except (SystemExit, KeyboardInterrupt):
                            raise
                        except BaseException as exc:
                            self.call_exception_handler({
                                "message": f"Exception in callback {handle[0]!r}",
                                "exception": exc})
                        continue
                    if handle._cancelled:
                        continue
                    try:  # (Handle._run inlined: one Python frame less per callback)
                        handle._context.run(handle._callback, *handle._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        self.call_exception_handler({
                            "message": f"Exception in callback {handle._callback!r}",
                            "exception": exc, "handle": handle})
                if self._stopping or steps >= stop_at:
                    return
        finally:
            self.steps = steps
            self._still = still

    def _drop_cancelled(self) -> list[tuple[float, int, Any]]:
        """Rebuild the timer heap without its cancelled timers (once they are half of it)."""
        live = []
        for item in self._timers:
            if type(item[2]) is not tuple and item[2]._cancelled:
                item[2]._scheduled = False
            else:
                live.append(item)
        heapify(live)
        self._timers = live
        self._timers_cancelled = 0
        return live

    def close(self) -> None:
        super().close()
        self._timers.clear()

    # -- tasks: deterministic names, tracked in creation order ---------------------------------

    def create_task(  # type: ignore[override]
        self,
        coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[T]:
        """A task named ``sim-task-N`` (N counting from 1 in creation order) unless the caller
        names it. Made here rather than through a task factory: how ``BaseEventLoop`` names a
        factory's task changed (3.13.0 sets the name it was given, ``None`` included, after
        the factory ran), and a deadlock report must name its tasks on every version."""
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        self._task_seq += 1
        if name is None:
            name = f"sim-task-{self._task_seq}"
        task: asyncio.Task[T] = asyncio.Task(coro, loop=self, name=name, context=context)
        tasks = self._tasks
        if len(tasks) > 256 + 2 * self._tasks_live:  # (amortized: prune when it doubled)
            self._tasks = tasks = [t for t in tasks if not t.done()]
            self._tasks_live = len(tasks)
        tasks.append(task)
        return task

    def set_task_factory(self, factory: Any) -> None:
        """Refused: the simulated loop makes its own tasks (see :meth:`create_task`)."""
        if factory is not None:
            raise RuntimeError("SimLoop makes its own tasks; a task factory cannot be set on it")

    def live_tasks(self) -> list[asyncio.Task[Any]]:
        """Unfinished tasks, oldest first (a list: ``asyncio.all_tasks`` is an unordered set)."""
        return [t for t in self._tasks if not t.done()]

    def _on_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Recorded, not logged: "exception never retrieved" reports fire from finalizers, whose
        # timing is the garbage collector's business, so they stay out of the trace.
        message = str(context.get("message", ""))
        exc = context.get("exception")
        self.unhandled.append((message, exc if isinstance(exc, BaseException) else None))

    # -- running -----------------------------------------------------------------------------

    def run_main(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion, then cancel every task still alive (oldest first)."""
        asyncio.set_event_loop(self)
        try:
            main = self.create_task(coro)
            try:
                return self.run_until_complete(main)
            finally:
                self._cancel_rest()
        finally:
            asyncio.set_event_loop(None)

    def shutdown(self) -> None:
        """Cancel every task still alive and let them finish, then close the loop (a coroutine
        finalized after the loop closed would try to schedule on it)."""
        if not self.is_closed():
            self._cancel_rest()
            # Coroutines caught in reference cycles are finalized by the cycle collector; do
            # it now, while their loop can still run their ``finally`` blocks.
            gc.collect()
            self._cancel_rest()
            self.close()

    def _cancel_rest(self) -> None:
        for _ in range(20):
            rest = self.live_tasks()
            if not rest:
                return
            for task in rest:
                task.cancel()
            gathered = asyncio.gather(*rest, return_exceptions=True)
            try:
                self.run_until_complete(gathered)
            except (SimDeadlock, SimTimeLimit):
                pass

    def _asyncgen_finalizer_hook(self, agen: Any) -> None:
        """An async generator collected unfinished: close it on the loop (the stdlib goes
        through ``call_soon_threadsafe``, which this loop refuses)."""
        if not self.is_closed():
            self.call_soon(self.create_task, agen.aclose())

    # -- what a simulated process may not do -------------------------------------------------

    def _process_events(self, event_list: list[Any]) -> None:
        pass

    def _write_to_self(self) -> None:
        pass

    def run_in_executor(  # type: ignore[override]
        self, executor: Any, func: Callable[..., T], *args: Any
    ) -> Any:
        raise RuntimeError(
            f"SimLoop: run_in_executor({getattr(func, '__qualname__', func)!r}) would use a "
            "thread; simulated code must stay on the loop"
        )

    def call_soon_threadsafe(  # type: ignore[override]
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        raise RuntimeError("SimLoop: call_soon_threadsafe means a thread is involved")

    async def getaddrinfo(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("SimLoop: no DNS (nor real sockets) in the simulator")

    async def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("SimLoop: no real sockets in the simulator")

    async def create_server(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("SimLoop: no real sockets in the simulator")


def run(coro: Coroutine[Any, Any, T], *, start: float = 0.0, max_time: float | None = None,
        max_steps: int | None = None) -> T:
    """Run ``coro`` on a fresh :class:`SimLoop` and close it (the simulator's ``asyncio.run``)."""
    loop = SimLoop(start, max_time=max_time, max_steps=max_steps)
    try:
        return loop.run_main(coro)
    finally:
        loop.shutdown()


def next_timer(loop: SimLoop) -> float | None:
    """When the earliest live timer fires (None if none): for stepping tests."""
    live = [when for when, _seq, h in loop._timers if type(h) is tuple or not h._cancelled]
    return min(live) if live else None
