"""The operator commands against bookie processes on SQLite metadata: pybk bookie
info|decommission|recover, pybk autorecovery (standalone, and status|enable|disable|trigger|
delay), pybk ledger under-replicated; their bad inputs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pybk.cli import main, spawn_bookie, wait_ready
from pybk.client import Client

pytestmark = pytest.mark.integration

SESSION = ["--session-timeout", "2"]


class Procs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.metadata = f"sqlite://{root / 'metadata.db'}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    async def bookie(self, bookie_id: str, *extra: str) -> None:
        self.procs[bookie_id] = spawn_bookie(self.root, bookie_id, self.metadata,
                                             extra_args=[*SESSION, *extra])
        await asyncio.to_thread(wait_ready, self.root, bookie_id, self.procs[bookie_id], 60.0)

    def kill(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
async def procs(tmp_path: Path) -> AsyncIterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """A process whose stdout we read and whose stderr goes to a log file."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True)


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


async def until(cond, bound: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + bound
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound}s: {what}")
        await asyncio.sleep(0.2)


async def write(metadata: str, n: int = 4) -> list[int]:
    async with Client(metadata) as client:
        ids = []
        for _ in range(n):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            await lh.append_many([b"%d" % j for j in range(20)])
            await lh.close()
            ids.append(lh.id)
        return ids


