"""Shared helpers of the log-layer tests (tests/stream, tests/test_wal*): in-memory clusters of real
bookies (MemFileSystem + memory:// metadata) and a counting hook on the metadata store."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.metadata.memory import MemoryMetadataStore
from pybk.storage.memfs import MemFileSystem
from pybk.testing import HookedTransport

#: short timeouts; the explicit LAC default (0.2 s) is kept
FAST = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0,
                    long_poll_timeout=0.5)


class MetaOps:
    """A ``before_op`` hook of the memory store: counts operations and can hold writes of
    values (the log metadata) until released."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._open = asyncio.Event()
        self._open.set()
        self.held = 0
        self.hold_ops: set[str] = {"write_value"}

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def __call__(self, op: str, key: object) -> None:
        self.counts[op] = self.counts.get(op, 0) + 1
        if op in self.hold_ops and not self._open.is_set():
            self.held += 1
            try:
                await self._open.wait()
            finally:
                self.held -= 1


@asynccontextmanager
async def mem_cluster(
    bookies: int = 3, *, seed: int = 1, config: ClientConfig = FAST, **kwargs: Any
) -> AsyncIterator[LocalCluster]:
    kwargs.setdefault("metadata", MemoryMetadataStore())
    kwargs.setdefault("transport_wrapper", HookedTransport)  # cluster.transport.hooks
    cluster = LocalCluster("/cluster", bookies, fs=MemFileSystem(), rng=random.Random(seed),
                           client_config=config, **kwargs)
    async with cluster:
        yield cluster


@pytest.fixture
def make_cluster() -> Callable[..., Any]:
    return mem_cluster


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait (bounded) until ``predicate()`` holds, yielding to the loop between checks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        await asyncio.sleep(0.002)
