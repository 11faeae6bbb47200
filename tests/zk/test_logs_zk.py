"""Logs on ZooKeeper metadata: the same namespace, writer, takeover and reader behaviour as on
the other backends, with a real ZooKeeper server (in-process bookies on a MemFileSystem)."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from pybk import LedgerFencedError, LogExistsError, Position
from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.storage.memfs import MemFileSystem
from pybk.testing.zookeeper import ZooKeeperServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def test_a_log_on_zookeeper(zk_server: ZooKeeperServer) -> None:
    uri = f"zk://{zk_server.hosts}/logs-{uuid.uuid4().hex[:8]}"
    config = ClientConfig(add_timeout=5.0, read_timeout=5.0, speculative_read_delay=0.0)
    async with LocalCluster("/c", 3, fs=MemFileSystem(), metadata=uri, rng=random.Random(2),
                            client_config=config) as cluster:
        ns = cluster.client().namespace("zk")
        log = await ns.create_log("events", roll_entries=2, compression="zstd")
        with pytest.raises(LogExistsError):
            await ns.create_log("events")
        assert await ns.list_logs() == ["events"]
        tail: list[bytes] = []

        async def follow() -> None:
            async for rec in log.reader():
                tail.append(rec.data)

        task = asyncio.ensure_future(follow())
        old = await log.writer()
        acked = [await old.append(b"a%d" % i) for i in range(5)]
        new = await log.writer()  # takes over through ZooKeeper CAS and fences the old one
        with pytest.raises(LedgerFencedError):
            await asyncio.wait_for(old.append(b"late"), 30)
        mine = await new.append_many([b"b0", b"b1"])
        assert mine[0] > acked[-1]
        await new.truncate(acked[2])
        await new.mark_end_of_stream()
        await asyncio.wait_for(task, 30)
        assert tail == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b0", b"b1"]
        got = [r.data async for r in log.reader(stop_at=mine[-1])]
        assert got == [b"a2", b"a3", b"a4", b"b0", b"b1"]
        assert await log.first_position() == acked[2]
        assert await log.last_position() == mine[-1] != Position(1, 0, 0)
        await old.close()
        await ns.delete_log("events")
        assert await ns.list_logs() == []
