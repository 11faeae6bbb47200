"""The pybk command line: help everywhere, exit codes, and a whole session against a cluster
of bookie processes started by ``pybk cluster up`` and stopped by ``pybk cluster down``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from process_kit import children

from pybk.cli import main

pytestmark = pytest.mark.integration


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += _all_commands(cmd, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


def test_help_everywhere():
    runner = CliRunner()
    commands = _all_commands(main)
    assert ("ledger", "recover") in commands and ("cluster", "up") in commands
    for path in commands:
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output


def test_usage_errors_exit_2():
    runner = CliRunner()
    assert runner.invoke(main, ["ledger", "read"]).exit_code == 2  # missing --metadata
    result = runner.invoke(main, ["bookie", "--data", "/tmp/x"])
    assert result.exit_code == 2 and "--metadata" in result.output
    result = runner.invoke(main, ["bookie", "--data", "/tmp/x", "--metadata", "memory://",
                                  "--port", "0"])  # fmt: skip
    assert result.exit_code == 2 and "--bookie-id" in result.output
    assert runner.invoke(main, ["no-such-command"]).exit_code == 2


def test_operation_failure_is_one_line_and_exit_1(tmp_path):
    runner = CliRunner()
    uri = f"sqlite://{tmp_path / 'meta.db'}"
    # a client command never makes an empty cluster out of a mistyped path
    result = runner.invoke(main, ["ledger", "list", "--metadata", uri])
    assert result.exit_code == 2 and "meta.db does not exist" in result.output
    assert not (tmp_path / "meta.db").exists()
    _make_store(uri)
    result = runner.invoke(main, ["ledger", "show", "42", "--metadata", uri])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        result.output.strip().splitlines()[0]
    ] and result.output.startswith("pybk: error: NoSuchLedgerError")
    # a malformed metadata URI is a usage error (exit 2) naming the URI, not a failure
    for bad in ("bogus://x", "sqlite://tmp/x", "/tmp/x"):
        result = runner.invoke(main, ["ledger", "list", "--metadata", bad])
        assert result.exit_code == 2 and f"bad metadata URI {bad!r}" in result.output
    result = runner.invoke(main, ["ledger", "append", "x", "--metadata", uri, "--timeout", "20"])
    assert result.exit_code == 1 and "NotEnoughBookiesError" in result.output
    result = runner.invoke(main, ["ledger", "list", "--metadata", uri, "--timeout", "0.000001"])
    assert result.exit_code == 1
    assert result.output.startswith("pybk: error: TimeoutError: not done within 1e-06 s")


def _make_store(uri: str) -> None:
    """A cluster's metadata store without bookies."""
    import asyncio

    from pybk.metadata import open_store

    async def make() -> None:
        store = open_store(uri)
        await store.list_bookies()
        await store.close()

    asyncio.run(make())


def test_python_dash_m_pybk():
    out = subprocess.run(
        [sys.executable, "-m", "pybk", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and "cluster" in out.stdout


def _pybk(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pybk", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        **kw,
    )


def test_cluster_session(tmp_path):
    root = tmp_path / "c"
    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "3")
    try:
        assert up.returncode == 0, up.stderr
        uri = up.stdout.strip()
        assert uri == f"sqlite://{root / 'metadata.db'}"
        state = json.loads((root / "cluster.json").read_text())
        pids = [b["pid"] for b in state["bookies"].values()]
        assert len(pids) == 3
        again = _pybk("cluster", "up", "--root", str(root))
        assert again.returncode == 1 and "already running" in again.stderr

        runner = CliRunner()
        env = {"PYBK_METADATA": uri}
        bookies = runner.invoke(main, ["bookie", "list", "--json"], env=env)
        assert bookies.exit_code == 0
        listed = [json.loads(line) for line in bookies.output.splitlines()]
        assert [b["bookie_id"] for b in listed] == ["bookie-1", "bookie-2", "bookie-3"]

        r = runner.invoke(main, ["ledger", "append", "alpha", "beta", "gamma"], env=env)
        assert r.exit_code == 0, r.output
        ledger_id = int(r.stdout.strip().splitlines()[0])
        r = runner.invoke(main, ["ledger", "read", str(ledger_id)], env=env)
        assert r.exit_code == 0 and r.stdout == "0\talpha\n1\tbeta\n2\tgamma\n"
        r = runner.invoke(main, ["ledger", "show", str(ledger_id)], env=env)
        doc = json.loads(r.stdout)
        assert doc["state"] == "CLOSED" and doc["last_entry_id"] == 2

        # tail follows an open ledger until someone recovers (closes) it
        r = runner.invoke(main, ["ledger", "append", "--count", "300", "--no-close"], env=env)
        assert r.exit_code == 0, r.output
        open_id = r.stdout.strip().splitlines()[0]
        tail = subprocess.Popen(
            [sys.executable, "-m", "pybk", "ledger", "tail", open_id, "--format", "raw"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **env},
        )
        r = runner.invoke(main, ["ledger", "recover", open_id], env=env)
        assert r.exit_code == 0 and r.stdout.strip() == "299"
        out, err = tail.communicate(timeout=60)
        assert tail.returncode == 0, err
        lines = out.splitlines()
        assert len(lines) == 300 and lines[299].startswith(b"00000299:")

        r = runner.invoke(main, ["ledger", "list"], env=env)
        assert r.stdout.split() == sorted([str(ledger_id), open_id], key=int)
        r = runner.invoke(main, ["ledger", "delete", "--yes", str(ledger_id)], env=env)
        assert r.exit_code == 0
        r = runner.invoke(main, ["ledger", "read", str(ledger_id)], env=env)
        assert r.exit_code == 1 and "NoSuchLedgerError" in r.output
    finally:
        down = _pybk("cluster", "down", "--root", str(root))
    assert down.returncode == 0, down.stderr
    assert down.stderr.count(": stopped") == 3
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    assert _pybk("cluster", "down", "--root", str(root)).returncode == 1


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def test_cluster_with_auth_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    root = tmp_path / "c"
    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "2",
               "--auth-token-file", str(token))  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        uri = up.stdout.strip()
        runner = CliRunner()
        args = ["ledger", "append", "x", "-e", "2", "-w", "2", "-a", "2", "--metadata", uri]
        r = runner.invoke(main, args)
        assert r.exit_code == 1 and "UnauthorizedError" in r.output
        r = runner.invoke(main, [*args, "--auth-token-file", str(token)])
        assert r.exit_code == 0, r.output
    finally:
        _pybk("cluster", "down", "--root", str(root))


