"""Real BookKeeper and Pulsar data-loss bugs, replayed as named scenarios (tests/bug_replays.py,
each named by its upstream issue): each passes on pybk and, where a mutation switch
re-introduces the rule the bug broke, fails with it, violating the invariant that names the
loss.

Not replayed, and why (docs/simulation.md says the same): BK-4607 (GC deleting an entry log
whose header lies): the db engine's entry logs keep their ledger summaries in the checkpoint,
not in a header the collector trusts.
"""

from __future__ import annotations

import pytest
from bug_replays import REPLAYS, Replay

from pybk.sim.runner import run


def _id(r: Replay) -> str:
    return r.name


@pytest.mark.parametrize("replay", REPLAYS, ids=_id)
def test_replay_passes_on_pybk(replay: Replay) -> None:
    r = run(replay.seed, scenario=replay.scenario())
    assert r.ok, f"{replay.name} ({replay.url}): {replay.what}\n{r.report()}"
    assert sum(r.stats.faults.values()), f"{replay.name}: no fault was injected"
    for marker in replay.reaches:
        assert r.stats.coverage.get(marker), f"{replay.name} never reached {marker}"


@pytest.mark.parametrize("replay", [r for r in REPLAYS if r.mutation], ids=_id)
def test_replay_fails_when_the_rule_is_broken(replay: Replay) -> None:
    assert replay.mutation is not None
    r = run(replay.seed, scenario=replay.scenario(), mutations=(replay.mutation,))
    got = {v.invariant for v in r.violations}
    assert got & replay.expect, (
        f"{replay.name} with {replay.mutation}: expected one of {sorted(replay.expect)}, "
        f"got {sorted(got) or 'nothing'}\n{r.report()}")


def test_the_replays_cover_the_research_table() -> None:
    names = {r.name for r in REPLAYS}
    assert len(names) == len(REPLAYS)
    assert {"BK-2614", "BK-2908", "BK-1591", "BK-544", "BK-2612", "BK-4097", "BK-4651",
            "BK-3005", "BK-4462", "BK-4812", "BK-3329", "BK-4844", "BK-3956", "BK-4659",
            "BK-1067", "BK-1066", "Pulsar-7490", "Pulsar-20968", "BP-44", "BK-659"} <= names
