"""Backlog quotas (pybk.logs.backlog): how far the slowest durable cursor is behind, and the
two policies past the quota: the writer refuses appends until the cursors catch up (and
then writes again by itself), or the oldest backlog is evicted and the cursors skip ahead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from logs_kit import mem_cluster
from prometheus_client import CollectorRegistry

from pybk import BacklogQuotaExceededError, Position, QuotaExceededError
from pybk.logs import COMPLETED, LogConfig, LogMetadata, SegmentInfo
from pybk.logs.backlog import measure_backlog, plan_eviction
from pybk.ops.backlog import BacklogCollector

pytestmark = pytest.mark.timeout(60)


def _md(**quota: Any) -> LogMetadata:
    """Four completed segments of 100 bytes (completed at 10, 20, 30 and 40 s) and one in
    progress."""
    segs = tuple(SegmentInfo(seq, 100 + seq, COMPLETED, last_entry=9, last_slot=0, records=10,
                             bytes=100, mtime_ms=seq * 10_000) for seq in range(1, 5))
    segs += (SegmentInfo(5, 105),)
    return LogMetadata("default", "l", LogConfig(**quota), segments=segs)


def test_the_backlog_is_what_the_slowest_cursor_has_not_consumed() -> None:
    md = _md(backlog_quota_bytes=250)
    assert measure_backlog(md, None, 50_000).bytes == 0  # no cursor: no backlog
    inside_2 = Position(2, 3, 0)  # segment 1 consumed, 2 only in part
    b = measure_backlog(md, inside_2, 50_000, current_bytes=40)
    assert (b.bytes, b.seconds) == (3 * 100 + 40, 30.0)
    assert b.over is not None and "340 bytes" in b.over
    assert measure_backlog(md, Position(4, 0, 0), 50_000).over is None  # 100 + 0 bytes
    aged = _md(backlog_quota_seconds=15.0)
    assert measure_backlog(aged, Position(4, 0, 0), 50_000).seconds == 10.0
    assert measure_backlog(aged, inside_2, 50_000).over == "30.0 s behind, over the quota of 15 s"


def test_eviction_drops_the_oldest_backlog_until_the_rest_fits() -> None:
    refuse = _md(backlog_quota_bytes=150)
    assert plan_eviction(refuse, Position(2, 3, 0), 50_000) is None  # "refuse" never evicts
    evict = _md(backlog_quota_bytes=150, backlog_policy="evict")
    # segments 2, 3, 4 (300 bytes) + 40 in the current one: 2 and 3 go, 4 stays (140)
    assert plan_eviction(evict, Position(2, 3, 0), 50_000, 40) == Position(4, 0, 0)
    assert plan_eviction(evict, Position(4, 0, 0), 50_000, 40) is None
    by_age = _md(backlog_quota_seconds=15.0, backlog_policy="evict")
    assert plan_eviction(by_age, Position(1, 0, 0), 50_000) == Position(4, 0, 0)
    # the current segment is never evicted, however far over
    assert plan_eviction(evict, Position(5, 0, 0), 50_000, 10_000) is None


def test_quota_knobs_are_checked_and_stored() -> None:
    with pytest.raises(ValueError, match="backlog_policy"):
        LogConfig(backlog_quota_bytes=1, backlog_policy="drop")
    with pytest.raises(ValueError, match="backlog_quota_bytes"):
        LogConfig(backlog_quota_bytes=0)
    cfg = LogConfig(backlog_quota_seconds=30.0, backlog_policy="evict")
    assert LogConfig.from_doc(cfg.to_doc()) == cfg
    assert "backlog_policy" not in LogConfig().to_doc()  # older records stay the same


async def _until(cond: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        assert loop.time() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.01)


async def test_refuse_stops_the_writer_until_the_cursor_catches_up() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        cur = await log.subscribe("slow")
        await log.set_backlog_quota(max_bytes=60, policy="refuse")
        w = await log.writer(housekeeping_interval=None, backlog_check_interval=0.02)
        appended = 0
        with pytest.raises(BacklogQuotaExceededError) as info:
            for i in range(200):  # each roll checks: refused once two segments are behind
                await w.append(b"record-%03d" % i)
                appended += 1
        assert isinstance(info.value, QuotaExceededError) and "slowest cursor" in str(info.value)
        assert 4 <= appended < 20 and w.backlog.refusing is not None
        with pytest.raises(BacklogQuotaExceededError):
            w.append_many([b"also refused"])
        assert w.backlog.refused_appends == 2
        assert (await log.backlog()).over is not None
        # the consumer catches up: the writer checks again by itself and writes on
        for _ in range(appended):
            rec = await asyncio.wait_for(cur.receive(), 10)
            await cur.ack(rec.position)

        async def writable() -> bool:
            return w.backlog.refusing is None

        await _until(writable, "the writer to take appends again")
        await w.append(b"after the catch-up")
        await w.close()
        await cur.close()


async def test_evict_truncates_the_oldest_backlog_and_the_cursor_skips_ahead() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        cur = await log.subscribe("slow")
        await log.set_backlog_quota(max_bytes=200, policy="evict")  # two segments fit
        async with await log.writer(housekeeping_interval=None) as w:
            positions = [await w.append(b"record-%03d" % i) for i in range(20)]
            assert w.backlog.refusing is None and w.backlog.evicted_segments > 0
            assert w.backlog.evicted_bytes > 0
        md = await log.metadata()
        assert md.truncated_before is not None and md.truncated_before > positions[0]
        backlog = await log.backlog()
        assert backlog.bytes <= 200 and backlog.over is None
        # every segment before the truncation point went by eviction, each counted once
        assert w.backlog.evicted_segments == md.truncated_before.segment - 1
        first = await asyncio.wait_for(cur.receive(), 10)  # skips what was evicted
        assert first.position >= md.truncated_before
        await cur.close()


async def test_a_writer_opened_over_the_quota_refuses_from_the_start() -> None:
    async with mem_cluster() as cluster:
        now = [1000.0]
        ns = cluster.client().namespace(clock=lambda: now[0])
        log = await ns.create_log("l", roll_entries=2)
        cur = await log.subscribe("slow")
        async with await log.writer() as w:
            await w.append_many([b"record-%03d" % i for i in range(12)])
            await w.roll()
        await log.set_backlog_quota(max_age=60.0)  # policy "refuse"
        now[0] += 61  # the oldest unconsumed segment is 61 s old now
        w = await log.writer(housekeeping_interval=None)
        with pytest.raises(BacklogQuotaExceededError, match="s behind"):
            await w.append(b"refused")
        registry = CollectorRegistry()
        registry.register(BacklogCollector(lambda: [("l", w.backlog)]))
        assert registry.get_sample_value("pybk_log_backlog_refusing", {"log": "l"}) == 1.0
        assert registry.get_sample_value("pybk_log_backlog_refused_appends_total",
                                         {"log": "l"}) == 1.0
        assert registry.get_sample_value("pybk_log_backlog_bytes", {"log": "l"}) > 0
        await w.close()
        await cur.close()


async def test_a_tenancy_namespace_gives_its_logs_a_backlog_quota() -> None:
    from pybk.metadata.tenancy import NamespacePolicies

    async with mem_cluster() as cluster:
        client = cluster.client()
        admin = client.admin()
        await admin.create_tenant("acme")
        await admin.create_namespace("acme/events", policies=NamespacePolicies(
            backlog_quota_bytes=1 << 20, backlog_policy="evict"))
        ns = client.namespace("acme/events")
        cfg = (await (await ns.create_log("a")).metadata()).config
        assert (cfg.backlog_quota_bytes, cfg.backlog_policy) == (1 << 20, "evict")
        own = await ns.create_log("b", backlog_quota_seconds=30.0, backlog_policy="refuse")
        cfg = (await own.metadata()).config  # an explicit knob wins; the rest still inherits
        assert (cfg.backlog_quota_bytes, cfg.backlog_quota_seconds) == (1 << 20, 30.0)
        with pytest.raises(ValueError, match="backlog_policy"):
            NamespacePolicies(backlog_policy="drop")
