"""The configuration swarm runs what it says: each journal mode, preallocated segments, delta
checkpoints and the batched add path take their own code paths in a simulated run (the CI
sweep's coverage table shows each drawn; test_ci_sweep.py requires it)."""

from __future__ import annotations

import pytest

from pybk import sim
from pybk.sim.configs import JOURNAL_MODES, SimConfig
from pybk.sim.runner import run
from pybk.sim.scenario import Scenario

LOAD = sim.Workload(readers=0, recoverers=0, deletes=False, log_writers=0, log_readers=0,
                    add_rate=40.0)


def quiet_run(config: SimConfig, seed: int = 3) -> sim.SimResult:
    sc = Scenario(seed=seed, duration=6.0, topology=(3, 3, 2), bookies=3, config=config,
                  workload=LOAD, plan=sim.FaultPlan(), events=[], faults_spec="none")
    return run(seed, scenario=sc)


@pytest.mark.parametrize("mode", JOURNAL_MODES)
def test_each_journal_mode_runs_its_own_sync_path(mode: str) -> None:
    r = quiet_run(SimConfig(journal=mode, sync_delay=0.01, batched_adds=True))
    assert r.ok, r.report()
    cov = r.stats.coverage
    assert cov.get(f"config_journal_{mode}") == 1
    inline = cov.get("journal_inline_syncs", 0)
    overlapped = cov.get("journal_batches_overlapped", 0) + cov.get("journal_batches_splits", 0)
    assert (inline > 0) == (mode in ("inline", "bookie")), cov
    assert (overlapped > 0) == (mode in ("overlapped", "bookie")), cov
    assert r.trace[0].split("journal=")[1].startswith(mode)


def test_preallocated_segments_and_delta_checkpoints_run() -> None:
    r = quiet_run(SimConfig(preallocate=True, checkpoints=True))
    assert r.ok, r.report()
    cov = r.stats.coverage
    assert cov.get("journal_segments_preallocated", 0) > 0
    assert cov.get("journal_segments_rotations", 0) > 0
    assert cov.get("checkpoint_deltas", 0) > 0


def test_batched_adds_take_the_append_many_path() -> None:
    r = quiet_run(SimConfig(batched_adds=True))
    assert r.ok, r.report()
    assert any("batched" in line for line in r.trace if " create L" in line)
    assert r.stats.coverage.get("config_adds_batched") == 1


def test_every_knob_is_drawn_both_ways_over_a_few_seeds() -> None:
    drawn = [SimConfig.draw(seed) for seed in range(40)]
    assert {c.journal for c in drawn} == set(JOURNAL_MODES)
    for knob in ("preallocate", "checkpoints", "batched_adds", "parallel_long_polls"):
        assert {getattr(c, knob) for c in drawn} == {True, False}, knob


def test_long_polls_run_one_bookie_at_a_time_or_all_at_once() -> None:
    """The tailing reader's long polls go out as the seed drew: the same quiet run moves far
    fewer messages with sequential polls (one bookie per poll of a 5-bookie ensemble, not
    five), and its reader still follows the writer with long polls that bring entries."""
    tailing = sim.Workload(readers=1, recoverers=0, deletes=False, log_writers=0,
                           log_readers=0, add_rate=12.0)
    results = {}
    for parallel in (True, False):
        sc = Scenario(seed=3, duration=6.0, topology=(5, 3, 2), bookies=5,
                      config=SimConfig(parallel_long_polls=parallel), workload=tailing,
                      plan=sim.FaultPlan(), events=[], faults_spec="none")
        r = run(3, scenario=sc)
        assert r.ok, r.report()
        mode = "parallel" if parallel else "sequential"
        assert r.stats.coverage.get(f"config_long_polls_{mode}") == 1
        assert r.stats.coverage.get("long_poll_hit", 0) >= 10, r.stats.coverage
        assert f"long_polls={mode}" in r.trace[0]
        results[parallel] = r.stats
    hits = results[True].coverage["long_poll_hit"]
    assert results[True].messages - results[False].messages >= 3 * hits, (
        results[True].messages, results[False].messages, hits)


def test_the_auditor_s_periodic_check_is_drawn_short_or_production_s_hour() -> None:
    drawn = [SimConfig.draw(seed) for seed in range(40)]
    assert {c.auditor_bookie_check for c in drawn} == {5.0, 3600.0}
    long = next(c for c in drawn if c.long_audits)
    assert "auditor_check=3600s" in long.describe()
    assert "config_auditor_check_long" in long.coverage()
    assert "config_auditor_check_short" in SimConfig().coverage()
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="auditor_bookie_check"):
            SimConfig(auditor_bookie_check=bad)


def test_the_lone_writer_paths_run() -> None:
    """Issue 41's paths in a simulated run: the immediate LAC after a delay (as the
    synchronous WAL's), explicit LAC records held for the next journal batch, and a log
    writer's records sent at once by ``append_now``."""
    load = sim.Workload(readers=0, recoverers=0, deletes=False, log_writers=1, log_readers=0,
                        add_rate=40.0)
    sc = Scenario(seed=3, duration=6.0, topology=(3, 3, 2), bookies=3,
                  config=SimConfig(lac_delay=0.001), workload=load, plan=sim.FaultPlan(),
                  events=[], faults_spec="none")
    r = run(3, scenario=sc)
    assert r.ok, r.report()
    cov = r.stats.coverage
    assert cov.get("config_lac_delayed") == 1, cov
    assert cov.get("journal_records_held_lazily", 0) > 0, cov
    assert cov.get("log_records_sent_alone", 0) > 0, cov
    assert "lac_delay=0.001" in r.trace[0]