def test_bookie_refusing_to_start_exits_1_with_the_cause(tmp_path):
    """A bookie whose data directory was wiped must not start (cookie check): exit status 1
    and one line naming BookieStateError, not a traceback."""
    import shutil
    import signal

    from pybk.cli import spawn_bookie, wait_ready

    root = tmp_path / "c"
    metadata = f"sqlite://{tmp_path / 'meta.db'}"
    proc = spawn_bookie(root, "b1", metadata)
    try:
        wait_ready(root, "b1", proc, 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    shutil.rmtree(root / "bookies" / "b1")
    out = _pybk("bookie", "--data", str(root / "bookies" / "b1"), "--port", "0",
                "--bookie-id", "b1", "--metadata", metadata)  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("pybk: error: BookieStateError")
    assert "Traceback" not in out.stderr


def test_cluster_with_mutual_tls(tmp_path):
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "s.pem")
    ca.issue_cert("cli").private_key_and_cert_chain_pem.write_to_path(tmp_path / "c.pem")
    root = tmp_path / "c"
    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "2",
               "--tls-cert", str(tmp_path / "s.pem"), "--tls-ca", str(tmp_path / "ca.pem"),
               "--require-client-cert")  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        runner = CliRunner()
        base = ["ledger", "append", "x", "-e", "2", "-w", "2", "-a", "2",
                "--metadata", up.stdout.strip(), "--timeout", "20"]  # fmt: skip
        r = runner.invoke(main, [*base, "--tls-ca", str(tmp_path / "ca.pem")])  # no client cert
        # (the ledger is made in the metadata store and its id printed before any bookie
        # is reached)
        assert r.exit_code == 1 and r.stderr.startswith("pybk: error:"), r.output
        r = runner.invoke(main, base)  # plaintext to TLS ports
        assert r.exit_code == 1, r.output
        tls = ["--tls-ca", str(tmp_path / "ca.pem"), "--tls-cert", str(tmp_path / "c.pem")]
        r = runner.invoke(main, [*base, *tls])
        assert r.exit_code == 0, r.output
        r = runner.invoke(main, ["ledger", "read", r.stdout.split()[0],
                                 "--metadata", up.stdout.strip(), *tls])  # fmt: skip
        assert r.exit_code == 0 and r.stdout == "0\tx\n"
    finally:
        _pybk("cluster", "down", "--root", str(root))


def test_layer_commands_are_registered():
    """`pybk simulate` lives in pybk/sim/cli.py and is added to the group when present."""
    import importlib.util

    has_sim_cli = importlib.util.find_spec("pybk.cli.simulate") is not None
    assert ("simulate" in main.commands) == has_sim_cli


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
async def test_a_bookie_process_sync_helper_ends_with_it(tmp_path, how):
    """`pybk bookie` syncs its journal through a helper process (pybk.storage.syncer). It must
    not outlive the bookie: a clean stop closes it, and a killed bookie's helper sees its
    socket close and exits."""
    import signal

    from pybk.server.processes import pid_alive as _pid_alive
    from pybk.server.processes import spawn_bookie, wait_ready

    from .conftest import wait_until

    root = tmp_path / "c"
    proc = spawn_bookie(root, "b1", f"sqlite://{tmp_path / 'meta.db'}")
    try:
        wait_ready(root, "b1", proc, 60)
        helpers = children(proc.pid, running="_sync_child.py")
        assert len(helpers) == 1, helpers
        proc.send_signal(getattr(signal, how))
        proc.wait(30)
        await wait_until(lambda: not _pid_alive(helpers[0]), 30,
                         f"sync helper {helpers[0]} outlived its bookie ({how})")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.parametrize("args, size", [([], 128 << 10), (["--segment-mb", "2"], 128 << 10),
                                        (["--no-preallocate"], None)],
                         ids=["default", "segment-mb", "no-preallocate"])
def test_a_bookie_process_journal_segments_follow_its_options(tmp_path, args, size):
    """`pybk bookie` preallocates its journal segments, the first one small (128 KiB: a bookie
    holding little takes little disk), later ones twice
    the last up to the segment size (tests/storage/test_prealloc.py);
    `--segment-mb`/`--no-preallocate` change that."""
    from pybk.cli import spawn_bookie, wait_ready

    root = tmp_path / "c"
    proc = spawn_bookie(root, "b1", f"sqlite://{tmp_path / 'meta.db'}", extra_args=args)
    try:
        wait_ready(root, "b1", proc, 60)
        journal = root / "bookies" / "b1" / "journal"
        sizes = [p.stat().st_size for p in journal.glob("*.seg")]
        assert len(sizes) == 1, sizes
        if size is None:
            assert sizes[0] < 4096, sizes  # a header, appended to as entries come
        else:
            assert sizes[0] == size, sizes
    finally:
        proc.terminate()
        proc.wait(30)
