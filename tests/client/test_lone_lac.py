"""A lone writer's LAC (issue 41): a caller that appends again as soon as its record is
acknowledged carries the LAC on that add, through the log writer too, so no WriteLac goes
out but the last; ``immediate_lac_delay`` waits a time instead of three loop passes (the
synchronous WAL's caller comes back from another thread). In virtual time, messages counted
exactly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pybk.client.context import ClientConfig
from pybk.wire import AddBatchRequest, WriteLacRequest

from .conftest import until

PW = b"pw"
SLOW_TICK = ClientConfig(explicit_lac_interval=60.0, speculative_read_delay=0.0,
                         long_poll_timeout=30.0)


def _count(cluster: Any, kind: type) -> list[int]:
    n = [0]

    def watch(src: str, _bookie: str, request: Any) -> None:
        if src == "w" and isinstance(request, kind):
            n[0] += 1

    cluster.network.send_observers.append(watch)
    return n


@pytest.mark.parametrize("now", [False, True])
def test_a_log_writers_lone_records_carry_the_lac_and_send_none_but_the_last(
        sim_cluster: Any, now: bool) -> None:
    async def scenario(cluster: Any) -> tuple[int, int, int, list[bytes]]:
        ns = cluster.client("w", SLOW_TICK).namespace()
        log = await ns.create_log("lone", ensemble_size=3, write_quorum=3, ack_quorum=2)
        w = await log.writer()
        lacs = _count(cluster, WriteLacRequest)
        adds = _count(cluster, AddBatchRequest)
        for i in range(20):
            await (w.append_now(b"r%d" % i) if now else w.append(b"r%d" % i))
        await until(lambda: lacs[0] == 3, timeout=5.0)  # the last record's, once per bookie
        reader = cluster.client("r", SLOW_TICK).namespace().open_log
        got = []
        async with (await reader("lone")).reader(stop_at=w.last_position) as rd:
            async for rec in rd:
                got.append(rec.data)
        sent_alone = w.stats["lone_sends"]
        await w.close()
        return lacs[0], adds[0], sent_alone, got

    lacs, adds, sent_alone, got = sim_cluster.run(scenario)
    assert lacs == 3 and adds == 60  # no WriteLac per record: each next add carried the LAC
    assert sent_alone == (20 if now else 0)
    assert got == [b"r%d" % i for i in range(20)]


def test_a_delayed_immediate_lac_waits_for_the_next_add_then_goes_out(sim_cluster: Any) -> None:
    async def scenario(cluster: Any) -> tuple[int, float]:
        config = ClientConfig(explicit_lac_interval=60.0, immediate_lac_delay=0.05)
        lh = await cluster.client("w", config).create_ledger(3, 3, 2, password=PW)
        lacs = _count(cluster, WriteLacRequest)
        loop = asyncio.get_running_loop()
        for i in range(10):  # a pause shorter than the delay: the next add carries the LAC
            await lh.append(b"e%d" % i)
            await asyncio.sleep(0.01)
        assert lacs[0] == 0
        acked = loop.time()
        await until(lambda: lacs[0] == 3, timeout=5.0)
        return lacs[0], loop.time() - acked

    lacs, after = sim_cluster.run(scenario)
    assert lacs == 3 and 0.03 <= after < 0.1  # the last one's, the delay after its ack


def test_a_negative_immediate_lac_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="immediate_lac_delay must be >= 0"):
        ClientConfig(immediate_lac_delay=-0.001)
