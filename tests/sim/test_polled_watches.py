"""The simulator's switch for metadata watches delivered as real backends deliver them."""

from __future__ import annotations

from bug_replays import REPLAYS

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


def test_the_default_sweep_polls_watches_in_a_share_of_seeds_drawn_on_their_own() -> None:
    """Polled watches and the later fault kinds are drawn from streams of their own: a seed
    that draws neither keeps the plan and schedule it had before they existed."""
    from pybk.sim.cluster import derive_rng
    from pybk.sim.faults import LATER_KINDS, POLLED_SHARE

    faults = Faults.all()
    polled = unchanged = 0
    for seed in range(150):
        plan = scenario_of(seed, faults=faults).plan
        before = faults.swarm(derive_rng(seed, "swarm"))  # (what a seed drew before)
        polled += plan.polled_watches
        if not set(LATER_KINDS) & set(plan.events):
            assert (plan.events, plan.weights, plan.drop, plan.mean_interval) == (
                before.events, before.weights, before.drop, before.mean_interval), seed
            unchanged += 1
    assert abs(polled / 150 - POLLED_SHARE) < 0.1, polled
    assert 20 < unchanged < 100, unchanged
    assert not scenario_of(3, faults=Faults.none()).plan.polled_watches


def test_the_auditors_second_look_covers_a_watch_baseline_taken_at_the_first_poll() -> None:
    """The lost-auditor-host replay with ``watch_baseline_at_first_poll``: the registry watch
    misses the lapse, but the new auditor looks again once ``sync_watches`` says its watches
    are established (the memory store waits for their first poll), and R3 holds."""
    replay = next(r for r in REPLAYS if r.name == "lost-auditor-host")
    result = sim.run(replay.seed, scenario=replay.scenario(),
                     mutations=("watch_baseline_at_first_poll",))
    assert result.ok, result.report()
    assert result.stats.coverage.get("auditor_host_lapse_aimed")


def test_the_old_watch_behaviour_put_back_is_found_by_a_default_sweep(monkeypatch) -> None:
    """The world before the watch guarantee: a polled watch's baseline taken at its first poll
    (the switch) and no ``sync_watches`` for the auditor to look again after (patched to
    answer at once that nothing was left to establish, as a store without it). A default
    sweep of the first 100 CI seeds finds the lost-auditor scenario (R3, the lapse aimed
    just after the new auditor's first look), and the same seed passes with the watch
    guarantee alone: the watch, not the second look, is what the switch breaks."""
    from pybk.metadata.memory import MemoryMetadataStore
    from pybk.sim.sweep import CI_DURATION, CI_FAULTS, CI_SEEDS, find_violation, run_seed

    async def no_second_look(self: MemoryMetadataStore) -> bool:
        return False

    monkeypatch.setattr(MemoryMetadataStore, "sync_watches", no_second_look)
    found = find_violation(list(CI_SEEDS)[:100], mutations=("watch_baseline_at_first_poll",),
                           invariants={"R3"})
    assert found is not None, "no seed of the first 100 found the lost auditor's bookie"
    assert found.coverage.get("auditor_host_lapse_aimed"), found.report
    clean = run_seed(found.seed, CI_FAULTS, CI_DURATION, None, ())
    assert clean.ok, f"seed {found.seed} fails without the switch too: {clean.invariants}"
