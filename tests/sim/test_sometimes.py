"""Sometimes points: protocol code names its rare paths; a sweep says which no seed reached."""

from __future__ import annotations

import asyncio

import pytest

from pybk import sim
from pybk.runtime import sometimes
from pybk.sim.runner import SOMETIMES
from pybk.sim.sweep import sweep

NEVER = sometimes.point("test.never_reached", "declared by a test and called by nothing")


def test_a_point_counts_only_inside_a_recording_and_in_tasks_made_there() -> None:
    p = sometimes.point("test.counted", "a test point")
    p()  # outside any recording: nothing happens, nothing raises

    async def main() -> None:
        p()
        await asyncio.get_running_loop().create_task(asyncio.sleep(0, p()))

    with sometimes.recording() as hits:
        asyncio.run(main())
    assert hits["test.counted"] == 2
    p()
    assert hits["test.counted"] == 2


def test_a_name_is_declared_once_with_a_reason() -> None:
    sometimes.point("test.once", "why")
    assert sometimes.point("test.once", "why").name == "test.once"  # the same declaration
    with pytest.raises(ValueError, match="twice"):
        sometimes.point("test.once", "another reason")
    with pytest.raises(ValueError):
        sometimes.point("test.no_reason", "")


def test_a_run_counts_the_points_protocol_code_hit() -> None:
    r = sim.run(2, duration=30.0, faults=sim.Faults.all())
    hit = {k.removeprefix(SOMETIMES) for k in r.stats.coverage if k.startswith(SOMETIMES)}
    assert hit and hit <= set(sometimes.declared())
    assert "client.ensemble_change" in sometimes.declared()


def test_a_sweep_lists_the_points_no_seed_reached() -> None:
    summary = sweep(range(2), faults="all", duration=10.0, workers=1)
    never = summary.never_reached()
    assert NEVER.name in never
    reached = {k.removeprefix(SOMETIMES) for k in summary.coverage() if k.startswith(SOMETIMES)}
    assert reached and not reached & set(never)
