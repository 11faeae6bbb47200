"""pytest plugin (entry point ``pytest11``): fixtures for testing code that uses pybk.

Kept cheap to import: it loads in every pytest run where pybk is installed, so heavy modules
are imported inside the fixtures.

* ``pybk_seed``: the seed for simulated runs (``--pybk-seed N``, default 0).
* ``sim_cluster``: a deterministic simulated cluster (:class:`pybk.testing.SimTestCluster`):
  ``sim_cluster.run(scenario)`` runs ``async def scenario(cluster)`` in virtual time.
* ``local_cluster``: a factory of real :class:`pybk.LocalCluster` objects under ``tmp_path``:
  ``async with local_cluster(bookies=3) as cluster: ...``.

See docs/simulation.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from pybk.testing.simulated import SimTestCluster

__all__ = [
    "local_cluster",
    "pybk_seed",
    "pytest_addoption",
    "pytest_configure",
    "sim_cluster",
]


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
    ``tmp_path`` (use it as ``async with``)."""
    from pybk.cluster import LocalCluster

    counter = [0]

    def make(bookies: int = 3, **kwargs: Any) -> LocalCluster:
        counter[0] += 1
        return LocalCluster(tmp_path / f"pybk-cluster-{counter[0]}", bookies, **kwargs)

    return make
