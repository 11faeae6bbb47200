"""Fixtures: in-memory clusters of real bookies (MemFileSystem + memory metadata)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from pybk.cluster import LocalCluster
from pybk.replication.context import ClientConfig
from pybk.storage.memfs import MemFileSystem

#: short timeouts: a test that expects a timeout waits this long, nothing else does
FAST = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0)

ClusterFactory = Callable[..., Any]


@asynccontextmanager
async def mem_cluster(
    bookies: int | Sequence[str] = 3, *, seed: int = 1, **kwargs: Any
) -> AsyncIterator[LocalCluster]:
    kwargs.setdefault("client_config", FAST)
    cluster = LocalCluster(
        "/cluster", bookies, metadata="memory://", fs=MemFileSystem(), rng=random.Random(seed),
        **kwargs,
    )
    async with cluster:
        yield cluster


@pytest.fixture
def make_cluster() -> ClusterFactory:
    return mem_cluster
