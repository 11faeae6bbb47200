"""The offload service (pybk.ops.offloader): logs nobody writes to are offloaded as their
triggers say and their bookie copies deleted after the deletion lag; a log without a tier is
left alone; one log's failing tier does not stop the others; per-log progress and Prometheus
metrics (the command: tests/tcp/test_log_offload_service_cli.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from logs_kit import mem_cluster
from prometheus_client import CollectorRegistry, generate_latest

from pybk.logs import BOOKIES, BOTH, OFFLOADED
from pybk.ops.offloader import OffloadCollector, OffloadService

pytest.importorskip("fsspec")
pytestmark = pytest.mark.timeout(120)


async def _written(ns, name: str, n: int = 6):  # type: ignore[no-untyped-def]
    log = await ns.create_log(name, roll_entries=2)
    async with await log.writer() as w:  # closed: no writer keeps this log any more
        positions = [await w.append(b"%s-%d" % (name.encode(), i)) for i in range(n)]
    return log, positions


async def test_idle_logs_are_offloaded_and_their_bookie_copies_go_after_the_lag(
        tmp_path: Path) -> None:
    now = [1000.0]
    async with mem_cluster() as cluster:
        client = cluster.client()
        ns = client.namespace(clock=lambda: now[0])
        a, last_a = await _written(ns, "a")
        await a.set_offload(f"file://{tmp_path}/tier", threshold_bytes=1, deletion_lag=60)
        plain, _ = await _written(ns, "plain")  # no tier: left alone
        broken, _ = await _written(ns, "broken")
        (tmp_path / "not-a-dir").write_bytes(b"")
        await broken.set_offload(f"file://{tmp_path}/not-a-dir/tier", threshold_bytes=1)

        service = OffloadService(client, ["default"], clock=lambda: now[0])
        assert await service.run_once() == 3  # a's three segments
        assert [s.tier for s in await a.segments()] == [BOTH] * 3
        progress = service.progress()
        assert progress["default/a"]["offloaded_segments"] == 3
        assert progress["default/a"]["both_tiers"] == 3
        assert progress["default/plain"]["bookies_only"] == 3
        assert progress["default/plain"]["offloaded_segments"] == 0
        assert progress["default/broken"]["failures"] == 1
        assert "not-a-dir" in progress["default/broken"]["last_error"]
        assert [s.tier for s in await plain.segments()] == [BOOKIES] * 3

        assert await service.run_once() == 0  # nothing more is due; the lag not passed
        assert [s.tier for s in await a.segments()] == [BOTH] * 3
        now[0] += 61
        await service.run_once()
        assert [s.tier for s in await a.segments()] == [OFFLOADED] * 3  # bookie copies gone
        async with a.reader(stop_at=last_a[-1]) as r:
            assert [rec.data async for rec in r] == [b"a-%d" % i for i in range(6)]

        registry = CollectorRegistry()
        registry.register(OffloadCollector(lambda: [("svc", service)]))
        text = generate_latest(registry).decode()
        assert 'pybk_offload_segments_total{instance="svc",log="a",namespace="default"} 3.0' \
            in text
        assert 'pybk_offload_failures_total{instance="svc",log="broken",namespace="default"} ' \
               '3.0' in text
        assert 'pybk_offload_pending_segments{instance="svc",log="plain",namespace="default"} ' \
               '3.0' in text
        assert 'pybk_offload_rounds_total{instance="svc"} 3.0' in text


async def test_a_round_beside_the_logs_writer_loses_nothing(tmp_path: Path) -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("w", roll_entries=2)
        await log.set_offload(f"file://{tmp_path}", threshold_bytes=1, deletion_lag=0)
        service = OffloadService(client, ["default"])
        async with await log.writer() as w:
            positions = []
            for i in range(10):  # the writer offloads on its own rolls; the service races it
                positions.append(await w.append(b"r%d" % i))
                await asyncio.gather(service.run_once(), asyncio.sleep(0))
        await service.run_once()
        assert all(s.tier == OFFLOADED for s in (await log.segments())[:-1])
        async with log.reader(stop_at=positions[-1]) as r:
            assert [rec.data async for rec in r] == [b"r%d" % i for i in range(10)]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="namespace"):
        OffloadService(object(), [])
    with pytest.raises(ValueError, match="interval"):
        OffloadService(object(), ["default"], interval=0)
