"""The pytest fixtures users get from pybk's plugin."""

from __future__ import annotations

import asyncio
from typing import Any

import pybk
from pybk.sim.cluster import SimCluster
from pybk.testing.simulated import SimTestCluster


def test_sim_cluster_runs_a_user_scenario_with_faults(sim_cluster: SimTestCluster,
                                                      pybk_seed: int) -> None:
    assert sim_cluster.seed == pybk_seed

    async def scenario(cluster: SimCluster) -> tuple[int, list[bytes], float]:
        client = cluster.client("app")
        lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        await lh.append(b"before")
        await cluster.crash_bookie("b0", "torn")
        await lh.append(b"after")  # ensemble change around the dead bookie, or its peers
        await asyncio.sleep(3600)  # an hour of virtual time costs nothing
        await lh.close()
        rh = await client.open_ledger(lh.id, recovery=False)
        entries = await rh.read(0, rh.last_add_confirmed)
        return lh.id, [e.data for e in entries], asyncio.get_running_loop().time()

    lid, data, t = sim_cluster.with_options(bookies=4).run(scenario)
    assert data == [b"before", b"after"]
    assert t >= 3600
    # Deterministic: the same seed gives the same run, to the last virtual nanosecond.
    again = sim_cluster.with_options(bookies=4)
    assert again.run(scenario) == (lid, data, t)


def test_sim_cluster_surfaces_scenario_errors(sim_cluster: SimTestCluster) -> None:
    async def scenario(cluster: SimCluster) -> None:
        client = cluster.client("app")
        for b in cluster.bookie_ids:
            await cluster.crash_bookie(b)
        await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)

    try:
        sim_cluster.run(scenario)
    except pybk.BKError as exc:
        assert "bookies" in str(exc).lower()
    else:
        raise AssertionError("creating a ledger with every bookie down must fail")


async def test_local_cluster_fixture(local_cluster: Any) -> None:
    async with local_cluster(bookies=3) as cluster:
        client = cluster.client()
        lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        assert await lh.append(b"x") == 0
        await lh.close()
