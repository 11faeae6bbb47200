"""The simulator drives the db storage engine (``SimConfig(storage="db")``) on its simulated
disk: quiet, and with the seed's faults (crashes, torn writes, partitions), no invariant
broken; the entry logs' broken sync (``db_log_unsynced``) is caught."""

from __future__ import annotations

import dataclasses

import pytest

from pybk import sim
from pybk.sim.configs import SimConfig
from pybk.sim.runner import run, scenario_of
from pybk.sim.scenario import Scenario

LOAD = sim.Workload(readers=0, recoverers=0, deletes=False, log_writers=0, log_readers=0,
                    add_rate=40.0)


def test_a_quiet_run_on_the_db_engine_flushes_and_passes() -> None:
    sc = Scenario(seed=3, duration=6.0, topology=(3, 3, 2), bookies=3,
                  config=SimConfig(storage="db", checkpoints=True), workload=LOAD,
                  plan=sim.FaultPlan(), events=[], faults_spec="none")
    r = run(3, scenario=sc)
    assert r.ok, r.report()
    assert r.stats.coverage.get("config_storage_db") == 1
    assert "storage=db" in r.trace[0]


@pytest.mark.parametrize("seed", [1, 2, 5, 8])
def test_seeds_with_faults_pass_on_the_db_engine(seed: int) -> None:
    drawn = scenario_of(seed, duration=12.0)
    sc = dataclasses.replace(drawn, config=dataclasses.replace(drawn.config, storage="db"))
    r = run(seed, scenario=sc)
    assert r.ok, r.report()


def test_the_storage_knob_is_checked() -> None:
    with pytest.raises(ValueError, match="storage must be journal or db"):
        SimConfig(storage="rocks")
    assert SimConfig.from_doc(SimConfig(storage="db").to_doc()).storage == "db"


def test_a_crash_lands_in_a_background_flush_of_the_write_cache() -> None:
    """Half the timed crashes of a db-engine bookie aim at a flush of its write cache (the
    entry log written, the checkpoint not yet): nothing acknowledged is lost."""
    drawn = scenario_of(1, duration=30.0)
    sc = dataclasses.replace(drawn, config=dataclasses.replace(drawn.config, storage="db"))
    r = run(1, scenario=sc)
    assert r.ok, r.report()
    assert r.stats.coverage.get("crash_in_flush_window", 0) >= 1
    assert r.stats.coverage.get("crash_during_db_flush", 0) >= 1
