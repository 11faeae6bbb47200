"""Simulating a user's application: pybk.sim.check sweeps seeds over it with faults."""

from __future__ import annotations

import pytest
import sim_kv_app

from pybk import sim


def test_a_correct_application_passes_every_seed() -> None:
    report = sim.check(sim_kv_app.app, sim_kv_app.check, seeds=range(8), duration=20.0,
                       workers=2)
    assert report.seeds == 8 and report.ok, [(f.seed, f.violations) for f in report.failing]


def test_an_application_that_acknowledges_before_the_append_is_caught() -> None:
    report = sim.check(sim_kv_app.broken_app, sim_kv_app.check, seeds=range(12),
                       duration=20.0, workers=2)
    assert report.failing, "the broken application passed every seed"
    first = report.failing[0]
    assert any(v.startswith("U1 acknowledged puts lost") for v in first.violations)
    assert first.command.startswith("pybk.sim.check(sim_kv_app.broken_app, ")
    assert f"seeds=[{first.seed}]" in first.command
    # the command reproduces it: the same seed fails again, the same way
    again = sim.run_app(sim_kv_app.broken_app, sim_kv_app.check, first.seed, duration=20.0)
    assert not again.ok and again.report() == first.report


def test_a_check_that_raises_is_a_violation_and_bad_faults_are_refused() -> None:
    def bad_check(history: list[sim.Record]) -> list[str]:
        raise KeyError("oops")

    report = sim.check(sim_kv_app.app, bad_check, seeds=[0], duration=5.0)
    assert report.failing and "check raised KeyError" in report.failing[0].violations[0]
    with pytest.raises(ValueError):
        sim.check(sim_kv_app.app, sim_kv_app.check, seeds=[0], faults="no-such-fault")


def test_the_assertion_names_the_failing_seeds_and_how_to_reproduce_them() -> None:
    from pybk.testing import assert_app_survives

    assert_app_survives(sim_kv_app.app, sim_kv_app.check, seeds=range(2), duration=10.0)
    with pytest.raises(AssertionError, match=r"seeds failed:(.|\n)*reproduce: pybk\.sim\.check"):
        assert_app_survives(sim_kv_app.broken_app, sim_kv_app.check, seeds=range(12),
                            duration=20.0, workers=2)
