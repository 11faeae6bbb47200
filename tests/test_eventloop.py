"""The event-loop seam (pybk.runtime.eventloop): asyncio by default, uvloop only when asked
for, a clear error when it cannot be had; pybk's own loops (pybk.sync, pybk.WAL, a bookie process,
the TCP client) running on uvloop."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import uvloop

import pybk
from pybk.runtime.eventloop import LoopUnavailableError, available_loops, loop_factory, run
from pybk.server.processes import spawn_bookie, stop_pid, wait_ready

pytestmark = pytest.mark.timeout(120)


def test_default_is_asyncio_and_names_are_checked() -> None:
    assert loop_factory() is asyncio.new_event_loop
    assert loop_factory("asyncio") is asyncio.new_event_loop
    assert loop_factory("uvloop") is uvloop.new_event_loop
    assert available_loops() == ["asyncio", "uvloop"]
    with pytest.raises(LoopUnavailableError, match="unknown event loop 'tokio'"):
        loop_factory("tokio")


def test_missing_uvloop_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    with pytest.raises(LoopUnavailableError, match=r"pybk\[speed\]"):
        loop_factory("uvloop")
    assert available_loops() == ["asyncio"]
    with pytest.raises(LoopUnavailableError):
        pybk.sync.LocalCluster("/nonexistent-never-made", loop="uvloop")
    with pytest.raises(LoopUnavailableError):
        run(asyncio.sleep(0), "uvloop")  # the coroutine is closed, not left unawaited


def test_run_uses_the_named_loop() -> None:
    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(kind()).startswith("asyncio")
    assert run(kind(), "uvloop").startswith("uvloop")


def test_sync_cluster_and_wal_on_uvloop(tmp_path: Path) -> None:
    with pybk.sync.LocalCluster(tmp_path / "cluster", 3, loop="uvloop") as cluster:
        assert type(cluster._runner.loop).__module__.startswith("uvloop")
        lh = cluster.client().create_ledger(3, 2, 2)
        ids = [lh.append(b"entry-%d" % i) for i in range(20)]
        lh.close()
        rh = cluster.client().open_ledger(lh.id)
        assert [e.data for e in rh.read(0, ids[-1])] == [b"entry-%d" % i for i in range(20)]
    with pybk.WAL(tmp_path / "wal", loop="uvloop") as wal:
        assert type(wal._runner.loop).__module__.startswith("uvloop")
        positions = [*wal.append_many([b"a", b"b"]), wal.append(b"c")]
        assert [p for p, _ in wal.replay()] == positions
    with pybk.WAL(tmp_path / "wal") as wal:  # the same data, reopened on asyncio
        assert type(wal._runner.loop).__module__.startswith("asyncio")
        assert [d for _, d in wal.replay()] == [b"a", b"b", b"c"]


@pytest.mark.integration
def test_bookie_process_and_tcp_client_on_uvloop(tmp_path: Path) -> None:
    """``pybk bookie --loop uvloop`` serves a TCP client that itself runs on uvloop (both
    sides' protocol objects take uvloop's transports)."""
    metadata = f"sqlite://{tmp_path / 'metadata.db'}"
    proc = spawn_bookie(tmp_path, "b1", metadata, extra_args=["--loop", "uvloop"])
    try:
        wait_ready(tmp_path, "b1", proc, 60.0)

        async def go() -> list[bytes]:
            assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
            async with pybk.Client(metadata) as client:
                lh = await client.create_ledger(1, 1, 1)
                await asyncio.gather(*(lh.append(b"x%d" % i) for i in range(50)))
                await lh.close()
                rh = await client.open_ledger(lh.id)
                return [e.data for e in await rh.read(0, 49)]

        assert run(go(), "uvloop") == [b"x%d" % i for i in range(50)]
    finally:
        assert stop_pid(proc.pid, 30.0) in ("stopped", "already gone")
        proc.wait(10)
    assert proc.returncode == 0
    log = (tmp_path / "logs" / "b1.log").read_text()
    assert "Traceback" not in log, log


def test_bookie_refuses_a_loop_it_cannot_make(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pybk.cli import main

    result = CliRunner().invoke(main, ["bookie", "--data", str(tmp_path), "--metadata",
                                       "memory://", "--loop", "tokio"])
    assert result.exit_code == 2 and "tokio" in result.output
