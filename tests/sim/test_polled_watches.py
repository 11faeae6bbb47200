"""The simulator's switch for metadata watches delivered as real backends deliver them."""

from __future__ import annotations

from pybk import sim
from pybk.sim.faults import Faults
from pybk.sim.runner import scenario_of


def test_the_switch_round_trips_through_the_faults_spec_and_the_plan() -> None:
    faults = Faults.parse("crash,polled_watches")
    assert faults.polled_watches and faults.kinds == ("crash",)
    assert Faults.parse(faults.spec()) == faults
    assert not Faults.parse("crash").polled_watches
    scenario = scenario_of(3, faults=faults)
    assert scenario.plan.polled_watches
    assert "polled_watches" in scenario.plan.describe()
    # the switch draws nothing from the seed's other streams: the same plan otherwise
    plain = scenario_of(3, faults=Faults.parse("crash"))
    assert plain.plan.events == scenario.plan.events and plain.events == scenario.events


def test_runs_with_polled_watches_pass() -> None:
    for seed in (0, 1):
        result = sim.run(seed, faults=Faults.parse("all,polled_watches"), duration=10.0)
        assert result.ok, result.report()
