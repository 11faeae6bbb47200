"""What a user of the ``pybk`` command trips over, each a clear one-line error with the right
exit status: reading past the end, --timeout on an idle tail and an unreachable ZooKeeper,
Ctrl-C, and a crashed bookie that used to fill a log with identical lines."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import pybk
from pybk.cli import main

pytestmark = pytest.mark.integration


def _pybk(*args: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three bookie processes; yields the metadata URI."""
    root = tmp_path_factory.mktemp("cli-errors") / "c"
    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "3")
    assert up.returncode == 0, up.stderr
    try:
        yield up.stdout.strip()
    finally:
        _pybk("cluster", "down", "--root", str(root))


def _one_error_line(result, status: int = 1) -> str:
    assert result.exit_code == status, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pybk: error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def test_reading_past_the_end_says_where_the_ledger_ends(cluster):
    runner = CliRunner()
    env = {"PYBK_METADATA": cluster}
    r = runner.invoke(main, ["ledger", "append", "a", "b", "c"], env=env)
    ledger = r.stdout.split()[0]
    r = runner.invoke(main, ["ledger", "read", ledger, "--last", "5"], env=env)
    line = _one_error_line(r)
    assert line == (f"pybk: error: EntryNotConfirmedError: ledger {ledger} has no confirmed "
                    "entry 5: its last add confirmed is 2")
    assert "read_unconfirmed" not in line  # no advice about the Python API
    r = runner.invoke(main, ["ledger", "read", ledger, "--first", "7"], env=env)
    assert _one_error_line(r) == (f"pybk: error: NoSuchEntryError: ledger {ledger} has no "
                                  "confirmed entry 7: its last add confirmed is 2")
    assert r.stdout == ""
    r = runner.invoke(main, ["ledger", "read", ledger, "--first", "2", "--last", "1"], env=env)
    assert r.exit_code == 2 and "--last 1 is before --first 2" in r.output
    r = runner.invoke(main, ["ledger", "read", ledger, "--first", "1"], env=env)
    assert r.exit_code == 0 and r.stdout == "1\tb\n2\tc\n"
    # an empty ledger read from its start: nothing, and fine
    r = runner.invoke(main, ["ledger", "create"], env=env)
    empty = r.stdout.strip()
    r = runner.invoke(main, ["ledger", "read", empty], env=env)
    assert r.exit_code == 0 and r.stdout == ""


def test_an_idle_tail_honours_timeout(cluster):
    # (a writer that goes away without closing: its later batches carried the LAC that
    # confirms the first 256 entries)
    r = CliRunner().invoke(main, ["ledger", "append", "--no-close", "--count", "300"],
                           env={"PYBK_METADATA": cluster})
    ledger = r.stdout.split()[0]
    began = time.monotonic()
    out = _pybk("ledger", "tail", ledger, "--timeout", "2", env={"PYBK_METADATA": cluster})
    took = time.monotonic() - began
    assert out.returncode == 1, out.stderr
    assert len(out.stdout.splitlines()) >= 256
    assert out.stderr.strip() == (f"pybk: error: TimeoutError: no new entry in ledger {ledger} "
                                  "within 2 s (raise --timeout to wait longer)")
    assert took < 15


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_zookeeper_honours_timeout_in_one_line():
    uri = f"zk://127.0.0.1:{_closed_port()}/pybk"
    began = time.monotonic()
    out = _pybk("ledger", "list", "--metadata", uri, "--timeout", "2")
    took = time.monotonic() - began
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pybk: error: "), out.stderr
    assert "ZooKeeper" in lines[0] or "TimeoutError" in lines[0]
    assert took < 10, took  # (it was 15 s and more for --timeout 5)


def test_ctrl_c_exits_130(cluster):
    r = CliRunner().invoke(main, ["ledger", "append", "--no-close", "--count", "300"],
                           env={"PYBK_METADATA": cluster})
    ledger = r.stdout.split()[0]
    tail = subprocess.Popen([sys.executable, "-m", "pybk", "ledger", "tail", ledger],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYBK_METADATA": cluster})
    try:
        assert tail.stdout is not None
        assert tail.stdout.readline().startswith("0\t00000000:")  # it follows the ledger
        tail.send_signal(signal.SIGINT)
        _out, err = tail.communicate(timeout=30)
    finally:
        tail.kill()
    assert tail.returncode == 130, err
    assert err.strip() == "pybk: interrupted"


def test_a_closed_stdout_ends_quietly_with_141(cluster):
    r = CliRunner().invoke(main, ["ledger", "append", "--count", "3000"],
                           env={"PYBK_METADATA": cluster})
    ledger = r.stdout.split()[0]
    reader = subprocess.Popen([sys.executable, "-m", "pybk", "ledger", "read", ledger],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYBK_METADATA": cluster})
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.readline()
    reader.stdout.close()  # like `| head -1`
    assert reader.wait(60) == 141
    assert reader.stderr.read() == b""


async def test_a_crashed_bookie_is_logged_once_not_per_pending_add(tmp_path, caplog):
    """A writer with 50 adds pending on a bookie that stops logged one identical line per
    add; once per failure now."""
    async with pybk.LocalCluster(tmp_path, bookies=4) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 3)
        victim = lh.metadata.ensembles[0][0]
        await cluster.stop_bookie(victim)
        with caplog.at_level(logging.INFO, "pybk.client.writer"):
            await asyncio.gather(*(lh.append(b"%d" % i) for i in range(50)))
        failed = [r.getMessage() for r in caplog.records if " failed: " in r.getMessage()]
        assert len(failed) == 1, failed
        assert victim in failed[0]
        await lh.close()


def test_a_bookie_stopped_by_ctrl_c_exits_130_after_a_clean_stop(tmp_path):
    from pybk.cli import spawn_bookie, wait_ready

    proc = spawn_bookie(tmp_path, "b1", f"sqlite://{tmp_path / 'meta.db'}")
    try:
        wait_ready(tmp_path, "b1", proc, 60)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        proc.kill()
        proc.wait(10)
    assert "bookie b1 stopped" in (tmp_path / "logs" / "b1.log").read_text()
