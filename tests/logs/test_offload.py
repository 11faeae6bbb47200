"""Tiered storage: closed segments offloaded (file:// and a real S3-compatible server),
verified before the bookies' copy goes (after the deletion lag), read back transparently by
readers and cursors, deleted with retention; half-finished uploads never taken for complete
ones; orphans swept."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from logs_kit import mem_cluster
from tier_kit import moto_server

from pybk import NoSuchLedgerError
from pybk.errors import CorruptRecordError
from pybk.logs import BOOKIES, BOTH, OFFLOADED

pytest.importorskip("fsspec")
pytestmark = pytest.mark.timeout(120)


async def _fill(log, n=9):  # type: ignore[no-untyped-def]
    async with await log.writer() as w:
        return [await w.append(b"rec-%d" % i) for i in range(n)]


async def _read_all(log, stop):  # type: ignore[no-untyped-def]
    async with log.reader(stop_at=stop) as r:
        return [(rec.position, rec.data) async for rec in r]


async def _offload_and_read(client, url: str, options: dict) -> None:  # type: ignore[no-untyped-def,type-arg]
    log = await client.namespace().create_log("l", roll_entries=3)
    positions = await _fill(log)
    before = await _read_all(log, positions[-1])
    await log.set_offload(url, options=options, deletion_lag=0)
    done = await log.offload()
    assert done == [1, 2, 3]
    segs = await log.segments()
    assert [s.tier for s in segs] == [OFFLOADED] * 3
    for s in segs:
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(s.ledger_id, recovery=False)
    assert await _read_all(log, positions[-1]) == before
    cur = await log.subscribe("c")
    got = [await asyncio.wait_for(cur.receive(), 10) for _ in range(9)]
    assert [(r.position, r.data) for r in got] == before
    await cur.close()
    # retention drops objects with the segments
    await log.truncate(positions[6])
    assert [s.seq for s in await log.segments()] == [3]
    assert len(await log.sweep_tier()) == 0


async def test_offload_to_a_local_folder(tmp_path: Path) -> None:
    async with mem_cluster() as cluster:
        await _offload_and_read(cluster.client(), f"file://{tmp_path}/tier", {})
        files = sorted(p.name for p in (tmp_path / "tier" / "default" / "l").iterdir())
        assert len(files) == 2 and files[0].startswith("3-")  # segment 3's data and index


async def test_offload_to_s3_compatible_server(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    with moto_server() as endpoint:
        s3 = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        s3.mkdir("tier-bucket")
        async with mem_cluster() as cluster:
            await _offload_and_read(cluster.client(), "s3://tier-bucket/logs",
                                    {"endpoint_url": endpoint})
        s3.invalidate_cache()
        left = s3.find("tier-bucket/logs")
        assert len(left) == 2 and all("/3-" in k for k in left)
        from pybk.logs.tier_store import TierStore

        dated = TierStore("s3://tier-bucket/logs", {"endpoint_url": endpoint,
                                                    "skip_instance_cache": True}
                          ).list_objects("default", "l")
        assert sorted(n for n, _ in dated) == sorted(left)  # dated by S3's LastModified
        assert all(abs(t - time.time()) < 600 for _, t in dated)


async def test_the_bookies_copy_stays_for_the_deletion_lag(tmp_path: Path) -> None:
    now = [1000.0]
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace(clock=lambda: now[0]).create_log("l", roll_entries=3)
        positions = await _fill(log, 3)
        await log.set_offload(f"file://{tmp_path}", deletion_lag=60)
        assert await log.offload() == [1]
        (seg,) = await log.segments()
        assert seg.tier == BOTH
        await client.open_ledger(seg.ledger_id, recovery=False)  # still there
        await log.apply_retention()
        assert (await log.segments())[0].tier == BOTH
        now[0] += 61
        w = await log.writer(housekeeping_interval=0.02)  # the writer's housekeeping does it
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while (await log.segments())[0].tier != OFFLOADED:
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(seg.ledger_id, recovery=False)
        assert [d for _, d in await _read_all(log, positions[-1])] == [b"rec-0", b"rec-1",
                                                                        b"rec-2"]
        await w.close()


async def test_a_damaged_upload_is_never_complete_and_orphans_are_swept(tmp_path: Path) -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l", roll_entries=3)
        positions = await _fill(log, 3)
        await log.set_offload(f"file://{tmp_path}", deletion_lag=0)
        folder = tmp_path / "default" / "l"
        folder.mkdir(parents=True)
        (folder / "1-99-dead.data").write_bytes(b"half an upload")  # a crashed attempt
        from pybk.logs import tier_store

        real = tier_store.TierStore.write_data

        def torn(self, path, chunks):  # type: ignore[no-untyped-def]
            length, crc = real(self, path, chunks)
            with open(path + ".data", "r+b") as f:  # the object store lost a byte
                f.truncate(length - 1)
            return length, crc

        tier_store.TierStore.write_data = torn  # type: ignore[method-assign]
        try:
            with pytest.raises(CorruptRecordError):
                await log.offload()
        finally:
            tier_store.TierStore.write_data = real  # type: ignore[method-assign]
        (seg,) = await log.segments()
        assert seg.tier == BOOKIES and seg.offload is not None and not seg.offload.complete
        await client.open_ledger(seg.ledger_id, recovery=False)  # the bookies' copy stays
        assert sorted(p.name for p in folder.iterdir()) == ["1-99-dead.data"]
        assert await log.sweep_tier() == []  # younger than the default grace (an hour)
        with pytest.raises(ValueError):
            await log.sweep_tier(grace=-1.0)
        assert [b.rsplit("/", 1)[-1] for b in await log.sweep_tier(grace=0)] == ["1-99-dead"]
        assert await log.offload() == [1]  # a new attempt succeeds
        assert [d for _, d in await _read_all(log, positions[-1])] == [b"rec-0", b"rec-1",
                                                                        b"rec-2"]
        with pytest.raises(ValueError):
            await log.set_offload("not a url")


async def test_a_segment_whose_objects_are_gone_reads_as_a_deleted_ledger(tmp_path: Path) -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=3)
        positions = await _fill(log, 3)
        await log.set_offload(f"file://{tmp_path}", deletion_lag=0)
        assert await log.offload() == [1]
        for f in (tmp_path / "default" / "l").iterdir():  # (what a truncation under it does)
            f.unlink()
        with pytest.raises(NoSuchLedgerError):  # not FileNotFoundError: readers handle this
            await _read_all(log, positions[-1])


async def test_an_aborted_writer_stops_its_offload_as_a_dead_process_would(
        tmp_path: Path) -> None:
    from pybk.logs.tier_access import open_threaded_tier

    entered, release = asyncio.Event(), asyncio.Event()
    calls: list[str] = []

    class Gated:  # the production tier, its data uploads held until released
        def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
            self.inner = inner

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self.inner, name)

        async def write_data(self, path, chunks):  # type: ignore[no-untyped-def]
            calls.append("data")
            entered.set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                calls.append("cancelled")
                raise
            return await self.inner.write_data(path, chunks)

        async def write_index(self, path, index):  # type: ignore[no-untyped-def]
            calls.append("index")
            return await self.inner.write_index(path, index)

    async def opener(url, options):  # type: ignore[no-untyped-def]
        return Gated(await open_threaded_tier(url, options))

    async with mem_cluster() as cluster:
        log = await cluster.client().namespace(tiers=opener).create_log("l", roll_entries=2)
        await log.set_offload(f"file://{tmp_path}", threshold_bytes=1)
        w = await log.writer(housekeeping_interval=0.02)
        for i in range(4):
            await w.append(b"rec-%d" % i)
        await asyncio.wait_for(entered.wait(), 10)  # an offload is uploading
        await w.abort()
        release.set()
        for _ in range(20):  # (an offload left running would go on to its index now)
            await asyncio.sleep(0.01)
        assert calls == ["data", "cancelled"]
        assert not [f for _, _, files in os.walk(tmp_path) for f in files
                    if f.endswith(".index")]


async def test_two_offloaders_of_one_log_never_delete_a_completed_offload(
        tmp_path: Path) -> None:
    """B found A's attempt incomplete and deleted its objects before recording its own, while
    A completed in between: A's record said complete, its objects were gone, and the bookie
    copy went too (found by the simulator with the offload service beside the writer)."""
    from pybk.logs.tier_access import open_threaded_tier

    def gated(method: str, entered: asyncio.Event, release: asyncio.Event):  # type: ignore[no-untyped-def]
        class Gated:
            def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
                self.inner = inner

            def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
                return getattr(self.inner, name)

        async def held(self, *args):  # type: ignore[no-untyped-def]
            entered.set()
            await release.wait()
            return await getattr(self.inner, method)(*args)

        setattr(Gated, method, held)

        async def opener(url, options):  # type: ignore[no-untyped-def]
            return Gated(await open_threaded_tier(url, options))

        return opener

    a_in, a_go, b_in, b_go = (asyncio.Event() for _ in range(4))
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        async with await log.writer() as w:
            last = [await w.append(b"rec-%d" % i) for i in range(3)][-1]
        await log.set_offload(f"file://{tmp_path}", deletion_lag=0)
        log_a = await client.namespace(tiers=gated("write_data", a_in, a_go)).open_log("l")
        log_b = await client.namespace(tiers=gated("delete", b_in, b_go)).open_log("l")
        task_a = asyncio.ensure_future(log_a.offload())
        await asyncio.wait_for(a_in.wait(), 10)  # A recorded its attempt, is uploading
        task_b = asyncio.ensure_future(log_b.offload())
        await asyncio.wait_for(b_in.wait(), 10)  # B is about to delete A's objects
        a_go.set()
        await asyncio.wait([task_a], timeout=10)  # A finishes (completes, or is refused)
        b_go.set()
        await asyncio.wait_for(asyncio.gather(task_a, task_b, return_exceptions=True), 10)
        (seg,) = await log.segments()
        assert seg.tier in (BOTH, OFFLOADED) and seg.offload is not None
        async with log.reader(stop_at=last) as r:  # from the tier if the bookies' copy went
            assert [rec.data async for rec in r] == [b"rec-0", b"rec-1", b"rec-2"]
