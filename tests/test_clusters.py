"""Every cluster has one shape (pybk.clusters): the same scenario runs on each of them.

The scenario writes a ledger that tolerates one lost bookie, crash-stops a bookie of its
ensemble, reads everything back, restarts the bookie and writes again: on in-process bookies
(async and sync), on ``pybk bookie`` processes, and on the simulator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import pybk
from pybk.clusters import AsyncCluster, Cluster
from pybk.server.cluster import ProcessCluster
from pybk.server.processes import pid_alive
from pybk.testing.simulated import SimTestCluster

PAYLOADS = [f"entry-{i}".encode() for i in range(20)]


async def async_scenario(cluster: Any) -> list[bytes]:
    assert isinstance(cluster, AsyncCluster)
    client = cluster.client()
    lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    await lh.append_many(PAYLOADS)
    victim = next(iter(lh.metadata.ensembles.values()))[0]
    await cluster.stop_bookie(victim)
    await lh.close()
    rh = await client.open_ledger(lh.id)
    got = [e.data for e in await rh.read(0, rh.last_add_confirmed)]
    await cluster.start_bookie(victim)
    lh2 = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    await lh2.append(b"after the restart")
    return got


def sync_scenario(cluster: Any) -> list[bytes]:
    assert isinstance(cluster, Cluster)
    client = cluster.client()
    lh = client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    lh.append_many(PAYLOADS)
    victim = next(iter(lh.metadata.ensembles.values()))[0]
    cluster.stop_bookie(victim)
    lh.close()
    rh = client.open_ledger(lh.id)
    got = [e.data for e in rh.read(0, rh.last_add_confirmed)]
    cluster.start_bookie(victim)
    lh2 = client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    lh2.append(b"after the restart")
    return got


async def test_local_cluster(tmp_path: Path) -> None:
    async with pybk.LocalCluster(tmp_path, bookies=3) as cluster:
        assert await async_scenario(cluster) == PAYLOADS


def test_sync_local_cluster(tmp_path: Path) -> None:
    with pybk.sync.LocalCluster(tmp_path, bookies=3) as cluster:
        assert sync_scenario(cluster) == PAYLOADS


def test_sim_cluster() -> None:
    assert SimTestCluster(seed=3).run(async_scenario) == PAYLOADS


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_process_cluster(tmp_path: Path) -> None:
    cluster = ProcessCluster(tmp_path, bookies=3)
    with cluster:
        pids = [cluster.pid(b) for b in cluster.bookie_ids]
        assert (tmp_path / "cluster.json").exists()
        assert sync_scenario(cluster) == PAYLOADS
        pids = [cluster.pid(b) for b in cluster.bookie_ids]
    assert not any(pid_alive(p) for p in pids)
    assert not (tmp_path / "cluster.json").exists()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_second_process_cluster_on_a_running_root_is_refused(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path, bookies=1) as first:
        with pytest.raises(RuntimeError, match="already running"):
            ProcessCluster(tmp_path, bookies=1).start()
        assert pid_alive(first.pid("bookie-1"))


def test_process_cluster_refuses_bad_bookie_lists(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ProcessCluster(tmp_path, bookies=["a", "a"])
    with pytest.raises(ValueError):
        ProcessCluster(tmp_path, bookies=[])
    with pytest.raises(ValueError, match="bad/id"):
        ProcessCluster(tmp_path, bookies=["bad/id"])
