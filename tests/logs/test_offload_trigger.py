"""Offload by itself (pybk.logs.offload_trigger): a writer keeps at most the threshold's
bytes of completed segments on the bookies and sends older ones to the tier, and segments
completed longer ago than the age threshold, while it appends; readers see every record."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from logs_kit import mem_cluster

from pybk.logs import BOOKIES, COMPLETED, OFFLOADED, LogConfig, LogMetadata, SegmentInfo
from pybk.logs.offload_trigger import plan_offload
from pybk.logs.position import Position

pytest.importorskip("fsspec")
pytestmark = pytest.mark.timeout(60)


def _md(**knobs: object) -> LogMetadata:
    segs = tuple(SegmentInfo(seq, 100 + seq, COMPLETED, last_entry=1, last_slot=0, records=2,
                             bytes=100, mtime_ms=seq * 10_000) for seq in range(1, 5))
    cfg = LogConfig(offload_url="file:///tmp/tier", **knobs)  # type: ignore[arg-type]
    return LogMetadata("default", "l", cfg, segments=(*segs, SegmentInfo(5, 105)))


def test_the_plan_keeps_the_threshold_on_the_bookies_and_sends_the_old() -> None:
    assert plan_offload(_md(), 50_000) is None  # no threshold: by hand only
    assert plan_offload(_md(offload_threshold_bytes=250), 50_000) == Position(3, 0, 0)
    assert plan_offload(_md(offload_threshold_bytes=400), 50_000) is None
    assert plan_offload(_md(offload_threshold_seconds=25.0), 50_000) == Position(3, 0, 0)
    both = _md(offload_threshold_bytes=400, offload_threshold_seconds=15.0)
    assert plan_offload(both, 50_000) == Position(4, 0, 0)
    with pytest.raises(ValueError, match="offload_threshold_bytes"):
        LogConfig(offload_threshold_bytes=0)
    cfg = _md(offload_threshold_bytes=250).config
    assert LogConfig.from_doc(cfg.to_doc()) == cfg


async def test_a_writer_offloads_beyond_the_threshold_while_it_appends(tmp_path: Path) -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        await log.set_offload(f"file://{tmp_path}", deletion_lag=0, threshold_bytes=300)
        async with await log.writer(housekeeping_interval=None) as w:
            positions = [await w.append(b"record-%03d" % i) for i in range(20)]

            async def settled() -> bool:
                segs = [s for s in await log.segments() if s.state == COMPLETED]
                on_bookies = sum(s.bytes for s in segs if s.tier == BOOKIES)
                return on_bookies <= 300 and any(s.tier == OFFLOADED for s in segs)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while not await settled():
                assert loop.time() < deadline, await log.segments()
                await asyncio.sleep(0.02)
        tiers = [s.tier for s in await log.segments() if s.state == COMPLETED]
        assert tiers[0] == OFFLOADED and tiers[-1] == BOOKIES, tiers  # oldest first
        async with log.reader(stop_at=positions[-1]) as r:
            got = [rec.data async for rec in r]
        assert got == [b"record-%03d" % i for i in range(20)]


async def test_a_tenancy_namespace_gives_its_new_logs_a_tier_that_offloads_by_itself(
        tmp_path: Path) -> None:
    from pybk.metadata.tenancy import NamespacePolicies

    async with mem_cluster() as cluster:
        admin = cluster.client().admin()
        await admin.create_tenant("acme")
        await admin.create_namespace("acme/events", policies=NamespacePolicies(
            roll_entries=2, offload_url=f"file://{tmp_path}", offload_deletion_lag=0,
            offload_threshold_bytes=300))
        ns = cluster.client().namespace("acme/events")
        log = await ns.create_log("a")  # no set_offload: the namespace's policy
        cfg = (await log.metadata()).config
        assert (cfg.offload_url, cfg.offload_threshold_bytes, cfg.offload_deletion_lag) == (
            f"file://{tmp_path}", 300, 0)
        own = await ns.create_log("b", offload_threshold_seconds=60.0)
        cfg = (await own.metadata()).config  # a knob given wins; the rest still inherits
        assert (cfg.offload_threshold_seconds, cfg.offload_threshold_bytes) == (60.0, 300)
        async with await log.writer(housekeeping_interval=None) as w:
            positions = [await w.append(b"record-%03d" % i) for i in range(20)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while not any(s.tier == OFFLOADED for s in await log.segments()):
                assert loop.time() < deadline, await log.segments()
                await asyncio.sleep(0.02)
        async with log.reader(stop_at=positions[-1]) as r:
            assert [rec.data async for rec in r] == [b"record-%03d" % i for i in range(20)]


def test_namespace_offload_policies_are_checked() -> None:
    from pybk.metadata.tenancy import NamespacePolicies

    with pytest.raises(ValueError, match="offload_url"):
        NamespacePolicies(offload_url="/no/scheme")
    with pytest.raises(ValueError, match="need an offload_url"):
        NamespacePolicies(offload_threshold_bytes=100)
    with pytest.raises(ValueError, match="offload_options"):
        NamespacePolicies(offload_url="file:///t", offload_options={"x": object()})
    with pytest.raises(ValueError, match="offload_deletion_lag"):
        NamespacePolicies(offload_url="file:///t", offload_deletion_lag=-1)
    kept = NamespacePolicies(offload_url="s3://b/p", offload_options={"endpoint_url": "u"},
                             offload_threshold_seconds=30.0)
    assert NamespacePolicies.from_dict(kept.to_dict()) == kept


async def test_an_offload_reads_no_faster_than_its_throttle(tmp_path: Path) -> None:
    """400 records of 100 bytes in one segment, read 100 entries at a time at 40,000 bytes a
    second: the last read may start only once 30,000 bytes were due (0.75 s)."""
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace()
        timed: dict[str, float] = {}
        for name, rate in (("fast", None), ("slow", 40_000)):
            log = await ns.create_log(name, roll_bytes=None, offload_url=f"file://{tmp_path}",
                                      offload_bytes_per_s=rate)
            w = await log.writer()
            async with w:
                for i in range(400):
                    await w.append(b"%0100d" % i)
            assert (await log.metadata()).config.offload_bytes_per_s == rate
            loop = asyncio.get_running_loop()
            start = loop.time()
            assert len(await log.offload()) == 1
            timed[name] = loop.time() - start
        assert timed["slow"] >= 0.75, timed
        assert timed["fast"] < timed["slow"], timed
    with pytest.raises(ValueError, match="offload_bytes_per_s"):
        LogConfig(offload_bytes_per_s=0)
