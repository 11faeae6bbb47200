"""``pybk log mirror`` between two clusters of bookie processes (each with its own SQLite
metadata store): the mirror process is killed with SIGKILL while copying and started again,
and the target ends holding the source's records in order, each once; SIGTERM stops it
cleanly; ``--drain`` copies what is left and exits; bad URIs are bad usage."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

import pybk
from pybk.cli import main
from pybk.logs.mirror import unframe

from .proc_cluster import ProcCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WAIT = 60.0


def _poll(cond: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def _mirror(src: str, dst: str, *extra: str, ready: dict[str, object] | None = None,
            ) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pybk", "log", "mirror", "--from", src, "--to", dst, "orders",
         "--batch", "7", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"{"):
        proc.kill()
        raise AssertionError(f"mirror did not start: {line!r} {proc.stderr.read()!r}")  # type: ignore[union-attr]
    said = json.loads(line)
    assert said["event"] == "ready"
    if ready is not None:
        ready.update(said)
    return proc


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=WAIT) as resp:
        return str(resp.read().decode())


def _records(client: pybk.sync.Client) -> list[pybk.LogRecord]:
    lg = client.namespace().open_log("orders")
    last = lg.last_position()
    if last is None:
        return []
    out: list[pybk.LogRecord] = []
    with lg.reader(stop_at=last) as r:
        while batch := r.read_batch(1000):
            out.extend(batch)
    return out


def test_a_killed_mirror_process_restarts_from_the_target(tmp_path: Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    a, b = ProcCluster(tmp_path / "a", 2), ProcCluster(tmp_path / "b", 2)
    asyncio.run(a.start())
    asyncio.run(b.start())
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with pybk.sync.Client(a.metadata) as ca, pybk.sync.Client(b.metadata) as cb:
            src = ca.namespace().create_log("orders", ensemble_size=2, write_quorum=2,
                                            ack_quorum=2, roll_entries=5)
            with src.writer() as w:
                w.append_many([b"first-%d" % i for i in range(150)])
                procs.append(_mirror(a.metadata, b.metadata))
                # SIGKILL once the target holds a random part of what the source holds
                stop_after = rng.randrange(1, 150)
                _poll(lambda: "orders" in cb.namespace().list_logs()
                      and len(_records(cb)) >= stop_after, "the mirror to copy")
                os.kill(procs[-1].pid, signal.SIGKILL)
                assert procs[-1].wait(WAIT) == -signal.SIGKILL
                w.append_many([b"second-%d" % i for i in range(100)])
            source = _records(ca)
            ready: dict[str, object] = {}
            procs.append(_mirror(a.metadata, b.metadata, "--metrics-port", "0", ready=ready))
            _poll(lambda: len(_records(cb)) >= len(source), "the mirror to catch up")
            url = f"http://127.0.0.1:{ready['metrics_port']}/metrics"
            _poll(lambda: "pybk_log_mirror_lag_seconds{mirror=\"default/orders\"} 0.0"
                  in _get(url), "the lag metric to say caught up")
            assert "pybk_log_mirror_records_total" in _get(url)
            procs[-1].send_signal(signal.SIGTERM)
            out, err = procs[-1].communicate(timeout=WAIT)
            assert procs[-1].returncode == 0, err.decode()[-2000:]
            assert out.decode().strip() == str(source[-1].position)
            target = _records(cb)
            assert len(target) == len(source) == 250
            for s, t in zip(source, target, strict=True):
                copied = unframe(t.data)
                assert (copied.source_position, copied.data) == (s.position, s.data)
            # more on the source, then --drain copies it and exits by itself
            with src.writer() as w:
                w.append_many([b"third-%d" % i for i in range(20)])
            procs.append(_mirror(a.metadata, b.metadata, "--drain"))
            out, err = procs[-1].communicate(timeout=WAIT)
            assert procs[-1].returncode == 0, err.decode()[-2000:]
            source, target = _records(ca), _records(cb)
            assert out.decode().strip() == str(source[-1].position)
            assert [unframe(t.data).data for t in target] == [s.data for s in source]
            # the same from synchronous code: pybk.sync.LogMirror on one loop thread
            with src.writer() as w:
                last = w.append_many([b"fourth-%d" % i for i in range(30)])[-1]
            with pybk.sync.LogMirror(a.metadata, b.metadata, "orders", lag_interval=0.05,
                                     batch_records=9) as m:
                m.start()
                _poll(lambda: m.stats.position == last, "the sync mirror to copy")
                m.stop()
                assert m.drain() == last and m.stats.lag_seconds == 0.0
            source, target = _records(ca), _records(cb)
            assert len(target) == 300
            assert [unframe(t.data).data for t in target] == [s.data for s in source]
            # a target written by something else: one line naming the cause, exit 1
            other = cb.namespace().create_log("other", ensemble_size=2, write_quorum=2,
                                              ack_quorum=2)
            with other.writer() as ow:
                ow.append(b"not a frame")
            r = subprocess.run(
                [sys.executable, "-m", "pybk", "log", "mirror", "--from", a.metadata, "--to",
                 b.metadata, "orders", "--to-log", "other", "--drain"],
                capture_output=True, timeout=WAIT)
            assert r.returncode == 1, r
            last_line = r.stderr.decode().strip().splitlines()[-1]
            assert last_line.startswith("pybk: error: MirrorError: the last record of log "
                                        "'other'"), last_line
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(WAIT)
        a.stop_all()
        b.stop_all()


def test_bad_mirror_arguments_are_bad_usage(tmp_path: Path) -> None:
    runner = CliRunner()
    db = tmp_path / "m.db"
    db.write_bytes(b"")
    ok = f"sqlite://{db}"
    cases = [
        (["--from", "foo://bar", "--to", ok, "x"], "Invalid value for '--from': bad metadata URI"),
        (["--from", ok, "--to", "sqlite://tmp/x", "x"], "Invalid value for '--to': bad metadata"),
        (["--from", f"sqlite://{tmp_path}/none.db", "--to", ok, "x"],
         "Invalid value for --from: "),
        (["--from", ok, "--to", ok, "x"], "name the same log"),
        (["--from", ok, "--to", ok, "../x"], "bad log name"),
        (["--to", ok, "x"], "Missing option '--from'"),
    ]
    for args, said in cases:
        r = runner.invoke(main, ["log", "mirror", *args])
        assert r.exit_code == 2, (args, r.output)
        assert said in r.output, (args, r.output)
