"""Starting and stopping bookie processes: what ``pybk cluster`` and the tests use.

A started bookie is a detached ``pybk bookie`` process with its log and ready file under a
root directory; it is stopped by PID (SIGTERM, then SIGKILL after a bound), and a recorded PID
is checked against ``/proc/<pid>/cmdline`` first so a reused PID is never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["is_our_bookie", "pid_alive", "spawn_bookie", "stop_pid", "wait_ready"]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def is_our_bookie(pid: int, bookie_id: str) -> bool:
    """Guard against PID reuse: the process must be a pybk bookie with this id."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return pid_alive(pid)
    return b"bookie" in args and bookie_id.encode() in args


def spawn_bookie(
    root: Path,
    bookie_id: str,
    metadata: str,
    *,
    port: int = 0,
    extra_args: list[str] | None = None,
    open_files: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``pybk bookie`` as a detached process with its log and ready file under root;
    ``open_files``: run it under that RLIMIT_NOFILE, soft and hard (tests of descriptor
    exhaustion)."""
    data = root / "bookies" / bookie_id
    logs = root / "logs"
    run_dir = root / "run"
    # the owner's alone: data and master keys (docs/operations.md)
    for d in (root, root / "bookies", data, logs, run_dir):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    ready = run_dir / f"{bookie_id}.ready"
    ready.unlink(missing_ok=True)
    args = [
        sys.executable, "-m", "pybk", "bookie",
        "--data", str(data),
        "--port", str(port),
        "--bookie-id", bookie_id,
        "--metadata", metadata,
        "--ready-file", str(ready),
        *(extra_args or []),
    ]  # fmt: skip
    with open(logs / f"{bookie_id}.log", "ab") as log:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=None if open_files is None else _limit_open_files(open_files),
        )


def spawn_table_server(root: Path, metadata: str, *, port: int = 4181,
                       extra_args: list[str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``pybk table serve`` as a detached process (log ``logs/tables.log``, ready file
    ``run/tables.ready`` holding its host, port and pid)."""
    logs, run_dir = root / "logs", root / "run"
    for d in (logs, run_dir):
        d.mkdir(parents=True, exist_ok=True)
    ready = run_dir / "tables.ready"
    ready.unlink(missing_ok=True)
    args = [sys.executable, "-m", "pybk", "table", "serve", "--metadata", metadata,
            "--port", str(port), "--ready-file", str(ready), *(extra_args or [])]
    with open(logs / "tables.log", "ab") as log:
        return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)


def wait_file(path: Path, proc: subprocess.Popen[bytes] | None, log: Path, timeout: float,
              what: str | None = None) -> dict[str, Any]:
    """Wait (bounded) for a process's JSON ready file; RuntimeError naming ``what`` (default:
    the file), whether the process exited or the time ran out, and its log's last lines."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            info: dict[str, Any] = json.loads(path.read_text())
            return info
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
    why = "exited" if proc is not None and proc.poll() is not None else f"not ready in {timeout}s"
    raise RuntimeError(f"{what or path.name} {why}; log tail: " + " | ".join(tail))


def is_our_table_server(pid: int) -> bool:
    """Guard against PID reuse: the process must be ``pybk table serve``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return pid_alive(pid)
    return b"table" in args and b"serve" in args


def _limit_open_files(n: int) -> Any:
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return limit


def wait_ready(
    root: Path, bookie_id: str, proc: subprocess.Popen[bytes] | None, timeout: float
) -> dict[str, Any]:
    """Wait (bounded) for a bookie's ready file; RuntimeError with its log if it died."""
    return wait_file(root / "run" / f"{bookie_id}.ready", proc,
                     root / "logs" / f"{bookie_id}.log", timeout, f"bookie {bookie_id}")


def stop_pid(pid: int, timeout: float) -> str:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; returns how it ended."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "already gone"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return "stopped"
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped"
    return "killed"


