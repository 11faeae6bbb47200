"""pytest plugin (entry point ``pytest11``): fixtures for testing code that uses pybk.

Kept cheap to import: it loads in every pytest run where pybk is installed, so heavy modules
are imported inside the fixtures. It needs no other plugin: every fixture here is a plain
(synchronous) fixture, so it works whether or not pytest-asyncio is installed.

Design notes: docs/internals.md, "pybk/testing/pytest_plugin.py".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from pybk.testing.simulated import SimTestCluster

__all__ = ["local_cluster", "pybk_seed", "sim_cluster", "sync_local_cluster"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pybk", "pybk simulation")
    group.addoption("--pybk-seed", type=int, default=None,
                    help="seed for pybk's simulated clusters (sim_cluster fixture); default 0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pybk_sim: a test that runs a simulated pybk cluster")


@pytest.fixture
def pybk_seed(request: pytest.FixtureRequest) -> int:
    """The simulation seed: ``--pybk-seed``, else 0 (a failing seed replays exactly)."""
    value = request.config.getoption("--pybk-seed", default=None)
    return 0 if value is None else int(value)


@pytest.fixture
def sim_cluster(pybk_seed: int) -> SimTestCluster:
    """A deterministic simulated 3-bookie cluster; ``.with_options(bookies=5)`` for others."""
    from pybk.testing.simulated import SimTestCluster

    return SimTestCluster(seed=pybk_seed)


@pytest.fixture
def local_cluster(tmp_path: Path) -> Any:
    """``local_cluster(bookies=3, **kwargs)`` -> an unstarted ``pybk.LocalCluster`` under
    ``tmp_path``, for ``async def`` tests (``async with local_cluster() as cluster:``)."""
    from pybk.cluster import LocalCluster

    counter = [0]

    def make(bookies: int = 3, **kwargs: Any) -> LocalCluster:
        counter[0] += 1
        return LocalCluster(tmp_path / f"pybk-cluster-{counter[0]}", bookies, **kwargs)

    return make


@pytest.fixture
def sync_local_cluster(tmp_path: Path) -> Iterator[Any]:
    """``sync_local_cluster(bookies=3, **kwargs)`` -> a started ``pybk.sync.LocalCluster``
    under ``tmp_path`` (keyword arguments: ``pybk.LocalCluster``'s), for plain tests; every
    cluster it made is closed when the test ends."""
    from pybk.sync import LocalCluster

    made: list[LocalCluster] = []

    def make(bookies: int = 3, **kwargs: Any) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"pybk-sync-cluster-{len(made) + 1}", bookies,
                               **kwargs)
        cluster.start()
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in reversed(made):
            cluster.close()
