"""The immediate LAC (``ClientConfig.immediate_lac``): an acknowledged entry reaches tailing
readers of another client within a round trip, the last one before the writer goes quiet
included, at the cost of one small message per bookie when nothing else carries the LAC.

In virtual time (the ``sim_cluster`` fixture: messages counted exactly, latencies exact) and
in process on real time (``mem_cluster``) through each reader: ``tail()``, the long poll, a log
reader. The explicit-LAC timer is set far out of reach (60 s) so only the immediate LAC can
explain a prompt answer.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pybk.client.context import ClientConfig
from pybk.wire import AddBatchRequest, WriteLacRequest

from .conftest import mem_cluster, until

PW = b"pw"
#: the periodic explicit LAC out of reach: what is seen promptly, the immediate LAC told
SLOW_TICK = ClientConfig(explicit_lac_interval=60.0, speculative_read_delay=0.0,
                         long_poll_timeout=30.0)


def _count(cluster: Any, kind: type) -> list[int]:
    """A one-element counter of the requests of ``kind`` the writer "w" sends."""
    n = [0]

    def watch(src: str, _bookie: str, request: Any) -> None:
        if src == "w" and isinstance(request, kind):
            n[0] += 1

    cluster.network.send_observers.append(watch)
    return n


async def _follow(cluster: Any, ledger_id: int, seen: dict[int, float],
                  config: ClientConfig = SLOW_TICK) -> asyncio.Task[None]:
    rh = await cluster.client("r", config).open_ledger(ledger_id, password=PW,
                                                       recovery=False)
    loop = asyncio.get_running_loop()

    async def run() -> None:
        async for entry in rh.tail(0):
            seen[entry.entry_id] = loop.time()

    return asyncio.ensure_future(run())


@pytest.mark.parametrize("pause", [0.0, 0.001, 0.1])
def test_every_entry_reaches_a_tailing_reader_within_a_round_trip(
        sim_cluster: Any, pause: float) -> None:
    async def scenario(cluster: Any) -> tuple[list[float], int, int]:
        lh = await cluster.client("w", SLOW_TICK).create_ledger(3, 3, 2, password=PW)
        seen: dict[int, float] = {}
        follower = await _follow(cluster, lh.id, seen)
        lacs = _count(cluster, WriteLacRequest)
        adds = _count(cluster, AddBatchRequest)
        loop = asyncio.get_running_loop()
        acked: dict[int, float] = {}
        for i in range(30):
            eid = await lh.append(b"e%d" % i)
            acked[eid] = loop.time()
            if pause:
                await asyncio.sleep(pause)
        await until(lambda: len(seen) == 30, timeout=5.0)  # 5 s: far below the 60 s tick
        follower.cancel()
        delays = [seen[e] - acked[e] for e in sorted(acked)]
        return delays, lacs[0], adds[0]

    delays, lacs, adds = sim_cluster.run(scenario)
    # one network round trip at most (the simulated latencies: 0.5 ms + exponential, 2 ms mean)
    assert max(delays) < 0.05, delays
    assert adds == 90
    if pause:  # one LAC message per bookie and entry: nothing else would carry it
        assert lacs == 90
    else:  # at saturation the next add carries it: only the last entry's LAC is sent
        assert lacs == 3


def test_without_the_immediate_lac_the_last_entry_waits_for_the_tick(sim_cluster: Any) -> None:
    async def scenario(cluster: Any) -> tuple[float, int]:
        config = ClientConfig(explicit_lac_interval=1.0, immediate_lac=False)
        lh = await cluster.client("w", config).create_ledger(3, 3, 2, password=PW)
        seen: dict[int, float] = {}
        follower = await _follow(cluster, lh.id, seen)
        lacs = _count(cluster, WriteLacRequest)
        loop = asyncio.get_running_loop()
        for i in range(5):
            await lh.append(b"e%d" % i)
        acked = loop.time()
        await until(lambda: 4 in seen, timeout=5.0)
        follower.cancel()
        return seen[4] - acked, lacs[0]

    delay, lacs = sim_cluster.run(scenario)
    assert delay > 0.5 and lacs == 3  # the periodic tick, once


def test_the_long_poll_is_answered_by_the_immediate_lac(sim_cluster: Any) -> None:
    async def scenario(cluster: Any) -> float:
        lh = await cluster.client("w", SLOW_TICK).create_ledger(3, 2, 2, password=PW)
        await lh.append(b"e0")
        rh = await cluster.client("r", SLOW_TICK).open_ledger(lh.id, password=PW,
                                                              recovery=False)
        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(1, timeout=30.0))
        await asyncio.sleep(0.1)
        assert not poll.done()
        loop = asyncio.get_running_loop()
        await lh.append(b"e1")  # the writer then goes quiet
        acked = loop.time()
        entry = await asyncio.wait_for(poll, 5.0)
        assert entry is not None and (entry.entry_id, entry.data) == (1, b"e1")
        return loop.time() - acked

    assert sim_cluster.run(scenario) < 0.05


def test_a_writer_crash_right_after_an_immediate_lac_recovers_what_readers_saw(
        sim_cluster: Any) -> None:
    """The writer's client dies (every link cut) once its last LAC went out; recovery closes
    the ledger at or past everything a reader saw, with the same bytes."""

    async def scenario(cluster: Any) -> None:
        lh = await cluster.client("w", SLOW_TICK).create_ledger(3, 3, 2, password=PW)
        seen: dict[int, float] = {}
        rh = await cluster.client("r", SLOW_TICK).open_ledger(lh.id, password=PW,
                                                              recovery=False)
        got: list[bytes] = []

        async def run() -> None:
            async for entry in rh.tail(0):
                got.append(entry.data)
                seen[entry.entry_id] = 0.0

        follower = asyncio.ensure_future(run())
        lacs = _count(cluster, WriteLacRequest)
        for i in range(7):
            await lh.append(b"e%d" % i)
        await until(lambda: lacs[0] == 3, timeout=5.0)
        for bookie in lh.metadata.last_ensemble:  # the writer is gone
            cluster.network.block("w", bookie)
        await until(lambda: len(seen) == 7, timeout=5.0)
        follower.cancel()
        recovered = await cluster.client("x").open_ledger(lh.id, password=PW, recovery=True)
        assert recovered.last_add_confirmed == 6
        assert [e.data for e in await recovered.read(0, 6)] == got

    sim_cluster.run(scenario)


# -- in process, real time ---------------------------------------------------------------------

async def test_tail_and_log_reader_see_a_quiet_writers_last_record_in_process() -> None:
    async with mem_cluster(3, client_config=SLOW_TICK) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        got: list[bytes] = []

        async def follow() -> None:
            async for entry in rh.tail(0):
                got.append(entry.data)

        follower = asyncio.ensure_future(follow())
        for i in range(3):
            await lh.append(b"t%d" % i)
        await until(lambda: len(got) == 3, timeout=5.0)  # far below the 60 s tick
        follower.cancel()
        assert got == [b"t0", b"t1", b"t2"]

        log = await cluster.client().namespace().create_log("l")
        async with await log.writer() as w:
            reader = log.reader()
            nxt = asyncio.ensure_future(reader.__anext__())
            p = await w.append(b"only one")
            rec = await asyncio.wait_for(nxt, 5.0)
            assert (rec.position, rec.data) == (p, b"only one")
            await reader.aclose()


def test_immediate_lac_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="immediate_lac must be a bool"):
        ClientConfig(immediate_lac=1)  # type: ignore[arg-type]
