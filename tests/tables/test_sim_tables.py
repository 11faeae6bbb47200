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


def test_the_table_workload_is_drawn_in_some_seeds_and_leaves_the_other_draws_alone() -> None:
    from pybk.sim.cluster import derive_rng

    assert Workload().table_clients == 0
    drawn = [Workload.draw(derive_rng(seed, "workload")) for seed in range(400)]
    assert 25 <= sum(w.table_clients > 0 for w in drawn) <= 75
    # (drawn last: a seed's rates and log processes are what they were before tables)
    # (the values seeds 0-2 drew before the table draw existed)
    assert [(w.add_rate, w.log_rate, w.log_writers) for w in drawn[:3]] == [
        (25.0, 3.0, 1), (12.0, 8.0, 0), (25.0, 8.0, 1)]


def test_table_server_crashes_are_drawn_only_for_table_servers_from_their_own_stream() -> None:
    """``crash_table_server`` events come from the seed's ``table-faults`` stream in the seeds
    with table servers (when the fault spec allows them): every other event of every seed
    stays where it was, and the swarm never draws the kind itself."""
    from pybk.sim.faults import WORKLOAD_KINDS, Faults
    from pybk.sim.runner import scenario_of
    from pybk.sim.scenario import draw_schedule
    from pybk.sim.tablefaults import KIND

    assert KIND in WORKLOAD_KINDS and KIND in Faults.all().kinds
    assert KIND in Faults.process().kinds and Faults.parse(KIND).kinds == (KIND,)
    tables = Workload(table_clients=3)
    drew = 0
    for seed in range(40):
        plain = scenario_of(seed)
        assert KIND not in plain.plan.events
        swarm = [e.describe() for e in draw_schedule(plain.plan, seed, plain.duration)]
        with_tables = scenario_of(seed, workload=tables)
        ours = [e for e in with_tables.events if e.kind == KIND]
        assert [e.describe() for e in with_tables.events if e.kind != KIND] == swarm
        assert [e.at for e in with_tables.events] == sorted(e.at for e in with_tables.events)
        if not plain.workload.table_clients:
            assert [e.describe() for e in plain.events] == swarm
        drew += bool(ours)
        assert not [e for e in scenario_of(seed, workload=tables,
                                           faults=Faults.parse("crash,partition")).events
                    if e.kind == KIND]
    assert drew == 40
