"""The garbage-collector settings pybk's entry points apply (``pybk.runtime.gctune``): never on
import, opt-in for an embedded cluster, and undone when the cluster closes."""

from __future__ import annotations

import gc
import subprocess
import sys

import pybk
from pybk.runtime.gctune import SERVER_GC_THRESHOLD, GcTuning, frozen_by_others
from pybk.storage import MemFileSystem


def test_importing_pybk_leaves_the_collector_alone() -> None:
    code = ("import gc; before = gc.get_threshold(), gc.get_freeze_count(); import pybk, "
            "pybk.cluster, pybk.wal, pybk.bench.writes; "
            "assert (gc.get_threshold(), gc.get_freeze_count()) == before, before")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def unfrozen_count() -> int:
    """The freeze count with nothing frozen, after a full collection: 0, except on 3.12,
    whose collections move the interpreter's immortal containers to the frozen generation."""
    gc.unfreeze()
    gc.collect()
    return gc.get_freeze_count()


def test_tuning_is_applied_once_and_restored() -> None:
    before = gc.get_threshold()
    immortal = unfrozen_count()
    assert not frozen_by_others()
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
    gc.collect()
    assert gc.get_freeze_count() == immortal


def test_frozen_by_others_sees_a_freeze_and_only_a_freeze() -> None:
    unfrozen_count()
    gc.collect()  # (3.12: the immortal containers are counted as frozen from here on)
    assert not frozen_by_others()
    gc.freeze()
    try:
        assert frozen_by_others()
    finally:
        gc.unfreeze()


def is_frozen(obj: object) -> bool:
    return not any(o is obj for o in gc.get_objects())  # (the frozen are not listed)


def test_a_freeze_made_by_someone_else_is_left_in_place() -> None:
    theirs: list[object] = []
    gc.freeze()
    try:
        assert is_frozen(theirs)
        tuning = GcTuning()
        tuning.apply()
        tuning.restore()
        assert is_frozen(theirs)
    finally:
        gc.unfreeze()
    assert not is_frozen(theirs)


async def test_local_cluster_tunes_only_when_asked_and_restores_at_close() -> None:
    before = gc.get_threshold()
    immortal = unfrozen_count()
    async with pybk.LocalCluster("/c", 3, fs=MemFileSystem(), metadata="memory://") as c:
        lh = await c.client().create_ledger(3, 2, 2)
        await lh.append(b"x")
        gc.collect()
        assert gc.get_threshold() == before and gc.get_freeze_count() == immortal
    async with pybk.LocalCluster("/c", 3, fs=MemFileSystem(), metadata="memory://",
                                 tune_gc=True) as c:
        assert gc.get_threshold() == SERVER_GC_THRESHOLD
        assert gc.get_freeze_count() > immortal
        lh = await c.client().create_ledger(3, 2, 2)
        assert await lh.append(b"x") == 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.collect()
    assert gc.get_freeze_count() == immortal
