"""A real ``pybk bookie`` process to attack: started with its metrics port, watched through
/proc (peak RSS, descriptors, TCP states) and its metrics, stopped by PID with a bound.

Shared by tests/tcp/test_abuse.py and benchmarks/abuse.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from pybk.cli import spawn_bookie, wait_ready

_TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


class BookieUnderTest:
    """One ``pybk bookie`` (id ``b1``) under ``root`` with SQLite metadata."""

    def __init__(self, root: Path, *args: str, open_files: int | None = None,
                 bookie_id: str = "b1") -> None:
        self.root = Path(root)
        self.bookie_id = bookie_id
        self.metadata = f"sqlite://{self.root / 'metadata.db'}"
        self.args = ["--metrics-port", "0", *args]
        self.open_files = open_files
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}

    # -- life cycle ------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> BookieUnderTest:
        self.proc = spawn_bookie(self.root, self.bookie_id, self.metadata,
                                 extra_args=self.args, open_files=self.open_files)
        self.info = wait_ready(self.root, self.bookie_id, self.proc, timeout)
        return self

    async def astart(self, timeout: float = 60.0) -> BookieUnderTest:
        return await asyncio.to_thread(self.start, timeout)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def address(self) -> str:
        return str(self.info["address"])

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def stop(self, timeout: float = 30.0) -> tuple[float, int | None]:
        """SIGTERM; (seconds until it exited, exit code), SIGKILL after ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0, None if self.proc is None else self.proc.returncode
        began = time.monotonic()
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        return time.monotonic() - began, code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        path = self.root / "logs" / f"{self.bookie_id}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- what it holds ---------------------------------------------------------------------

    def status(self, field: str) -> int:
        """A /proc/<pid>/status field in bytes (VmRSS, VmHWM) or as a count."""
        text = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(rf"^{field}:\s+(\d+)\s*(kB)?", text, re.M)
        assert match, field
        return int(match.group(1)) * (1024 if match.group(2) else 1)

    def rss(self) -> int:
        return self.status("VmRSS")

    def peak_rss(self) -> int:
        return self.status("VmHWM")

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def tcp_states(self) -> dict[str, int]:
        """States of the TCP sockets on the bookie's port (its side), by name."""
        port = f"{self.port:04X}"
        counts: dict[str, int] = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError):
                for line in Path(table).read_text().splitlines()[1:]:
                    fields = line.split()
                    if fields[1].rsplit(":", 1)[1] == port:
                        name = _TCP_STATES.get(fields[3], fields[3])
                        counts[name] = counts.get(name, 0) + 1
        return counts

    def metrics(self) -> dict[str, float]:
        """The bookie's prometheus metrics: ``{"pybk_server_connections": 3.0,
        "event:accepted": 7.0, ...}`` (events by their label)."""
        url = f"http://{self.info['metrics']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            event = re.fullmatch(r'pybk_server_events_total\{event="([^"]+)"\}', name)
            found[f"event:{event.group(1)}" if event else name] = float(value)
        return found

    async def ametrics(self) -> dict[str, float]:
        return await asyncio.to_thread(self.metrics)

    def __enter__(self) -> BookieUnderTest:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


async def wait_for(cond: Any, timeout: float, what: str, poll: float = 0.05) -> Any:
    """Wait (bounded) until ``await cond()`` (or ``cond()``) is truthy; return its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(poll)
