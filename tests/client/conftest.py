"""Fixtures: in-memory clusters of real bookies (MemFileSystem + memory metadata)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.storage.memfs import MemFileSystem
from pybk.testing import HookedTransport

#: short timeouts: a test that expects a timeout waits this long, nothing else does
FAST = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0)

ClusterFactory = Callable[..., Any]


@asynccontextmanager
async def mem_cluster(
    bookies: int | Sequence[str] = 3, *, seed: int = 1, **kwargs: Any
) -> AsyncIterator[LocalCluster]:
    kwargs.setdefault("client_config", FAST)
    kwargs.setdefault("metadata", "memory://")
    kwargs.setdefault("fs", MemFileSystem())
    kwargs.setdefault("transport_wrapper", HookedTransport)  # cluster.transport.hooks
    cluster = LocalCluster("/cluster", bookies, rng=random.Random(seed), **kwargs)
    async with cluster:
        yield cluster


@pytest.fixture
def make_cluster() -> ClusterFactory:
    return mem_cluster


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait (bounded) until ``predicate()`` holds, yielding to the loop between checks."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        await asyncio.sleep(0.001)


class MetaGate:
    """A ``before_op`` hook for MemoryMetadataStore: counts ledger writes and can hold them.

    ``gate.close()`` makes the next ``write_ledger`` calls wait until ``gate.open()``;
    ``gate.writes`` counts every write_ledger attempt.
    """

    def __init__(self) -> None:
        import asyncio

        self.writes = 0
        self.waiting = 0
        self._open = asyncio.Event()
        self._open.set()
        self.on_write: Callable[[], Any] | None = None

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def __call__(self, op: str, key: object) -> None:
        if op != "write_ledger":
            return
        self.writes += 1
        if self.on_write is not None:
            result = self.on_write()
            if result is not None:
                await result
        if not self._open.is_set():
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
