"""``pybk bench`` (embedded and remote, table and JSON, usage errors) and the measuring kit
under it (pybk.bench: drivers, the ceiling's file, percentiles). Runs are tiny: these check
that the figures are there and mean what they say, never how fast anything is."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pybk.bench import (
    GroupCommitFile,
    LatencySummary,
    RecordFile,
    closed_loop,
    open_loop,
    percentile,
    plain_group_commit,
    replica_sync_floor,
)
from pybk.bench.tcp_floor import FloorServers, tcp_floor_servers
from pybk.cli import main
from pybk.server.processes import spawn_bookie, stop_pid, wait_ready

pytestmark = pytest.mark.timeout(180)

TINY = ["--duration", "0.2", "--warmup", "0.05"]


def _number(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not in:\n{text}"
    return float(m.group(1).replace(",", ""))


def test_bench_embedded_prints_throughput_percentiles_and_ceiling(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bench", *TINY, "--dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "local cluster of 3 in-process bookies" in out and "E3/Qw2/Qa2" in out
    for header in ("entries/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"):
        assert header in out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines()
            if line.startswith("│")}
    assert set(rows) == {"pybk", "ceiling"}, out
    for row in rows.values():
        cells = [c.strip() for c in row.split("│")[2:-1]]
        assert float(cells[0].replace(",", "")) > 0 and all(float(c.replace(",", "")) >= 0
                                                            for c in cells)
    assert _number(out, r"pybk / ceiling: ([\d.]+)x") > 0
    assert _number(out, r"write \+ fdatasync on that disk: p50 ([\d.]+) ms") > 0
    assert "file appended (the file grows)" in out  # LocalCluster's defaults: appended segments
    assert os.listdir(tmp_path) == []  # the embedded cluster and the ceiling's files are gone


def test_bench_journals_sync_through_helpers_or_on_a_thread_when_told(tmp_path: Path) -> None:
    """The embedded cluster's bookies sync through a helper process each (the default);
    ``--sync-thread`` runs the same measurement with the syncs on a thread, and says so."""
    for flag, said in (([], "syncs through a helper process per bookie"),
                       (["--sync-thread"], "syncs on a thread of this process")):
        r = CliRunner().invoke(main, ["bench", *TINY, "--dir", str(tmp_path), "--json",
                                      "--no-ceiling", *flag])
        assert r.exit_code == 0, r.output
        report = json.loads(r.output.strip().splitlines()[-1])
        assert said in report["setup"], report["setup"]
        assert report["pybk"]["entries"] > 0
    r = CliRunner().invoke(main, ["bench", *TINY, "--sync-thread", "--server-settings"])
    assert r.exit_code == 2 and "need the helper process" in r.output, r.output


def test_bench_json_open_loop_and_server_settings(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bench", *TINY, "--dir", str(tmp_path), "--json", "--rate",
                                  "500", "--server-settings", "-e", "1", "-w", "1", "-a", "1",
                                  "--bookies", "1", "--size", "64"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["entry_size"] == 64 and "E1/Qw1/Qa1" in report["setup"]
    assert "open loop at 500 appends/s" in report["setup"]
    for side in ("pybk", "ceiling"):
        run = report[side]
        assert run["entries"] == 100 and run["target_rate"] == 500  # rate x duration, all done
        assert set(run["latency_ms"]) == {"p50", "p90", "p99", "p99.9", "max"}
        assert 0 < run["latency_ms"]["p50"] <= run["latency_ms"]["max"]
    assert "preallocated" in report["ceiling_setup"]  # the bookies' file treatment
    assert report["fsync_p50_ms"] > 0 and report["pybk_over_ceiling"] > 0


@pytest.mark.integration
def test_bench_remote_cluster_with_a_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    metadata = f"sqlite://{tmp_path / 'metadata.db'}"
    proc = spawn_bookie(tmp_path, "b1", metadata,
                        extra_args=["--auth-token-file", str(token)])
    try:
        wait_ready(tmp_path, "b1", proc, 60.0)
        args = ["bench", *TINY, "--metadata", metadata, "-e", "1", "-w", "1", "-a", "1",
                "--inflight", "8"]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and "UnauthorizedError" in r.output, r.output
        ceiling_dir = tmp_path / "here"
        ceiling_dir.mkdir()
        r = CliRunner().invoke(main, [*args, "--auth-token-file", str(token), "--json",
                                      "--ceiling-dir", str(ceiling_dir)])
        assert r.exit_code == 0, r.output
        report = json.loads(r.output.strip().splitlines()[-1])
        assert report["setup"].startswith("remote cluster")
        assert report["pybk"]["entries_per_s"] > 0 and report["ceiling"]["entries"] > 0
        assert any("not on the bookies' disks" in n for n in report["notes"])
        r = CliRunner().invoke(main, [*args, "--auth-token-file", str(token)])
        assert r.exit_code == 0 and "no ceiling" in r.output and "pybk" in r.output
    finally:
        assert stop_pid(proc.pid, 30.0) in ("stopped", "already gone")
        proc.wait(10)


def test_bench_usage_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, says in (
        (["--ceiling-dir", str(tmp_path)], "--ceiling-dir is for a remote cluster"),
        (["-e", "4"], "needs at least that many --bookies"),
        (["-w", "2", "-a", "3"], "ack quorum <= write quorum"),
        (["--metadata", "memory://", "--bookies", "5"], "for the embedded cluster"),
        (["--duration", "0"], "--duration"),
        (["--loop", "tokio"], "tokio"),
    ):
        r = runner.invoke(main, ["bench", *args])
        assert r.exit_code == 2 and says in r.output, (args, r.output)


# -- the kit -------------------------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 0.5) == 50 and percentile(xs, 0.99) == 99
    assert percentile(xs, 0) == 1 and percentile(xs, 1) == 100
    assert percentile([3.0], 0.999) == 3.0
    s = LatencySummary.of([0.002, 0.001, 0.003])
    assert (s.count, s.p50, s.max) == (3, 0.002, 0.003)
    assert s.ms()["p50"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        percentile(xs, 1.5)


def test_record_file_preallocated_is_written_in_place(tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    f = RecordFile(path, preallocate=True, prealloc_size=2 << 20)
    assert os.path.getsize(path) == 2 << 20
    block = b"x" * (700 << 10)
    for _ in range(4):  # 2.8 MiB into 2 MiB: the third batch goes back to the start
        f.write(block)
        f.sync()
    assert os.path.getsize(path) == 2 << 20 and f.written == 4 * len(block)
    with open(path, "rb") as r:
        data = r.read()
    assert data[:2 * len(block)] == block * 2 and data[-10:] == bytes(10)
    f.close()
    assert not os.path.exists(path)
    g = RecordFile(path, preallocate=False)
    g.write(b"abc")
    g.write(b"def")
    assert os.path.getsize(path) == 6
    g.close()
    rate, lat = plain_group_commit(path, 100, 4, 0.05, preallocate=True)
    assert rate > 0 and lat and not os.path.exists(path)


def test_replica_sync_floor_syncs_every_replica_both_ways(tmp_path: Path) -> None:
    paths = [str(tmp_path / f"r{i}") for i in range(3)]
    serial, together = replica_sync_floor(paths, 100, 0.1, preallocate=False)
    assert serial and together and all(t > 0 for t in serial + together)
    assert not any(os.path.exists(p) for p in paths)  # files made for the run are removed
    kept = [RecordFile(p, preallocate=False) for p in paths[:2]]
    serial, together = replica_sync_floor(kept, 100, 0.05)
    # every round wrote one framed record to each replica, one after the other or at once
    assert all(f.written == (len(serial) + len(together)) * 108 for f in kept)
    for f in kept:
        f.close()
    with pytest.raises(ValueError, match="at least one file"):
        replica_sync_floor([], 100, 0.05)


async def test_closed_loop_keeps_its_depth_and_count() -> None:
    loop = asyncio.get_running_loop()
    outstanding = peak = 0

    def append() -> asyncio.Future[None]:
        nonlocal outstanding, peak
        fut: asyncio.Future[None] = loop.create_future()
        outstanding += 1
        peak = max(peak, outstanding)

        def finish() -> None:
            nonlocal outstanding
            outstanding -= 1
            fut.set_result(None)
        loop.call_soon(finish)
        return fut

    run = await closed_loop(append, 7, count=100)
    assert run.count == 100 and peak == 7 and len(run.latencies) == 100
    with pytest.raises(ValueError):
        await closed_loop(append, 0, 1.0)
    with pytest.raises(ValueError):
        await closed_loop(append, 1)  # neither a duration nor a count


async def test_drivers_raise_the_first_failure() -> None:
    loop = asyncio.get_running_loop()

    def failing() -> asyncio.Future[None]:
        fut: asyncio.Future[None] = loop.create_future()
        loop.call_soon(fut.set_exception, OSError("disk gone"))
        return fut

    with pytest.raises(OSError, match="disk gone"):
        await closed_loop(failing, 4, 5.0)
    with pytest.raises(OSError, match="disk gone"):
        await open_loop(failing, 1000, 5.0)


async def test_open_loop_charges_a_stall_to_the_appends_it_delayed() -> None:
    """A system that answers nothing until 20 appends are waiting: the first one waited for
    the 19 after it to become due, and its latency (from when it was due) says so."""
    loop = asyncio.get_running_loop()
    held: list[asyncio.Future[None]] = []

    def append() -> asyncio.Future[None]:
        fut: asyncio.Future[None] = loop.create_future()
        held.append(fut)
        if len(held) == 20:
            for f in held:
                f.set_result(None)
        return fut

    run = await open_loop(append, 2000, 0.01)  # 20 appends, one due every 0.5 ms
    assert run.count == 20 and run.target_rate == 2000
    assert max(run.latencies) >= 19 * 0.0005 * 0.99


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_open_loop_issues_in_ticks_on_either_loop_without_spinning(loop_name: str) -> None:
    """Appends due within a tick go out together, about one group per millisecond on both
    loops (uvloop fired a 0.5 ms timer at the next pass: the driver spun, one append a pass),
    and a tick finer than the loops' timers is refused."""
    from pybk.bench.drive import MIN_TICK
    from pybk.runtime.eventloop import run

    async def scenario() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        groups = 0
        in_pass = False

        def end_pass() -> None:
            nonlocal in_pass
            in_pass = False

        def append() -> asyncio.Future[None]:
            nonlocal groups, in_pass
            if not in_pass:
                in_pass = True
                groups += 1
                loop.call_soon(end_pass)
            fut: asyncio.Future[None] = loop.create_future()
            fut.set_result(None)
            return fut

        result = await open_loop(append, 20_000, 0.2)  # 4,000 appends
        return result.count, groups

    count, groups = run(scenario(), loop_name)
    assert count == 4000
    assert groups <= 0.2 / MIN_TICK * 1.2 + 5, groups  # (spinning: about one per append)
    with pytest.raises(ValueError, match=r"tick must be >= 0\.001"):
        run(open_loop(lambda: asyncio.get_running_loop().create_future(), 10, 0.1,
                      tick=0.0005), loop_name)


