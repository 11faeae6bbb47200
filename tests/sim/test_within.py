"""pybk.sim.workload.within: what ``async with asyncio.timeout(s)`` does, case by case (the
workload bounds thousands of calls per run with it, so it is a leaner copy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pybk.runtime.eventloop import within
from pybk.sim.loop import run


async def _stdlib(awaitable: Awaitable[Any], seconds: float) -> Any:
    async with asyncio.timeout(seconds):
        return await awaitable


Bound = Callable[[Awaitable[Any], float], Awaitable[Any]]
BOUNDS = [pytest.param(within, id="within"), pytest.param(_stdlib, id="asyncio.timeout")]


async def _later(value: int, delay: float) -> int:
    await asyncio.sleep(delay)
    return value


@pytest.mark.parametrize("bound", BOUNDS)
def test_a_result_in_time_comes_back_and_leaves_no_timer_behind(bound: Bound) -> None:
    async def main() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        got = await bound(_later(7, 1.0), 5.0)
        await asyncio.sleep(10.0)  # the bound's timer, if left armed, would cancel us here
        return got, loop.time()

    assert run(main()) == (7, 11.0)


@pytest.mark.parametrize("bound", BOUNDS)
def test_too_late_raises_timeout_error_at_the_bound(bound: Bound) -> None:
    async def main() -> tuple[str, float, int]:
        loop = asyncio.get_running_loop()
        try:
            await bound(_later(7, 10.0), 2.5)
        except TimeoutError as exc:
            task = asyncio.current_task()
            assert task is not None
            return (type(exc.__cause__).__name__, loop.time(), task.cancelling())
        return ("no timeout", loop.time(), -1)

    cause, now, cancelling = run(main())
    assert (now, cancelling) == (2.5, 0)
    # ``within`` chains the CancelledError as the stdlib does in later 3.11 patch releases
    # (3.11.7 here); Debian's 3.11.2 raises a bare TimeoutError
    assert cause == "CancelledError" or (bound is _stdlib and cause == "NoneType")


@pytest.mark.parametrize("bound", BOUNDS)
def test_an_error_of_the_awaitable_passes_through(bound: Bound) -> None:
    async def fails() -> None:
        await asyncio.sleep(1.0)
        raise KeyError("x")

    async def main() -> str:
        try:
            await bound(fails(), 5.0)
        except KeyError:
            return "KeyError"
        return "nothing"

    assert run(main()) == "KeyError"


@pytest.mark.parametrize("bound", BOUNDS)
def test_a_cancel_from_outside_stays_a_cancel(bound: Bound) -> None:
    async def inner() -> None:
        await bound(_later(7, 10.0), 5.0)

    async def main() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        task = loop.create_task(inner())
        await asyncio.sleep(1.0)
        task.cancel()
        await asyncio.wait([task])
        return task.cancelled(), loop.time()

    assert run(main()) == (True, 1.0)


@pytest.mark.parametrize("bound", BOUNDS)
def test_a_cancel_from_outside_after_the_bound_fired_stays_a_cancel(bound: Bound) -> None:
    """The bound fired and someone else cancelled the task too: not a timeout (the other
    cancellation is still owed), as asyncio.timeout decides by the task's cancel count."""
    async def inner() -> None:
        await bound(_later(7, 10.0), 2.0)

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        task = loop.create_task(inner())
        loop.call_at(2.0, task.cancel)  # (made after the bound's timer: runs right after it)
        await asyncio.wait([task])
        return task.cancelled()

    assert run(main()) is True


@pytest.mark.parametrize("bound", BOUNDS)
def test_no_wait_at_all_when_the_bound_is_zero(bound: Bound) -> None:
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        try:
            await bound(_later(7, 1.0), 0.0)
        except TimeoutError:
            return "timeout", loop.time()
        return "result", loop.time()

    assert run(main()) == ("timeout", 0.0)
