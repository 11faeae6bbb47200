"""``pybk.runtime.eventloop.wait``: what ``asyncio.wait`` answers, and the same steps on the loop
(so a simulated run that switched to it kept every trace)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from pybk.runtime.eventloop import wait
from pybk.sim import loop as simloop


def _asyncio_wait(fs: Any, timeout: float | None, first: bool) -> Any:
    return asyncio.wait(fs, timeout=timeout,
                        return_when=asyncio.FIRST_COMPLETED if first else asyncio.ALL_COMPLETED)


def _pybk_wait(fs: Any, timeout: float | None, first: bool) -> Any:
    return wait(fs, timeout, first=first)


async def _scenario(waiter: Callable[..., Any], first: bool, timeout: float | None) -> list[Any]:
    """Three futures finished by timers (two at one instant), one already done, a bystander
    task that logs every turn it gets: the log says what ran when, and in what order."""
    loop = asyncio.get_running_loop()
    log: list[Any] = []
    futs = [loop.create_future() for _ in range(4)]
    futs[3].set_result("early")
    for i, at in ((0, 0.3), (1, 0.1), (2, 0.1)):
        loop.call_later(at, futs[i].set_result, i)

    async def bystander() -> None:
        for n in range(6):
            log.append(("bystander", n, round(loop.time(), 6)))
            await asyncio.sleep(0.05)

    side = asyncio.ensure_future(bystander())
    pending = set(futs[:3])
    while pending:
        done, pending = await waiter(pending, timeout, first)
        log.append(("woke", round(loop.time(), 6), sorted(futs.index(f) for f in done),
                    sorted(futs.index(f) for f in pending)))
        assert all(not f._callbacks for f in futs), "a done callback was left behind"
    done, pending = await waiter(futs, timeout, first)  # (all done already: one turn)
    log.append(("all done", sorted(futs.index(f) for f in done), len(pending)))
    await side
    return log


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("timeout", [None, 0.05, 0.2])
def test_the_same_answers_and_steps_as_asyncio_wait_on_the_simulated_loop(first, timeout):
    def run(waiter: Callable[..., Any]) -> tuple[list[Any], int]:
        lp = simloop.SimLoop()
        try:
            log = lp.run_main(_scenario(waiter, first, timeout))
            return log, lp.steps
        finally:
            lp.shutdown()

    ours, theirs = run(_pybk_wait), run(_asyncio_wait)
    assert ours == theirs
    log, _steps = ours
    assert [e[0] for e in log].count("woke") >= (2 if first else 1)


@pytest.mark.parametrize("first", [True, False])
def test_the_same_answers_as_asyncio_wait_on_asyncios_own_loop(first):
    async def main(waiter: Callable[..., Any]) -> Any:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(3)]
        loop.call_soon(futs[1].set_result, 1)
        loop.call_later(0.01, futs[2].set_exception, ValueError("x"))
        done, pending = await waiter(futs[1:], 5.0, first)
        timed_out = await waiter(futs[:1], 0.01, first)
        futs[0].cancel()
        futs[2].exception()
        return (sorted(futs.index(f) for f in done), sorted(futs.index(f) for f in pending),
                [len(s) for s in timed_out])

    assert asyncio.run(main(_pybk_wait)) == asyncio.run(main(_asyncio_wait))


def test_a_cancelled_waiter_leaves_no_callback_and_no_live_timer():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        task = asyncio.ensure_future(wait([fut], 30.0, first=True))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not fut._callbacks
        assert simloop.next_timer(loop) is None  # (the 30 s timeout was cancelled)
        fut.cancel()

    simloop.run(main())


def test_sleep_is_asyncio_sleep_on_any_other_loop_and_a_turn_at_zero():
    async def main() -> list[str]:
        order: list[str] = []
        loop = asyncio.get_running_loop()
        loop.call_soon(order.append, "ready callback")
        await simloop.sleep(0)
        order.append("after sleep(0)")
        t = loop.time()
        await simloop.sleep(0.02)
        assert loop.time() - t >= 0.015
        return order

    assert asyncio.run(main()) == ["ready callback", "after sleep(0)"]


@pytest.mark.parametrize("first", [True, False])
def test_nothing_to_wait_for_is_a_clear_error_not_a_wait_forever(first):
    async def main() -> None:
        with pytest.raises(ValueError, match="at least one future"):
            await wait([], 1.0, first=first)
        with pytest.raises(ValueError):  # (asyncio's own answer)
            await _asyncio_wait([], 1.0, first)

    simloop.run(main())
