"""transport.deadlines.Deadlines, the one timeout mechanism of every transport, on virtual
time: any mix of timeouts, adds, discards and closes; each request expires exactly once, at
or after its deadline and no later than the timer's next firing, unless it was discarded."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.sim.loop import SimLoop
from pybk.transport.deadlines import Deadlines

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from([0.0, 0.1, 0.5, 2.0, 10.0])),
        st.tuples(st.just("discard"), st.integers(0, 30)),
        st.tuples(st.just("wait"), st.sampled_from([0.0, 0.05, 0.3, 1.0, 5.0])),
    ),
    max_size=60,
)


@given(STEPS)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_each_request_expires_once_on_time_unless_discarded(steps: list[tuple[str, float]]
                                                            ) -> None:
    loop = SimLoop(max_time=1e6)

    async def main() -> None:
        d = Deadlines()
        due: dict[int, float] = {}
        fired: dict[int, list[float]] = {}
        discarded: set[int] = set()
        tokens: list[int] = []

        def expire(key: int) -> None:
            fired.setdefault(key, []).append(loop.time())

        for kind, arg in steps:
            if kind == "add":
                key = len(tokens)
                tokens.append(d.add(arg, lambda key=key: expire(key)))
                due[key] = loop.time() + arg
            elif kind == "discard" and tokens:
                key = int(arg) % len(tokens)
                d.discard(tokens[key])
                if key not in fired:
                    discarded.add(key)
            else:
                await asyncio_sleep(arg)
            d._check()
        await asyncio_sleep(20.0)
        d._check()
        assert len(d) == 0
        for key, at in due.items():
            if key in discarded:
                assert key not in fired, "a discarded request expired"
                continue
            assert len(fired.get(key, [])) == 1, (key, fired.get(key))
            assert fired[key][0] >= at - 1e-9, "expired before its deadline"
            assert fired[key][0] <= at + 1e-9, "the timer was armed late"

    loop.run_main(main())
    assert not loop.live_tasks()
    loop.close()  # (nothing left to finalize: shutdown's full collection, in the suite's big
    #              heap, costs about a second an example)


async def asyncio_sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


def test_close_forgets_everything() -> None:
    loop = SimLoop(max_time=100.0)

    async def main() -> None:
        d = Deadlines()
        fired: list[int] = []
        for i in range(5):
            d.add(0.1 * i, lambda i=i: fired.append(i))
        d.close()
        await asyncio_sleep(1.0)
        assert fired == [] and len(d) == 0
        d.add(0.1, lambda: fired.append(9))  # usable again
        await asyncio_sleep(1.0)
        assert fired == [9]

    loop.run_main(main())
    loop.shutdown()
