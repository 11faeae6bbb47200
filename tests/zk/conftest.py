"""Fixtures for the metadata tests: one real ZooKeeper server for the whole session."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pybk.testing.metadata_backends import MetadataBackend, ZooKeeperBackend
from pybk.testing.zookeeper import ZooKeeperServer


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    """A standalone ZooKeeper; fails loudly (never skips) when Java or the jar is missing."""
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture
def zk_backend_factory(zk_server: ZooKeeperServer) -> Callable[[], MetadataBackend]:
    return lambda: ZooKeeperBackend(zk_server.hosts)