async def test_bookie_info_recover_decommission_and_marks(procs: Procs) -> None:
    for b in ("b0", "b1", "b2", "b3"):
        await procs.bookie(b, "--rack", f"/dc/r{b[1]}")
    m = procs.metadata
    ids = await write(m)
    code, out = await asyncio.to_thread(cli, "bookie", "list", "--metadata", m, "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["rack"] for r in rows] == ["/dc/r0", "/dc/r1", "/dc/r2", "/dc/r3"]
    code, out = await asyncio.to_thread(cli, "bookie", "info", "b1", "--metadata", m)
    info = json.loads(out)
    assert code == 0 and info["state"] == "writable" and info["total_bytes"] > 0
    # recover moves every fragment off a bookie, even a running one
    code, out = await asyncio.to_thread(cli, "bookie", "recover", "b0", "--metadata", m,
                                        "--placement", "rack-aware", "--min-racks", "2",
                                        "--strict-placement")
    assert code == 0, out
    async with Client(m) as client:
        for lid in ids:
            md = await client.ledger_metadata(lid)
            assert "b0" not in md.ensembles[0]
    # decommission: refused while running; done once stopped
    code, out = await asyncio.to_thread(cli, "bookie", "decommission", "b1", "--metadata", m)
    assert code == 1 and "still running" in out
    procs.kill("b1")

    async def b1_gone() -> bool:
        _, listed = await asyncio.to_thread(cli, "bookie", "list", "--metadata", m)
        return "b1" not in listed

    await until(b1_gone, 15.0, "b1 to leave the bookie list")
    code, out = await asyncio.to_thread(cli, "bookie", "decommission", "b1", "--metadata", m,
                                        "--delete-cookie", "--timeout", "60")
    assert code == 0, out
    report = json.loads(out)
    assert set(report["repaired"]) <= set(ids)
    async with Client(m) as client:
        for lid in ids:
            md = await client.ledger_metadata(lid)
            assert all("b1" not in e for e in md.ensembles.values())
        assert await client.store.read_cookie("b1") is None
        await client.store.mark_under_replicated(ids[0], ["bx"])
        await client.store.mark_under_replicated(ids[1], ["by"])
    code, out = await asyncio.to_thread(cli, "ledger", "under-replicated", "--metadata", m)
    assert code == 0 and out.splitlines() == [f"{ids[0]}\tbx", f"{ids[1]}\tby"]
    code, out = await asyncio.to_thread(cli, "ledger", "under-replicated", "--metadata", m,
                                        "--missing", "by", "--json")
    assert json.loads(out) == {str(ids[1]): ["by"]}


async def test_autorecovery_switches_and_bad_input(tmp_path: Path) -> None:
    m = f"sqlite://{tmp_path / 'metadata.db'}"
    code, out = await asyncio.to_thread(cli, "autorecovery", "status", "--metadata", m)
    assert code == 2 and "does not exist" in out  # a mistyped path makes no new cluster
    async with Client(m) as client:  # (a cluster's store: made by its first bookie)
        await client.list_ledgers()
    code, out = await asyncio.to_thread(cli, "autorecovery", "status", "--metadata", m)
    assert code == 0 and "enabled: yes" in out and "auditor: none elected" in out
    assert (await asyncio.to_thread(cli, "autorecovery", "disable", "--metadata", m))[0] == 0
    code, out = await asyncio.to_thread(cli, "autorecovery", "status", "--metadata", m,
                                        "--json")
    assert json.loads(out)["enabled"] is False
    assert (await asyncio.to_thread(cli, "autorecovery", "enable", "--metadata", m))[0] == 0
    code, out = await asyncio.to_thread(cli, "autorecovery", "trigger", "--metadata", m)
    assert code == 0 and out.strip() == "1"
    code, out = await asyncio.to_thread(cli, "autorecovery", "delay", "30", "--metadata", m)
    assert code == 0 and out.strip() == "30"
    code, out = await asyncio.to_thread(cli, "autorecovery", "delay", "--metadata", m)
    assert out.strip() == "30"
    code, out = await asyncio.to_thread(cli, "autorecovery", "delay", "none", "--metadata", m)
    assert out.strip() == "none"
    for bad in ("soon", "nan", "inf"):
        code, out = await asyncio.to_thread(cli, "autorecovery", "delay", bad, "--metadata", m)
        assert code == 1 and out.startswith("pybk: error: ValueError"), (bad, out)
    code, out = await asyncio.to_thread(cli, "autorecovery")
    assert code == 2 and "--metadata" in out
    code, out = await asyncio.to_thread(cli, "bookie", "recover", "b0", "--metadata", m,
                                        "--strict-placement")
    assert code == 2 and "rack-aware" in out
    code, out = await asyncio.to_thread(cli, "autorecovery", "--metadata", m,
                                        "--open-ledger-grace", "0")
    assert code == 2
    code, out = await asyncio.to_thread(cli, "bookie", "--data", str(tmp_path / "x"),
                                        "--metadata", m, "--bookie-id", "x", "--rack", "r1")
    assert code == 2 and "rack" in out
    code, out = await asyncio.to_thread(cli, "bookie", "--data", str(tmp_path / "x"),
                                        "--metadata", m, "--bookie-id", "x", "--group", "a b")
    assert code == 2 and "isolation group" in out


async def test_standalone_autorecovery_re_replicates_and_elects_itself(procs: Procs) -> None:
    for b in ("b0", "b1", "b2", "b3"):
        await procs.bookie(b)
    m = procs.metadata
    ids = await write(m, 3)
    args = [sys.executable, "-m", "pybk", "autorecovery", "--metadata", m, "--name", "ar-1",
            *SESSION, "--worker-poll-interval", "0.5", "--ledger-check-interval", "0"]
    ar = spawn(args, procs.root / "ar.log")
    procs.procs["ar-1"] = ar
    assert ar.stdout is not None
    ready = await asyncio.to_thread(ar.stdout.readline)
    assert json.loads(ready)["event"] == "ready"

    async def elected() -> bool:
        _, out = await asyncio.to_thread(cli, "autorecovery", "status", "--metadata", m)
        return "auditor: ar-1" in out

    await until(elected, 20.0, "the standalone instance to be elected")
    async with Client(m) as client:
        victim = (await client.ledger_metadata(ids[0])).ensembles[0][0]
        procs.kill(victim)

        async def repaired() -> bool:
            if (await asyncio.to_thread(cli, "ledger", "under-replicated", "--metadata",
                                        m))[1].strip():
                return False
            for lid in ids:
                md = await client.ledger_metadata(lid)
                if any(victim in e for e in md.ensembles.values()):
                    return False
            return True

        await until(repaired, 60.0, f"the ledgers to move off {victim}")
        for lid in ids:
            rh = await client.open_ledger(lid, recovery=False)
            assert len(await rh.read(0, 19)) == 20
    ar.terminate()
    assert await asyncio.to_thread(ar.wait, 30) == 0
