"""A bookie's read-only modes and disk faults: the usage watermark, a full disk (ENOSPC,
at start-up too), a failed fsync (fatal: nothing it covered is acknowledged)."""

from __future__ import annotations

import asyncio
import errno
import random

import pytest

from pybk.bookie import READ_ONLY, WRITABLE, Bookie, BookieConfig
from pybk.storage import MemFileSystem
from pybk.wire import AddRequest, Status

# --------------------------------------------------------------------------- read-only


async def test_watermark_read_only_then_writable_again(harness):
    fs, bookie = harness.fs, harness.bookie
    changes: list[str] = []
    bookie.on_state_change = changes.append
    for lid in range(1, 60):
        await harness.add(lid, 0)
    used = fs.capacity - fs.disk_usage("/")[0]
    fs.set_capacity(int(used / 0.952))
    assert bookie.check_disk() == READ_ONLY
    assert "watermark" in bookie.state_reason
    resp = await bookie.handle(AddRequest(1, 1, harness.KEY, harness.frame(1, 1)))
    assert resp.status == Status.READ_ONLY and "watermark" in resp.message
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))  # reads served
    assert await harness.add(1, 1, recovery=True) == Status.OK  # recovery adds accepted
    fs.set_capacity(1 << 30)
    assert bookie.check_disk() == WRITABLE
    assert await harness.add(1, 2) == Status.OK
    assert changes == [READ_ONLY, WRITABLE]


async def test_watermark_timer_flips_state():
    h_fs = MemFileSystem()
    bookie = Bookie("b1", "/d", fs=h_fs, rng=random.Random(1),
                    config=BookieConfig(disk_check_interval=0.001, checkpoint_interval=0.001))
    await bookie.start()
    used = h_fs.capacity - h_fs.disk_usage("/")[0]
    h_fs.set_capacity(used + 1)
    for _ in range(1000):
        if bookie.state == READ_ONLY:
            break
        await asyncio.sleep(0.001)
    assert bookie.state == READ_ONLY
    await bookie.stop()


async def test_disk_full_enospc_then_space_returns(harness):
    fs, bookie = harness.fs, harness.bookie
    await harness.add(1, 0)
    used = fs.capacity - fs.disk_usage("/")[0]
    fs.set_capacity(used + 10)  # the next batch does not fit
    resp = await bookie.handle(AddRequest(1, 1, harness.KEY, harness.frame(1, 1)))
    assert resp.status == Status.READ_ONLY and "ENOSPC" in resp.message
    assert bookie.state == READ_ONLY and "disk full" in bookie.state_reason
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))
    fs.set_capacity(1 << 30)
    assert bookie.check_disk() == WRITABLE
    assert await harness.add(1, 1) == Status.OK
    await harness.crash_restart()
    assert harness.bookie.store.report.torn_tails == 0  # no garbage between batches
    for e in (0, 1):
        assert await harness.read(1, e) == (Status.OK, harness.frame(1, e))


async def test_restart_with_a_full_disk_serves_reads_read_only(harness):
    for e in range(5):
        await harness.add(1, e)
    harness.bookie.crash()
    harness.fs.crash("drop")
    fs = harness.fs
    used = fs.capacity - fs.disk_usage("/")[0]
    fs.set_capacity(used)  # not one byte left
    bookie = await harness.start()
    assert bookie.state == READ_ONLY and "disk full at start-up" in bookie.state_reason
    for e in range(5):
        assert await harness.read(1, e) == (Status.OK, harness.frame(1, e))
    assert await harness.add(1, 5) == Status.READ_ONLY
    fs.set_capacity(1 << 30)
    await harness.crash_restart()
    assert harness.bookie.state == WRITABLE
    assert await harness.add(1, 5) == Status.OK
    for e in range(6):
        assert await harness.read(1, e) == (Status.OK, harness.frame(1, e))


# --------------------------------------------------------------------------- fsync failures


async def test_fsync_eio_is_fatal_nothing_covered_is_acked(harness):
    fs, bookie = harness.fs, harness.bookie
    assert await harness.add(1, 0) == Status.OK
    fs.fail_next_fsync(errno.EIO)
    statuses = await asyncio.gather(*(harness.add(1, e) for e in range(1, 6)))
    assert set(statuses) == {Status.IO_ERROR}
    assert bookie.state == READ_ONLY and "fsync" in bookie.state_reason
    assert await harness.add(1, 9) == Status.READ_ONLY
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))
    await harness.crash_restart("torn", seed=3)
    assert harness.bookie.state == WRITABLE
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))
    for e in range(1, 6):
        status, body = await harness.read(1, e)
        assert status == Status.NO_SUCH_ENTRY or body == harness.frame(1, e)


async def test_segment_header_lost_to_fsync_eio_never_blocks_a_later_start(harness_cls):
    """Start fails because the new segment's header fsync fails (EIO: those bytes are lost
    for good); the next start in the same process still sees them and moves on to a newer
    segment; after a power cut the lost header reads back as zeros/nothing in a segment that
    is no longer the last one. It held nothing, so it must not stop the bookie (found by the
    simulator, seed 32)."""
    h = harness_cls()
    await h.start()
    await h.add(1, 0)
    h.bookie.crash()
    h.fs.fail_next_fsync(errno.EIO, path_prefix=h.DATA_DIR + "/journal/")
    with pytest.raises(OSError):
        await h.start()
    await h.start()
    assert await h.add(1, 1) == Status.OK
    h.bookie.crash()
    h.fs.crash("drop")
    await h.start()
    for e in (0, 1):
        assert await h.read(1, e) == (Status.OK, h.frame(1, e))
    await h.bookie.stop()
    h.fs.delete(h.DATA_DIR + "/index.ckpt")  # and on a full rebuild too
    await h.start()
    for e in (0, 1):
        assert await h.read(1, e) == (Status.OK, h.frame(1, e))
