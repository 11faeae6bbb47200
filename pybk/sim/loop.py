"""A virtual-time asyncio event loop: the whole simulated cluster runs on one of these.

Why a loop and not a mocked clock: the protocol code (client, bookie, journal, metadata) uses
the running loop's ``time()``, ``call_later()``, ``sleep()``, futures and tasks and nothing
else, so swapping the loop is enough to make a run a pure function of its seed.

How it works: :class:`SimLoop` is a ``BaseEventLoop`` whose "selector" never waits. When the
stdlib scheduler asks it to wait ``timeout`` seconds for I/O (it only asks for a positive
timeout when nothing is runnable), the loop sets its clock *exactly* to the ``when`` of the
earliest timer and returns no events, so the next iteration runs that timer. Ready callbacks
run in FIFO order and timers in heap order, both deterministic.

What it refuses, loudly: threads (``run_in_executor``, ``call_soon_threadsafe`` from another
thread), real sockets, pipes, subprocesses, DNS. A run in which nothing is runnable and no timer
is pending raises :class:`SimDeadlock` naming the virtual time and the tasks still waiting.

Private hooks of ``BaseEventLoop`` used (stable 3.11-3.13): ``_selector.select``,
``_process_events``, ``_write_to_self``, ``_scheduled``, ``_clock_resolution``.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import contextvars
import gc
import heapq
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

__all__ = [
    "SimDeadlock",
    "SimLoop",
    "SimTimeLimit",
    "next_timer",
    "run",
]

T = TypeVar("T")


class SimDeadlock(RuntimeError):
    """Nothing can ever run again: no ready callback and no pending timer."""


class SimTimeLimit(RuntimeError):
    """The run went past its virtual-time or step budget (a livelock or a runaway workload)."""


class _FakeSelector:
    """Stands in for the selector: advances virtual time instead of waiting for I/O."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> list[Any]:
        self._loop._advance(timeout)
        return []

    def close(self) -> None:
        pass


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
        self._selector = _FakeSelector(self)
        self._max_time = max_time
        self._max_steps = max_steps
        self.steps = 0
        #: Iterations allowed at one instant before the run counts as a livelock.
        self.max_still_steps = 50_000
        self._still = 0
        self._task_seq = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self.unhandled: list[str] = []
        self.set_task_factory(self._task_factory_impl)
        self.set_exception_handler(self._on_exception)

    # -- clock -------------------------------------------------------------------------------

    def time(self) -> float:
        return self._now

    def _advance(self, timeout: float | None) -> None:
        self.steps += 1
        if self._max_steps is not None and self.steps > self._max_steps:
            raise SimTimeLimit(f"more than {self._max_steps} loop iterations at t={self._now:.6f}")
        if timeout is None:
            waiting = [t.get_name() for t in self._tasks if not t.done()]
            raise SimDeadlock(
                f"deadlock at t={self._now:.6f}: nothing runnable and no timer pending; "
                f"waiting tasks: {', '.join(waiting) or '(none)'}"
            )
        if timeout > 0:
            self._still = 0
        else:
            self._still += 1
            if self._still > self.max_still_steps:
                raise SimTimeLimit(
                    f"livelock: {self._still} loop iterations without virtual time advancing "
                    f"at t={self._now:.6f}"
                )
        scheduled = self._scheduled  # type: ignore[attr-defined]
        if timeout <= 0 or not scheduled:
            return
        when: float = scheduled[0]._when
        if when > self._now:
            if self._max_time is not None and when > self._max_time:
                raise SimTimeLimit(
                    f"virtual time would pass the limit {self._max_time:.3f}s (next timer at "
                    f"{when:.3f}s)"
                )
            self._now = when

    def advance_to(self, when: float) -> None:
        """Move the clock forward (tests). Never backwards: virtual time is monotone."""
        if when < self._now:
            raise ValueError(f"cannot move virtual time back from {self._now} to {when}")
        self._now = when

    # -- tasks: deterministic names, tracked in creation order ---------------------------------

    def _task_factory_impl(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
        **kwargs: Any,
    ) -> asyncio.Task[Any]:
        self._task_seq += 1
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        task.set_name(f"sim-task-{self._task_seq}")
        if len(self._tasks) > 256:
            self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(task)
        return task

    def live_tasks(self) -> list[asyncio.Task[Any]]:
        """Unfinished tasks, oldest first (a list: ``asyncio.all_tasks`` is an unordered set)."""
        return [t for t in self._tasks if not t.done()]

    def _on_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # Recorded, not logged: "exception never retrieved" reports fire from finalizers, whose
        # timing is the garbage collector's business, so they stay out of the trace.
        message = str(context.get("message", ""))
        self.unhandled.append(message + ": " + repr(context.get("exception")))

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
    live = [h for h in loop._scheduled if not h._cancelled]  # type: ignore[attr-defined]
    heapq.heapify(live)
    return live[0].when() if live else None