async def test_group_commit_file_fails_its_waiters_when_the_disk_does(tmp_path: Path) -> None:
    log = GroupCommitFile(str(tmp_path / "c"), preallocate=False)
    offsets = await asyncio.gather(*(log.append(b"r%d" % i) for i in range(10)))
    assert log.records == 10 and offsets[0] == 0 and log.syncs >= 1
    os.close(log.file.fd)  # the next write fails: EBADF
    log.file.fd = os.open(os.devnull, os.O_RDONLY)
    with pytest.raises(OSError):
        await log.append(b"lost")
    await log.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_tcp_floor_syncs_every_record_on_every_replica_and_stops_its_servers(
        tmp_path: Path, loop: str) -> None:
    """The lone TCP row's floor: each record it timed was written and synced by every
    server, and the server processes are gone when the block ends."""
    from pybk.runtime.eventloop import run

    from .process_kit import children

    async def scenario() -> tuple[int, FloorServers, list[int]]:
        async with tcp_floor_servers(tmp_path, 2, loop, size=100) as servers:
            running = children(os.getpid(), "pybk.bench.tcp_floor")
            timed = [len(await servers.measure(0.05)) for _ in range(2)]
            assert all(timed)
        return sum(timed), servers, running

    timed, servers, running = run(scenario(), loop)
    assert len(running) == 2
    assert servers.synced == [timed, timed]
    assert children(os.getpid(), "pybk.bench.tcp_floor") == []
    assert not list(tmp_path.glob("tcp-floor-*"))

    async def no_replicas() -> None:
        async with tcp_floor_servers(tmp_path, 0, loop):
            pass

    with pytest.raises(ValueError, match="replicas must be >= 1"):
        run(no_replicas(), loop)
