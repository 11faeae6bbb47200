"""A cluster of real bookie processes on loopback, for the multi-process tests and benchmarks.

Each bookie is ``python -m pybk bookie --port 0`` with its own data directory under ``root``,
SQLite metadata shared through ``root/metadata.db``. Readiness is the bookie's ready file
(written after it registered), waited on with a bound; processes are stopped by PID.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

from pybk.cli import spawn_bookie, wait_ready


class ProcCluster:
    def __init__(self, root: Path, bookies: int = 3, *, extra_args: list[str] | None = None):
        self.root = Path(root)
        self.metadata = f"sqlite://{self.root / 'metadata.db'}"
        self.ids = [f"bookie-{i}" for i in range(1, bookies + 1)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.addresses: dict[str, str] = {}
        self.extra_args = extra_args or []

    async def start(self, *bookie_ids: str, timeout: float = 60.0) -> None:
        """Start (or restart) bookies and wait until each has registered."""
        ids = list(bookie_ids) or self.ids
        for bookie_id in ids:
            self.procs[bookie_id] = spawn_bookie(
                self.root, bookie_id, self.metadata, extra_args=self.extra_args
            )
        for bookie_id in ids:
            info = await asyncio.to_thread(
                wait_ready, self.root, bookie_id, self.procs[bookie_id], timeout
            )
            self.addresses[bookie_id] = info["address"]

    def kill9(self, bookie_id: str) -> None:
        proc = self.procs[bookie_id]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def sigterm(self, bookie_id: str) -> None:
        os.kill(self.procs[bookie_id].pid, signal.SIGTERM)

    async def wait_exit(self, bookie_id: str, timeout: float = 30.0) -> int:
        proc = self.procs[bookie_id]
        return await asyncio.to_thread(proc.wait, timeout)

    def log(self, bookie_id: str) -> str:
        return (self.root / "logs" / f"{bookie_id}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        """Teardown: SIGKILL whatever is still running (bounded)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            proc.wait(max(0.1, deadline - time.monotonic()))
