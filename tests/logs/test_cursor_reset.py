"""Resetting a durable cursor from outside its consumer (Pulsar's resetCursor): records before
the position count as consumed (retention by consumption sees it), the next consumer resumes
there, the consumer that held it is fenced and its ledger deleted."""

from __future__ import annotations

import asyncio

import pytest
from logs_kit import mem_cluster

from pybk import CursorNotFoundError, LedgerFencedError, NoSuchLedgerError

pytestmark = pytest.mark.timeout(60)


async def test_a_reset_moves_the_cursor_and_fences_its_consumer() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l", roll_entries=2)
        async with await log.writer() as w:
            positions = [await w.append(b"r%d" % i) for i in range(8)]
        cur = await log.subscribe("c")
        handed = [await asyncio.wait_for(cur.receive(), 10) for _ in range(3)]
        await cur.ack(handed[0].position)
        from pybk.logs.cursor_meta import CursorRecord, cursor_key
        key = cursor_key(log.namespace, "l", "c")
        old_ledger = CursorRecord.from_bytes((await client.store.read_value(key)).value).ledger

        await log.reset_cursor("c", positions[5])
        with pytest.raises(NoSuchLedgerError):  # its acknowledgements' ledger is gone
            await client.open_ledger(old_ledger, recovery=False)
        with pytest.raises((LedgerFencedError, NoSuchLedgerError)):
            await cur.ack(handed[1].position)
            await cur.ack(handed[2].position)
            await cur.close()
        await cur.abort()
        again = await log.subscribe("c")
        got = [await asyncio.wait_for(again.receive(), 10) for _ in range(3)]
        assert [r.position for r in got] == positions[5:]
        await again.close()

        # retention by consumption sees the reset: segments wholly before it go
        await log.reset_cursor("c", positions[6])
        await log.set_retention(after_consumed=True)
        await log.apply_retention()
        kept = [s.seq for s in await log.segments() if s.state != "truncated"]
        assert kept[0] == positions[6].segment, await log.segments()
        async with log.reader(positions[6], stop_at=positions[7]) as r:
            assert [rec.data async for rec in r] == [b"r6", b"r7"]


async def test_reset_creates_only_when_asked_and_checks_its_input() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        async with await log.writer() as w:
            positions = [await w.append(b"r%d" % i) for i in range(3)]
        with pytest.raises(CursorNotFoundError):
            await log.reset_cursor("nobody", positions[1])
        await log.reset_cursor("spark", positions[1], create=True)
        assert "spark" in await log.cursors()
        cur = await log.subscribe("spark")
        assert (await asyncio.wait_for(cur.receive(), 10)).position == positions[1]
        await cur.close()
        with pytest.raises(TypeError, match="Position"):
            await log.reset_cursor("spark", "0:1:0")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="cursor name"):
            await log.reset_cursor("../x", positions[0])
