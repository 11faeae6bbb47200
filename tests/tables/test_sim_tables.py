"""Table servers and clients in the simulator under the seed's faults (``Workload(
table_clients=3)``): every key's history linearizable, no revision reused, a last server
takes the range over in time."""

from __future__ import annotations

import pytest

from pybk import sim
from pybk.sim.workload import Workload


@pytest.mark.parametrize("seed", range(3))
def test_tables_under_faults(seed: int) -> None:
    r = sim.run(seed, duration=15.0,
                workload=Workload(table_clients=3, log_writers=0, log_readers=0))
    assert r.ok, r.report()
    assert any("a table server takes the range over and reads: ok" in line for line in r.trace)


def test_the_table_workload_is_off_unless_asked_for() -> None:
    assert Workload().table_clients == 0
    assert Workload.draw(__import__("random").Random(1)).table_clients == 0
