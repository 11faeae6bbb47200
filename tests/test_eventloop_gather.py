"""``pybk.runtime.eventloop.gather``: asyncio.gather's results, errors and cancellation, with
Python 3.11's steps on every version (a child already done is counted on the loop's next
turn, never inside the call), so a simulated run schedules the same things on each."""

from __future__ import annotations

import asyncio

import pytest

from pybk.runtime.eventloop import gather


async def value(v: object, turns: int = 0) -> object:
    for _ in range(turns):
        await asyncio.sleep(0)
    return v


async def fail(exc: BaseException, turns: int = 0) -> object:
    for _ in range(turns):
        await asyncio.sleep(0)
    raise exc


async def test_results_in_argument_order_and_duplicates_run_once() -> None:
    calls = []

    async def once() -> int:
        calls.append(1)
        return 7

    shared = asyncio.ensure_future(once())
    assert await gather(value("a", 3), value("b"), shared, shared) == ["a", "b", 7, 7]
    assert calls == [1]
    assert await gather() == []


async def test_an_already_done_child_is_counted_on_the_next_turn() -> None:
    """Where 3.12's asyncio.gather would be done inside the call."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    done.set_result(1)
    outer = gather(done)
    assert not outer.done()
    await asyncio.sleep(0)
    assert outer.done() and outer.result() == [1]


async def test_the_first_error_is_raised_and_the_others_keep_running() -> None:
    slow = asyncio.ensure_future(value("late", 5))
    with pytest.raises(KeyError):
        await gather(fail(KeyError("k"), 1), slow)
    assert not slow.done()
    assert await slow == "late"


async def test_return_exceptions_puts_errors_and_cancellations_in_the_results() -> None:
    cancelled = asyncio.ensure_future(value("never", 10))
    cancelled.cancel("why")
    err = ValueError("v")
    out = await gather(value(1), fail(err), cancelled, return_exceptions=True)
    assert out[0] == 1 and out[1] is err
    assert isinstance(out[2], asyncio.CancelledError) and out[2].args == ("why",)


async def test_a_cancelled_child_is_the_gathers_error() -> None:
    child = asyncio.ensure_future(value("never", 10))
    child.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gather(child, value(2))


async def test_cancelling_the_gather_cancels_its_children() -> None:
    a = asyncio.ensure_future(value("a", 10))
    b = asyncio.ensure_future(value("b", 10))
    outer = gather(a, b)
    await asyncio.sleep(0)
    assert outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert a.cancelled() and b.cancelled()
    assert not outer.cancel()  # done: nothing more to cancel


async def test_awaiting_a_gather_in_a_cancelled_task_cancels_the_children() -> None:
    a = asyncio.ensure_future(value("a", 10))

    async def waiter() -> object:
        return await gather(a)

    t = asyncio.ensure_future(waiter())
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert a.cancelled()
