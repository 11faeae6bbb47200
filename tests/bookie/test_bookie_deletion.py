"""Ledger deletion and garbage collection on a bookie: a deleted ledger refuses adds across
restarts; ``collect_garbage`` asks twice before deleting (rule R8) and compaction frees
segments."""

from __future__ import annotations

from pybk.bookie import BookieConfig
from pybk.wire import Status, master_key


async def test_delete_ledger_rejects_adds_and_survives_restart(harness):
    await harness.add(1, 0)
    await harness.add(2, 0)
    await harness.bookie.delete_ledger(1)
    assert (await harness.read(1, 0))[0] == Status.NO_SUCH_LEDGER
    assert await harness.add(1, 1) == Status.FENCED
    await harness.crash_restart()
    assert (await harness.read(1, 0))[0] == Status.NO_SUCH_LEDGER
    assert await harness.add(1, 0) == Status.FENCED
    assert await harness.read(2, 0) == (Status.OK, harness.frame(2, 0))


async def test_collect_garbage_rechecks_and_compaction_frees_segments(harness_cls):
    h = harness_cls(config=BookieConfig(segment_size=2048, disk_check_interval=0,
                                        checkpoint_interval=0))
    bookie = await h.start()
    for e in range(60):
        assert await h.add(e % 4, e) == Status.OK
    segs_before = len(h.fs.listdir("/data/b1/journal"))
    asked: list[int] = []

    async def is_live(lid: int) -> bool:
        asked.append(lid)
        if lid == 3:  # live again on the second look: must not be deleted
            return asked.count(3) > 1
        return lid == 0

    deleted = await bookie.collect_garbage(is_live)
    assert deleted == [1, 2]
    assert asked.count(1) == 2 and asked.count(3) == 2
    segs_after = len(h.fs.listdir("/data/b1/journal"))
    assert segs_after < segs_before
    for e in range(60):
        status, body = await h.read(e % 4, e)
        if e % 4 in (0, 3):
            assert (status, body) == (Status.OK, h.frame(e % 4, e))
        else:
            assert status == Status.NO_SUCH_LEDGER
    bookie.crash()
    h.fs.crash("drop")
    await h.start()
    h.bookie._check()
    for e in range(0, 60, 4):
        assert await h.read(0, e) == (Status.OK, h.frame(0, e))
    # a full rebuild (checkpoint lost) still knows the keys and tombstones
    await h.bookie.stop()
    h.fs.delete("/data/b1/index.ckpt")
    await h.start()
    assert await h.add(1, 99) == Status.FENCED
    assert await h.add(0, 999, key=master_key(b"nope")) == Status.UNAUTHORIZED
    for e in range(3, 60, 4):
        assert await h.read(3, e) == (Status.OK, h.frame(3, e))
