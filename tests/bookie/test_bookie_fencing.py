"""Bookie fencing and LAC through ``handle()``: the master key, fences (durable before they
are acknowledged, in force at once), explicit and piggybacked LACs, long polls."""

from __future__ import annotations

import asyncio

from pybk.bookie import WRITABLE
from pybk.wire import (
    DigestManager,
    FenceRequest,
    ReadLacRequest,
    ReadRequest,
    Status,
    WriteLacRequest,
)

# --------------------------------------------------------------------------- master key, fencing


async def test_master_key_is_checked_on_add_and_fence(harness):
    await harness.add(1, 0)
    assert await harness.add(1, 1, key=b"wrong") == Status.UNAUTHORIZED
    resp = await harness.bookie.handle(FenceRequest(1, b"wrong"))
    assert resp.status == Status.UNAUTHORIZED
    assert await harness.add(1, 1) == Status.OK  # the bad fence did not fence
    await harness.crash_restart()
    assert await harness.add(1, 2, key=b"wrong") == Status.UNAUTHORIZED


async def test_fence_blocks_normal_adds_allows_recovery_adds_and_survives_restart(harness):
    await harness.add(1, 0)
    resp = await harness.bookie.handle(FenceRequest(1, harness.KEY))
    assert resp.status == Status.OK and resp.lac == -1
    assert await harness.add(1, 1) == Status.FENCED
    assert await harness.add(1, 1, recovery=True) == Status.OK
    await harness.crash_restart("drop")  # the fence was synced before it was answered
    assert await harness.add(1, 2) == Status.FENCED
    assert await harness.add(1, 2, recovery=True) == Status.OK


async def test_fencing_read_of_unknown_ledger_creates_it_fenced(harness):
    resp = await harness.bookie.handle(ReadRequest(9, 0, fence=True, master_key=harness.KEY))
    assert resp.status == Status.NO_SUCH_ENTRY
    await harness.crash_restart()
    assert await harness.add(9, 0) == Status.FENCED
    assert await harness.add(9, 0, key=b"other") == Status.UNAUTHORIZED


async def test_fence_wakes_long_poll(harness):
    bookie = harness.bookie
    await harness.add(1, 0)
    poll = asyncio.ensure_future(bookie.handle(ReadRequest(1, 1, previous_lac=0, timeout=30)))
    await asyncio.sleep(0)
    assert not poll.done()
    await bookie.handle(FenceRequest(1, harness.KEY))
    resp = await asyncio.wait_for(poll, 5)
    assert resp.status == Status.OK and resp.body is None and resp.lac == -1


async def test_a_fence_that_hit_enospc_is_written_again_before_being_acknowledged(harness):
    fs, bookie = harness.fs, harness.bookie
    await harness.add(1, 0)
    used = fs.capacity - fs.disk_usage("/")[0]
    fs.set_capacity(used + 5)
    resp = await bookie.handle(FenceRequest(1, harness.KEY))
    assert resp.status == Status.READ_ONLY  # not durable: not acknowledged
    fs.set_capacity(1 << 30)
    assert bookie.check_disk() == WRITABLE
    assert await harness.add(1, 1) == Status.FENCED  # but in force at once
    resp = await bookie.handle(FenceRequest(1, harness.KEY))
    assert resp.status == Status.OK
    await harness.crash_restart("drop")
    assert await harness.add(1, 1) == Status.FENCED


# --------------------------------------------------------------------------- LAC


async def test_lac_is_max_of_piggyback_and_explicit_and_survives_restart(harness):
    for e in range(4):
        await harness.add(1, e, harness.frame(1, e, lac=e - 1))
    resp = await harness.bookie.handle(ReadRequest(1, 0))
    assert resp.lac == 2
    lac_body = DigestManager(1).frame_lac(3)
    wl = await harness.bookie.handle(WriteLacRequest(1, 3, harness.KEY, lac_body))
    assert wl.status == Status.OK
    await harness.crash_restart()
    rl = await harness.bookie.handle(ReadLacRequest(1))
    assert rl.status == Status.OK and rl.lac_body == lac_body
    assert rl.last_entry_body == harness.frame(1, 3, lac=2)
    assert (await harness.bookie.handle(ReadRequest(1, 0))).lac == 3
    assert (await harness.bookie.handle(ReadLacRequest(5))).status == Status.NO_SUCH_LEDGER


async def test_long_poll_returns_when_lac_passes(harness):
    bookie = harness.bookie
    await harness.add(1, 0, harness.frame(1, 0, lac=-1))
    poll = asyncio.ensure_future(bookie.handle(ReadRequest(1, 1, previous_lac=0, timeout=30)))
    await asyncio.sleep(0)
    await harness.add(1, 1, harness.frame(1, 1, lac=0))  # LAC still 0
    await asyncio.sleep(0)
    assert not poll.done()
    await harness.add(1, 2, harness.frame(1, 2, lac=1))  # LAC 1 > 0: answer with entry 1
    resp = await asyncio.wait_for(poll, 5)
    assert (resp.status, resp.lac, resp.entry_id) == (Status.OK, 1, 1)
    assert resp.body == harness.frame(1, 1, lac=0)


async def test_long_poll_is_answered_by_the_lac_an_add_brings_before_its_fsync(harness):
    """The LAC an add carries was confirmed by the writer: a long poll has it as the add
    arrives, not once the add is durable (the add itself is answered only then)."""
    bookie = harness.bookie
    await harness.add(1, 0, harness.frame(1, 0, lac=-1))
    await harness.add(1, 1, harness.frame(1, 1, lac=0))
    poll = asyncio.ensure_future(bookie.handle(ReadRequest(1, 1, previous_lac=0, timeout=30)))
    gate = asyncio.Event()

    async def held(_seconds: float) -> None:
        await gate.wait()

    harness.fs.sync_delay, harness.fs.wait = 1.0, held  # every journal sync held
    add = asyncio.ensure_future(harness.add(1, 2, harness.frame(1, 2, lac=1)))
    resp = await asyncio.wait_for(poll, 5)
    assert (resp.status, resp.lac, resp.entry_id) == (Status.OK, 1, 1)
    assert resp.body == harness.frame(1, 1, lac=0)
    assert not add.done()  # entry 2 is not durable yet
    gate.set()
    assert await asyncio.wait_for(add, 5) == Status.OK


async def test_long_poll_times_out_with_no_entry(harness):
    await harness.add(1, 0)
    resp = await harness.bookie.handle(ReadRequest(1, 1, previous_lac=5, timeout=0.01))
    assert resp.status == Status.OK and resp.body is None and resp.lac == -1
