"""Shrinking a failing run: a seeded bug (a mutation switch) shrinks from a run with many
faults to a handful that still violate the same invariant, written as a scenario file that
``pybk simulate --replay`` runs again."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from pybk import sim
from pybk.sim.scenario import FORMAT, Scenario
from pybk.sim.shrink import ddmin, shrink

#: a seed the broken build fails on (searched once: the first of the CI seeds at this
#: duration that fails with the switch; the test checks it still does)
SEED, MUTATION, DURATION = 0, "ack_before_fsync", 15.0


def test_ddmin_finds_a_minimal_failing_subset() -> None:
    calls: list[list[int]] = []

    def fails(items: list[int]) -> bool:
        calls.append(items)
        return {3, 11} <= set(items)

    assert ddmin(list(range(20)), fails) == [3, 11]
    assert ddmin([1, 2], lambda items: True) == []
    assert len(calls) < 100


def test_a_seeded_bug_shrinks_to_a_handful_of_faults(tmp_path: Path) -> None:
    r = sim.run(SEED, duration=DURATION, mutations=(MUTATION,))
    assert not r.ok and r.scenario is not None, "the seeded bug is no longer caught here"
    invariant = r.violations[0].invariant
    before = len(r.scenario.events)
    assert before >= 8
    steps: list[str] = []
    result = shrink(r.scenario, invariant, max_runs=150, on_step=steps.append)
    print(f"{MUTATION}: {before} -> {result.events_after} faults in {result.runs} runs: {steps}")
    assert result.events_after <= 5 < before
    assert result.scenario.expect == invariant
    assert result.scenario.duration <= DURATION
    path = tmp_path / "shrunk.json"
    result.scenario.save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT and doc["mutations"] == [MUTATION]
    replayed = sim.run(0, scenario=Scenario.load(path))
    assert invariant in {v.invariant for v in replayed.violations}
    # without the broken build the same scenario passes: the faults alone lose nothing
    assert sim.run(0, scenario=Scenario.load(path).copy(mutations=())).ok


def test_the_command_line_saves_and_replays_a_scenario(tmp_path: Path) -> None:
    from pybk.cli import main

    path = tmp_path / "run.json"
    runner = CliRunner()
    saved = runner.invoke(main, ["simulate", "--seed", "3", "--duration", "5",
                                 "--save", str(path)])
    assert saved.exit_code == 0, saved.output
    replay = runner.invoke(main, ["simulate", "--replay", str(path)])
    assert replay.exit_code == 0, replay.output
    first = next(line for line in saved.output.splitlines() if line.startswith("trace hash"))
    again = next(line for line in replay.output.splitlines() if line.startswith("trace hash"))
    assert first.split()[2] == again.split()[2], "a replayed scenario is the same run"
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    refused = runner.invoke(main, ["simulate", "--replay", str(bad)])
    assert refused.exit_code == 2 and "not a scenario file" in refused.output
