"""LocalCluster on the real disk with SQLite metadata, pybk.Client by URI, and pybk.sync."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

import pybk
from pybk.errors import BookieStateError, LedgerFencedError


async def test_local_cluster_on_disk(tmp_path: pathlib.Path) -> None:
    async with pybk.LocalCluster(tmp_path, bookies=3) as cluster:
        assert cluster.bookie_ids == ["bookie-0", "bookie-1", "bookie-2"]
        assert all(cluster.bookie_dir(b).is_dir() for b in cluster.bookie_ids)
        assert (tmp_path / "metadata.db").exists()
        client = cluster.client()
        lh = await client.create_ledger(3, 2, 2)
        assert await lh.append_many([b"a", b"b", b"c"]) == [0, 1, 2]

        # crash one ensemble bookie mid-stream; a fourth takes its place
        victim = lh.metadata.ensembles[0][0]
        spare = await cluster.add_bookie()
        await cluster.stop_bookie(victim)
        with pytest.raises(BookieStateError):
            await cluster.stop_bookie(victim)
        assert await lh.append(b"d") == 3
        ensembles = (await client.ledger_metadata(lh.id)).ensembles
        assert len(ensembles) == 2 and spare in ensembles[max(ensembles)]
        assert victim not in ensembles[max(ensembles)]

        # another client in this process reaches the same bookies through the cluster's
        # in-process transport; without it, the registry names no network address
        uri = f"sqlite:///{tmp_path}/metadata.db"
        async with pybk.Client(metadata=uri) as stranger:
            with pytest.raises(pybk.BKError, match=r"cluster\.client"):
                await stranger.open_ledger(lh.id, recovery=False)
        async with pybk.Client(metadata=uri, transport=cluster.transport) as other:
            rh = await other.open_ledger(lh.id, recovery=True)
            assert [e.data for e in await rh.read(0, 3)] == [b"a", b"b", b"c", b"d"]
        with pytest.raises(LedgerFencedError):
            await lh.append(b"late")

        # restart the crashed bookie on its directory: it still holds its entries
        await cluster.start_bookie(victim)
        resp = await cluster.bookie(victim).handle(pybk.wire.ListEntriesRequest(lh.id))
        assert resp.ranges and resp.ranges[0][0] == 0


async def test_reopen_cluster_keeps_data(tmp_path: pathlib.Path) -> None:
    async with pybk.LocalCluster(tmp_path, bookies=3) as cluster:
        lh = await cluster.client().create_ledger()
        await lh.append_many([b"kept-%d" % i for i in range(5)])
        await lh.close()
        ledger_id = lh.id
    async with pybk.LocalCluster(tmp_path, bookies=3) as cluster:
        rh = await cluster.client().open_ledger(ledger_id)
        assert [e.data for e in await rh.read(0, 4)] == [b"kept-%d" % i for i in range(5)]


def test_sync_api(tmp_path: pathlib.Path) -> None:
    with pybk.sync.LocalCluster(tmp_path, bookies=3) as c:
        client = c.client()
        lh = client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        assert lh.append(b"x") == 0
        assert lh.append_async(b"y").result(timeout=30) == 1
        assert lh.append_many([b"z"]) == [2]
        lh.close()
        rh = c.client().open_ledger(lh.id)
        assert [e.data for e in rh.read(0, 2)] == [b"x", b"y", b"z"]
        assert [e.data for e in rh.tail(1)] == [b"y", b"z"]
        assert client.list_ledgers() == [lh.id]


def test_client_without_transport_needs_tcp_or_cluster() -> None:
    async def main() -> None:
        client = pybk.Client(metadata="memory://")
        store = client.store  # builds the TCP transport (no LocalCluster uses this URI)
        assert store is not None
        assert type(client.transport).__name__ == "TcpTransport"
        await client.close()

    asyncio.run(main())


async def test_read_only_bookie_is_registered_read_only_and_avoided() -> None:
    from pybk.bookie import BookieConfig
    from pybk.storage.memfs import MemFileSystem

    fs = MemFileSystem(capacity=4 << 20)
    config = BookieConfig(disk_usage_threshold=0.5, disk_usage_low_water=0.4,
                          disk_check_interval=0)
    async with pybk.LocalCluster("/ro", bookies=4, metadata="memory://", fs=fs,
                                 bookie_config=config) as cluster:
        client = cluster.client()
        lh = await client.create_ledger(3, 3, 3)
        full = lh.metadata.ensembles[0][0]
        fs.open_append("/filler").write(b"\0" * (3 << 20))  # the disk fills up
        assert cluster.bookie(full).check_disk() == "read-only"
        store = cluster.store

        async def read_only() -> list[str]:
            return await store.read_only_bookies()

        deadline = asyncio.get_running_loop().time() + 5
        while await read_only() != [full]:
            assert asyncio.get_running_loop().time() < deadline, "registration never flipped"
            await asyncio.sleep(0.001)
        assert full not in await store.writable_bookies()
        # the writer's next add is refused by the read-only bookie: ensemble change
        assert await lh.append(b"x") == 0
        assert full not in (await client.ledger_metadata(lh.id)).ensembles[0]


async def test_a_full_disk_is_named_when_no_bookie_can_take_a_ledger() -> None:
    """A machine whose disk is past the watermark: the error says the bookies are read-only
    and why, not only that none is writable (CI's disk once filled to 95%)."""
    from pybk.bookie import BookieConfig
    from pybk.storage.memfs import MemFileSystem

    fs = MemFileSystem(capacity=4 << 20)
    fs.open_append("/filler").write(b"\0" * (3 << 20))  # 75% used before any bookie starts
    config = BookieConfig(disk_usage_threshold=0.5, disk_usage_low_water=0.4)
    async with pybk.LocalCluster("/full", bookies=3, metadata="memory://", fs=fs,
                                 bookie_config=config) as cluster:
        with pytest.raises(pybk.NotEnoughBookiesError) as caught:
            await cluster.client().create_ledger(3, 2, 2)
    message = str(caught.value)
    assert "have 0" in message
    assert "read-only: ['bookie-0', 'bookie-1', 'bookie-2']" in message
    assert "disk_usage_threshold" in message


def test_sync_client_by_uri(tmp_path: pathlib.Path) -> None:
    uri = f"sqlite:///{tmp_path}/meta.db"
    with pybk.sync.Client(uri) as client:  # no cluster here: a TCP client (nothing to reach)
        assert client.list_ledgers() == []
        with pytest.raises(pybk.NotEnoughBookiesError, match="no bookie is registered"):
            client.create_ledger()
