"""Fixtures for the etcd tests: one real etcd member per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pybk.testing.etcd import EtcdCluster


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    """A one-member etcd; fails loudly (never skips) when etcd is missing."""
    with EtcdCluster(1) as cluster:
        yield cluster
