"""A log mirrored between two simulated clusters (``Workload(mirror=True)``): the source
cluster under the seed's faults, the mirror crashed at random moments; the target is always
a prefix of the source (MR1 after every crash, MR2 at the end) and a last mirror copies
everything. A mirror that resumes from what it saw acknowledged instead of from the target's
last record is caught."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

import pybk.sim.mirror
from pybk import sim
from pybk.logs.mirror import LogMirror
from pybk.logs.position import Position
from pybk.sim.workload import Workload

#: the mirror alone (no ledger or log workload), quick
MIRROR = Workload(mirror=True, writers=0, readers=0, recoverers=0, deletes=False,
                  log_writers=0, log_readers=0, autorecovery=False)


@pytest.mark.parametrize("seed", range(4))
def test_a_mirror_between_two_simulated_clusters_under_faults(seed: int) -> None:
    r = sim.run(seed, duration=15.0, workload=MIRROR)
    assert r.ok, r.report()
    done = [line for line in r.trace if "a last mirror copies the whole source: ok" in line]
    assert done, r.report()
    assert " 0 of 0 records" not in done[0]


class ResumesFromMemory(LogMirror):
    """The bug: a restart resumes after the last position acknowledged to the mirror (its
    memory), not after the target's last record: entries acknowledged by the target's
    bookies but not yet to the mirror are copied twice."""

    async def resume_position(self, writer: Any = None) -> Position | None:
        if writer is not None and self.stats.starts > 1:
            return self.stats.position
        return await super().resume_position(writer)


def test_the_checks_catch_a_mirror_resuming_from_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pybk.sim.mirror, "LogMirror", ResumesFromMemory)
    for seed in range(16):
        r = sim.run(seed, duration=15.0, workload=MIRROR)
        if not r.ok:
            assert {v.invariant for v in r.violations} & {"MR1", "MR2"}, r.report()
            return
    raise AssertionError("no seed of 16 caught a mirror resuming from its memory")


def test_the_mirror_workload_is_drawn_from_a_stream_of_its_own() -> None:
    assert not Workload().mirror
    assert not Workload.draw(random.Random(1)).mirror  # (no streams: none of the extras)
    drawn = [Workload.draw(random.Random(s), lambda name, s=s: random.Random(f"{s}:{name}"))
             for s in range(400)]
    assert 20 < sum(w.mirror for w in drawn) < 80  # (one in eight)
    without = [Workload.draw(random.Random(s)) for s in range(400)]
    assert [dataclasses.replace(w, mirror=False, log_cursors=0, log_offload=False,
                                log_tier_sweep=False, adv_writers=0, deferred_writers=0)
            for w in drawn] == without  # (the other draws stay where they were)


def test_a_mirror_run_is_deterministic() -> None:
    first = sim.run(3, duration=8.0, workload=MIRROR)
    assert sim.run(3, duration=8.0, workload=MIRROR).trace_hash == first.trace_hash
