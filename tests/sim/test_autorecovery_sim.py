"""Auto-recovery in simulated runs (pybk/sim/autorecovery.py): it runs, it converges, it
re-replicates a bookie lost for good, and its invariants can fail."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from pybk import sim
from pybk.sim.runner import scenario_of
from pybk.sim.workload import Workload
from pybk.testing import mutations


def test_auto_recovery_runs_under_faults_and_re_replicates_a_lost_bookie() -> None:
    coverage: Counter[str] = Counter()
    for seed in range(6):
        result = sim.run(seed=seed, duration=20.0)
        assert result.ok, result.report()
        coverage.update({k: v for k, v in result.stats.coverage.items()
                         if k.startswith("autorecovery_")})
        lines = "\n".join(result.trace)
        if "(disk wiped); decommissioning" in lines:
            assert "liveness decommission" in lines
    # it did what it is there for, in most of these seeds
    assert coverage["autorecovery_bookie_lost"] >= 3, coverage
    assert coverage["autorecovery_fully_replicated"] == coverage["autorecovery_bookie_lost"]
    assert coverage["autorecovery_slot_swapped"] >= 20, coverage
    assert coverage["autorecovery_instance_crashed"] >= 6, coverage


def test_a_run_without_auto_recovery_has_none_of_it() -> None:
    result = sim.run(seed=3, duration=10.0, workload=Workload(autorecovery=False))
    assert result.ok, result.report()
    assert not any(k.startswith("autorecovery_") for k in result.stats.coverage)
    assert "autorecovery" not in "\n".join(result.trace)


def test_the_same_seed_gives_the_same_trace_with_auto_recovery() -> None:
    a = sim.run(seed=11, duration=15.0)
    b = sim.run(seed=11, duration=15.0)
    assert a.trace_hash == b.trace_hash


def test_the_broken_build_is_caught_by_r1_at_the_swap() -> None:
    # (seed 2's own load without the caller-chosen-id and deferred-sync writers it also
    # draws: the run this test was written for)
    load = replace(scenario_of(2).workload, adv_writers=0, deferred_writers=0)
    result = sim.run(seed=2, duration=15.0, workload=load,
                     mutations=(mutations.ENSEMBLE_BEFORE_COPY_DURABLE,))
    codes = {v.invariant for v in result.violations}
    assert "R1" in codes, result.report()
    clean = sim.run(seed=2, duration=15.0, workload=load)
    assert clean.ok, clean.report()
