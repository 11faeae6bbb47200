"""The garbage-collector settings pybk's entry points apply (``pybk.runtime.gctune``): never on
import, opt-in for an embedded cluster, and undone when the cluster closes."""

from __future__ import annotations

import gc
import subprocess
import sys

import pybk
from pybk.runtime.gctune import SERVER_GC_THRESHOLD, GcTuning
from pybk.storage import MemFileSystem


def test_importing_pybk_leaves_the_collector_alone() -> None:
    code = ("import gc; before = gc.get_threshold(), gc.get_freeze_count(); import pybk, "
            "pybk.cluster, pybk.wal, pybk.bench.writes; "
            "assert (gc.get_threshold(), gc.get_freeze_count()) == before, before")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_tuning_is_applied_once_and_restored() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    tuning = GcTuning()
    tuning.apply()
    try:
        assert tuning.applied
        assert gc.get_threshold() == SERVER_GC_THRESHOLD
        frozen = gc.get_freeze_count()
        assert frozen > 0
        # A second apply changes nothing: it would freeze these new objects too. (Frozen
        # objects can still die by reference counting, so the count may only shrink.)
        fresh = [[] for _ in range(1000)]
        tuning.apply()
        assert gc.get_freeze_count() < frozen + len(fresh)
    finally:
        tuning.restore()
    assert not tuning.applied
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    tuning.restore()  # restoring twice is harmless
    assert gc.get_threshold() == before


def test_a_freeze_made_by_someone_else_is_left_in_place() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        tuning = GcTuning()
        tuning.apply()
        tuning.restore()
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()


async def test_local_cluster_tunes_only_when_asked_and_restores_at_close() -> None:
    before = gc.get_threshold()
    async with pybk.LocalCluster("/c", 3, fs=MemFileSystem(), metadata="memory://") as c:
        lh = await c.client().create_ledger(3, 2, 2)
        await lh.append(b"x")
        assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    async with pybk.LocalCluster("/c", 3, fs=MemFileSystem(), metadata="memory://",
                                 tune_gc=True) as c:
        assert gc.get_threshold() == SERVER_GC_THRESHOLD and gc.get_freeze_count() > 0
        lh = await c.client().create_ledger(3, 2, 2)
        assert await lh.append(b"x") == 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
