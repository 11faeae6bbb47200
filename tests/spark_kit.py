"""Helpers of the Spark tests (tests/spark): a cluster of bookie processes and synchronous
looks at its logs, ledgers and keys."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pybk
from pybk.logs import LogRecord


def pybk_cli(*args: str, timeout: float = 120.0) -> str:
    out = subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True,
                         text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"pybk {' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout.strip()


class Bookies:
    """A running cluster: its metadata URI, and synchronous looks at its logs and ledgers."""

    def __init__(self, root: Path, metadata: str) -> None:
        self.root = root
        self.metadata = metadata

    def run(self, coro: Any) -> Any:
        return asyncio.run(coro)

    async def _with_client(self, fn: Any) -> Any:
        async with pybk.Client(self.metadata) as client:
            return await fn(client)

    def ledgers(self) -> set[int]:
        return set(self.run(self._with_client(lambda c: c.list_ledgers())))

    def keys(self, prefix: str) -> list[str]:
        return list(self.run(self._with_client(lambda c: c.store.list_keys(prefix))))

    def wait_clean(self, before: set[int], logs: tuple[str, ...] = (),
                   timeout: float = 120.0) -> None:
        """Wait (bounded) until every ledger made since ``before`` is a segment of ``logs``
        and no task list is left: the tasks Spark cancelled when a job failed (or a query
        stopped) may still be running when ``save()`` raises, and clean up after themselves
        when they notice (pybk.spark.jobs)."""
        deadline = time.monotonic() + timeout

        def left() -> tuple[set[int], list[str]]:
            kept = {s.ledger_id for name in logs for s in self.segments(name)}
            return self.ledgers() - before - kept, self.keys("spark/tasks/")

        while any(left()):
            if time.monotonic() > deadline:
                raise AssertionError(f"left behind after {timeout}s (ledgers, task lists): "
                                     f"{left()}")
            threading.Event().wait(0.1)  # between two looks at the cluster

    def create_log(self, name: str, **knobs: Any) -> None:
        async def go(client: pybk.Client) -> None:
            ns = client.namespace()
            if not await ns.log_exists(name):
                await ns.create_log(name, **knobs)

        self.run(self._with_client(go))

    def segments(self, name: str) -> list[Any]:
        async def go(client: pybk.Client) -> list[Any]:
            return await (await client.namespace().open_log(name)).segments()

        return list(self.run(self._with_client(go)))

    def records(self, name: str) -> list[LogRecord]:
        """Every record of the log, read with the log layer's own reader."""

        async def go(client: pybk.Client) -> list[LogRecord]:
            log = await client.namespace().open_log(name)
            last = await log.last_position()
            if last is None:
                return []
            out: list[LogRecord] = []
            async with log.reader(stop_at=last) as reader:
                while batch := await reader.read_batch(5000):
                    out.extend(batch)
            return out

        return list(self.run(self._with_client(go)))
