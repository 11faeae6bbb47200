"""Retention by consumption (after_consumed): a segment goes only once every durable cursor
is past it and the age / size allows; applied by the writer on its own (after rolls and on
its housekeeping interval of loop time) and by a cursor moving to a later segment. And
read-your-writes: the client holding the live writer sees its acknowledged records at once."""

from __future__ import annotations

import asyncio

import pytest
from logs_kit import mem_cluster

from pybk import AlreadyTruncatedError, Position
from pybk.client.context import ClientConfig
from pybk.logs import COMPLETED

pytestmark = pytest.mark.timeout(60)


async def _segments(log):  # type: ignore[no-untyped-def]
    return [s.seq for s in await log.segments() if s.state == COMPLETED]


async def test_consumed_segments_go_only_when_every_cursor_is_past_them() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        await log.set_retention(after_consumed=True)
        fast = await log.subscribe("fast")
        slow = await log.subscribe("slow")
        w = await log.writer(housekeeping_interval=0.05)
        positions = [await w.append(b"x%d" % i) for i in range(8)]  # segments 1..4 (2 each)
        await w.roll()
        for _ in range(8):
            rec = await asyncio.wait_for(fast.receive(), 10)
            await fast.ack(rec.position)
        for _ in range(3):
            rec = await asyncio.wait_for(slow.receive(), 10)
            await slow.ack(rec.position)
        # fast consumed all; slow is inside segment 2: only segment 1 may go, by itself
        await _wait_segments(log, lambda segs: segs and segs[0] == 2)
        assert (await log.metadata()).truncated_before == Position(2, 0, 0)
        assert await _segments(log) == [2, 3, 4]
        # a cursor deleted no longer holds the log back
        await log.delete_cursor("slow")
        await _wait_segments(log, lambda segs: not segs)
        with pytest.raises(AlreadyTruncatedError):
            async with log.reader(start=positions[0]) as r:
                await r.read_batch(1)
        await w.close()
        await fast.close()


async def _wait_segments(log, pred, timeout=10.0):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        segs = await _segments(log)
        if pred(segs):
            return
        assert loop.time() < deadline, f"segments {segs}"
        await asyncio.sleep(0.01)


async def test_after_consumed_keeps_what_age_and_size_still_allow() -> None:
    now = [1000.0]
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace(clock=lambda: now[0])
        log = await ns.create_log("l", roll_entries=1)
        await log.set_retention(max_age=60, after_consumed=True)
        cur = await log.subscribe("c")
        async with await log.writer(housekeeping_interval=None) as w:
            for i in range(3):
                await w.append(b"%d" % i)
        for _ in range(3):
            await cur.ack((await asyncio.wait_for(cur.receive(), 10)).position)
        await log.apply_retention()
        assert await _segments(log) == [1, 2, 3]  # consumed, but not 60 s old
        now[0] += 61
        await log.apply_retention()
        assert await _segments(log) == []
        await cur.close()


async def test_no_cursor_means_nothing_is_consumed() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=1)
        await log.set_retention(after_consumed=True)
        async with await log.writer() as w:
            for i in range(3):
                await w.append(b"%d" % i)
        await log.apply_retention()
        assert await _segments(log) == [1, 2, 3]
        with pytest.raises(ValueError):
            await log.set_retention(max_age=-1)


async def test_the_live_writers_client_reads_its_own_acknowledged_records_at_once() -> None:
    slow_lac = ClientConfig(add_timeout=2.0, read_timeout=2.0, long_poll_timeout=30.0,
                            explicit_lac_interval=30.0)
    async with mem_cluster(config=slow_lac) as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        w = await log.writer()
        positions = await w.append_many([b"a%d" % i for i in range(100)])
        t0 = asyncio.get_running_loop().time()
        assert await log.last_position() == positions[-1]
        assert await log.first_position() == positions[0]
        async with log.reader() as r:
            got = [rec.position for rec in await r.read_batch(100)]
            while len(got) < 100:
                got += [rec.position for rec in await r.read_batch(100)]
            assert got == positions
            nxt = asyncio.ensure_future(r.read_batch(1))
            more = await w.append(b"later")
            assert [rec.position for rec in await asyncio.wait_for(nxt, 5)] == [more]
        assert asyncio.get_running_loop().time() - t0 < 5  # not the 30 s explicit LAC
        await w.close()


async def test_a_cursor_moving_on_applies_retention_without_a_writer() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=1)
        async with await log.writer() as w:
            for i in range(3):
                await w.append(b"%d" % i)
        await log.set_retention(after_consumed=True)
        cur = await log.subscribe("c")
        for _ in range(2):
            await cur.ack((await asyncio.wait_for(cur.receive(), 10)).position)
        await _wait_segments(log, lambda segs: segs == [3])
        await cur.close()
