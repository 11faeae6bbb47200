"""SimLoop: virtual time, determinism, and loud refusals (threads, sockets, deadlocks)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pybk.sim.loop import SimDeadlock, SimLoop, SimTimeLimit, run


def test_time_jumps_exactly_to_the_next_timer_and_costs_no_wall_time() -> None:
    seen: list[float] = []

    async def main() -> float:
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, lambda: seen.append(loop.time()))
        loop.call_later(2.5, lambda: seen.append(loop.time()))
        await asyncio.sleep(3600)
        return loop.time()

    wall = time.perf_counter()
    end = run(main())
    # an hour of virtual time: a loop that slept would take an hour (the bound is wide so a
    # busy machine cannot fail it; this is no measurement)
    assert time.perf_counter() - wall < 60.0
    assert seen == [0.1, 2.5]
    assert end == 3600.0


def test_timeouts_fire_in_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.Event().wait()
        return loop.time()

    assert run(main()) == 5.0


def test_ready_callbacks_run_in_fifo_order_and_runs_repeat_exactly() -> None:
    async def main() -> list[str]:
        out: list[str] = []

        async def worker(name: str, delay: float) -> None:
            for i in range(3):
                await asyncio.sleep(delay)
                out.append(f"{name}{i}@{asyncio.get_running_loop().time():.3f}")

        await asyncio.gather(*(worker(n, d) for n, d in (("a", 0.3), ("b", 0.2), ("c", 0.3))))
        out.append(asyncio.current_task().get_name())  # type: ignore[union-attr]
        return out

    first, second = run(main()), run(main())
    assert first == second
    assert first[0] == "b0@0.200"
    assert first[-1] == "sim-task-1"  # per-loop task names, not a process-global counter


def test_deadlock_is_reported_with_the_waiting_tasks() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(SimDeadlock, match=r"deadlock at t=0\.000000.*sim-task-1"):
        run(main())


def test_livelock_at_one_instant_is_reported() -> None:
    async def main() -> None:
        while True:
            await asyncio.sleep(0)

    loop = SimLoop()
    loop.max_still_steps = 1000
    with pytest.raises(SimTimeLimit, match="livelock"):
        loop.run_main(main())
    loop.close()


def test_virtual_time_limit() -> None:
    async def main() -> None:
        await asyncio.sleep(100)

    with pytest.raises(SimTimeLimit, match="limit"):
        run(main(), max_time=10.0)


def test_threads_and_real_io_are_refused() -> None:
    async def executor() -> None:
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, 0)

    with pytest.raises(RuntimeError, match="thread"):
        run(executor())

    async def to_thread() -> None:
        await asyncio.to_thread(time.sleep, 0)

    with pytest.raises(RuntimeError, match="thread"):
        run(to_thread())

    async def connect() -> None:
        await asyncio.open_connection("127.0.0.1", 9)

    with pytest.raises(NotImplementedError, match="real sockets"):
        run(connect())


def test_leftover_tasks_are_cancelled_when_main_returns() -> None:
    cancelled: list[bool] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(10**6)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(1)

    run(main())
    assert cancelled == [True]


def test_clock_never_moves_back() -> None:
    loop = SimLoop(start=5.0)
    with pytest.raises(ValueError, match="back"):
        loop.advance_to(1.0)
    loop.close()


def test_timers_due_at_one_instant_run_in_the_order_they_were_made() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        out: list[int] = []
        for i in range(50):
            loop.call_at(1.0, out.append, i)
        handle = loop.call_at(1.0, out.append, 99)
        handle.cancel()
        await asyncio.sleep(2)
        return out

    assert run(main()) == list(range(50))


def test_stall_and_jump_let_time_pass_with_nothing_running() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimLoop)
        out: list[tuple[str, float]] = []
        loop.call_later(0.5, lambda: out.append(("timer", loop.time())))
        loop.stall(2.0)  # blocked: the timer due at 0.5 runs late
        out.append(("after stall", loop.time()))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        loop.jump(10.0)
        await asyncio.sleep(0)
        out.append(("after jump", loop.time()))
        with pytest.raises(ValueError):
            loop.stall(-1.0)
        return out

    assert run(main()) == [("after stall", 2.0), ("timer", 2.0), ("after jump", 12.0)]


def test_an_unfinished_async_generator_is_closed_on_the_loop() -> None:
    closed: list[bool] = []

    async def gen():  # type: ignore[no-untyped-def]
        try:
            yield 1
            yield 2
        finally:
            closed.append(True)

    async def main() -> None:
        g = gen()
        await g.__anext__()
        del g
        import gc

        gc.collect()
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    run(main())
    assert closed == [True]


def test_an_exception_escaping_a_callback_is_recorded_with_its_exception() -> None:
    loop = SimLoop()

    async def main() -> None:
        asyncio.get_running_loop().call_soon(lambda: 1 / 0)
        await asyncio.sleep(0.1)

    loop.run_main(main())
    loop.shutdown()
    assert [type(exc).__name__ for _msg, exc in loop.unhandled] == ["ZeroDivisionError"]


def test_deliveries_and_timers_run_in_the_order_they_were_made() -> None:
    """``deliver_at`` (the network's messages: no handle, never cancelled) shares the timer
    heap and its order: due at one instant, deliveries and timers interleave as made, a
    cancelled timer among them is skipped, and one due later waits for its time."""
    loop = SimLoop()

    async def main() -> list[object]:
        out: list[object] = []
        for i in range(20):
            if i % 3:
                loop.deliver_at(1.0, out.append, (f"d{i}",))
            else:
                loop.call_at(1.0, out.append, f"t{i}")
        loop.call_at(1.0, out.append, "cancelled").cancel()
        loop.deliver_at(1.5, lambda: out.append(loop.time()), ())
        await asyncio.sleep(1.2)
        out.append("slept")
        await asyncio.sleep(1.0)
        return out

    got = loop.run_main(main())
    loop.shutdown()
    want: list[object] = [f"d{i}" if i % 3 else f"t{i}" for i in range(20)]
    assert got == [*want, "slept", 1.5]


def test_an_exception_escaping_a_delivery_is_recorded_with_its_exception() -> None:
    loop = SimLoop()

    async def main() -> None:
        loop.deliver_at(0.05, lambda: 1 / 0, ())
        await asyncio.sleep(0.1)

    loop.run_main(main())
    loop.shutdown()
    assert [type(exc).__name__ for _msg, exc in loop.unhandled] == ["ZeroDivisionError"]


def test_a_timer_future_resumes_its_waiter_as_asyncio_sleep_would() -> None:
    """``timer_future`` (what a simulated disk's sync awaits) against ``asyncio.sleep`` on the
    same loop: each waiter resumes at its virtual time, in the order the waits were made
    when due together, and one cancelled while waiting stays cancelled (its heap entry
    fires into nothing)."""
    loop = SimLoop()

    async def sleeper(name: str, delay: float, out: list[tuple[str, float]], bare: bool) -> None:
        await (loop.timer_future(delay) if bare else asyncio.sleep(delay))
        out.append((name, loop.time()))

    async def main() -> tuple[list[tuple[str, float]], bool]:
        out: list[tuple[str, float]] = []
        tasks = [asyncio.create_task(sleeper(f"{kind}{i}", 0.5 * (i % 2 + 1), out,
                                             kind == "f"))
                 for i in range(6) for kind in ("f", "s")]
        victim = asyncio.create_task(sleeper("gone", 0.7, out, True))
        await asyncio.sleep(0.1)
        victim.cancel()
        await asyncio.gather(*tasks)
        await asyncio.gather(victim, return_exceptions=True)
        return out, victim.cancelled()

    got, cancelled = loop.run_main(main())
    loop.shutdown()
    assert cancelled
    made = [(f"{kind}{i}", 0.5 * (i % 2 + 1)) for i in range(6) for kind in ("f", "s")]
    assert got == sorted(made, key=lambda nt: nt[1])  # (sorted() is stable: made order kept)


def test_yield_now_gives_every_ready_callback_a_turn_as_sleep_0_does() -> None:
    from pybk.runtime.eventloop import yield_now

    async def steps(name: str, out: list[str], bare: bool) -> None:
        for i in range(3):
            out.append(f"{name}{i}")
            await (yield_now if bare else asyncio.sleep(0))

    async def main() -> list[str]:
        out: list[str] = []
        await asyncio.gather(steps("a", out, True), steps("b", out, False),
                             steps("c", out, True))
        return out

    loop = SimLoop()
    got = loop.run_main(main())
    loop.shutdown()
    assert got == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]
    assert asyncio.run(main()) == got  # (the same on asyncio's own loop)
