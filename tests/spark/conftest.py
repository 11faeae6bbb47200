"""Fixtures of the Spark tests: one SparkSession and one cluster of real bookie processes for
the whole session, and helpers that look at a log and at the ledgers a job left behind.

The session is ``local[2,3]``: two cores, and a failed task is retried up to 3 attempts (the
exactly-once tests need retries; plain ``local[2]`` never retries). The UI is off, the driver
JVM has the JIT flags of the research notes, and ``PYSPARK_PYTHON`` is this interpreter. These
tests never skip: ``make test`` installs Java and the ``[spark]`` extra, so a missing piece is
a failure. The bookies are ``pybk bookie`` processes started by ``pybk cluster up`` (TCP on
loopback, SQLite metadata under a temp dir) and stopped by ``pybk cluster down``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pybk
from pybk.stream import LogRecord


def _pybk(*args: str, timeout: float = 120.0) -> str:
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


@pytest.fixture(scope="session")
def bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bookies]:
    root = tmp_path_factory.mktemp("spark-bookies")
    metadata = _pybk("cluster", "up", "--root", str(root), "--bookies", "3")
    try:
        yield Bookies(root, metadata.splitlines()[-1])
    finally:
        _pybk("cluster", "down", "--root", str(root))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers run this venv's interpreter
    import pybk.spark

    session = pybk.spark.local_session("local[2,3]", "pybk-tests", log_level="OFF")
    try:
        yield session
    finally:
        session.stop()
