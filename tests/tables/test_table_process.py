"""``pybk table serve`` as a real process: the official client writes through it, the process
is killed with SIGKILL in the middle, a new one starts on the same directory, and every put
the client saw acknowledged is there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

bk_admin = pytest.importorskip("bookkeeper.admin")
bk_kv = pytest.importorskip("bookkeeper.kv")

from bookkeeper.types import StorageClientSettings  # noqa: E402

from pybk.server.processes import wait_file  # noqa: E402

pytestmark = pytest.mark.integration


def _serve(data: Path, ready: Path) -> tuple[subprocess.Popen[bytes], int]:
    ready.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    with open(data.parent / "serve.log", "ab") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "pybk", "table", "serve", "--path", str(data), "--port", "0",
             "--ready-file", str(ready)],
            env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        info = wait_file(ready, proc, data.parent / "serve.log", 60, "table server")
    except RuntimeError:
        proc.kill()
        raise
    return proc, int(info["port"])


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    proc.wait(timeout=30)


def test_sigkill_mid_writes_loses_no_acknowledged_put(tmp_path: Path) -> None:
    data, ready = tmp_path / "tables", tmp_path / "ready.json"
    proc, port = _serve(data, ready)
    acked: dict[bytes, bytes] = {}
    try:
        settings = StorageClientSettings(service_uri=f"bk://127.0.0.1:{port}")
        bk_admin.Client(storage_client_settings=settings).namespaces().create("app")
        bk_admin.Client(storage_client_settings=settings).namespace("app").create("state")
        tbl = bk_kv.Client(storage_client_settings=settings, namespace="app").table("state")
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer() -> None:
            i = 0
            while not stop.is_set():
                k, v = b"key-%d" % i, b"value-%d" % i
                try:
                    tbl.put(k, v)
                except Exception as exc:  # the server died: this put's outcome is unknown
                    errors.append(exc)
                    return
                acked[k] = v
                i += 1

        t = threading.Thread(target=writer)
        t.start()
        deadline = time.monotonic() + 60
        while len(acked) < 150 and t.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(acked) >= 150, errors
        _stop(proc, signal.SIGKILL)  # mid-writes
        stop.set()
        t.join(timeout=120)
        assert not t.is_alive()
    finally:
        _stop(proc, signal.SIGKILL)
    proc, port = _serve(data, ready)
    try:
        settings = StorageClientSettings(service_uri=f"bk://127.0.0.1:{port}")
        tbl2: Any = bk_kv.Client(storage_client_settings=settings, namespace="app").table("state")
        for k, v in acked.items():
            kv = tbl2.get(k)
            assert kv is not None and kv.value == v, k
        tbl2.put(b"after", b"restart")
        assert tbl2.get(b"after").value == b"restart"
    finally:
        _stop(proc, signal.SIGTERM)
    assert proc.returncode == 0
