"""Durable cursors: reading from the cursor's position, individual and cumulative acks, holes
kept as ranges, nack and ack-timeout redelivery, takeover fencing the old consumer, crashes
(a consumer that stops without closing, a new client) resuming exactly after the mark-delete
position with nothing acknowledged redelivered, ledger rollover, deletion, bad input."""

from __future__ import annotations

import asyncio

import pytest
from logs_kit import mem_cluster

from pybk import CursorNotFoundError, LedgerFencedError, NoSuchLedgerError, Position
from pybk.errors import TooManyRequestsError
from pybk.logs import CursorOptions
from pybk.logs.cursor_meta import CursorRecord, cursor_key

pytestmark = pytest.mark.timeout(60)


async def take(cur, n):  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        out.append(await asyncio.wait_for(cur.receive(), 10))
    return out


async def write(log, n, prefix=b"r"):  # type: ignore[no-untyped-def]
    async with await log.writer() as w:
        return await w.append_many([prefix + b"%d" % i for i in range(n)])


async def test_acks_move_the_mark_delete_position_and_holes_stay_ranges() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 10)
        cur = await log.subscribe("c")
        recs = await take(cur, 10)
        assert [r.position for r in recs] == positions
        await cur.ack(positions[1])
        await cur.ack(positions[2])
        await cur.ack(positions[5])
        assert await cur.mark_delete_position() is None
        assert cur.ack_ranges == [(positions[1], positions[2]), (positions[5], positions[5])]
        await cur.ack(positions[0])
        assert await cur.mark_delete_position() == positions[2]
        assert cur.ack_ranges == [(positions[5], positions[5])]
        await cur.ack(positions[4])
        await cur.ack(positions[3])
        assert await cur.mark_delete_position() == positions[5]
        await cur.ack_cumulative(positions[8])
        assert await cur.mark_delete_position() == positions[8]
        assert cur.pending() == [positions[9]]
        assert (await log.cursors()) == {"c": positions[8]}
        await cur.close()


async def test_a_crashed_consumer_resumes_after_the_mark_delete_position_skipping_acked() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        positions = await write(log, 20)
        cur = await log.subscribe("c")
        await take(cur, 12)
        for i in (0, 1, 2, 5, 6, 9):
            await cur.ack(positions[i])
        await cur.abort()  # no close: as if the process died after these acks returned
        again = await log.subscribe("c")
        assert await again.mark_delete_position() == positions[2]
        got = [r.position for r in await take(again, 20 - 6)]
        assert got == [p for i, p in enumerate(positions) if i not in (0, 1, 2, 5, 6, 9)]
        # the restored ranges merge once the records between them are acknowledged again
        await again.ack(positions[3])
        await again.ack(positions[4])
        assert await again.mark_delete_position() == positions[6]
        await again.ack(positions[7])
        await again.ack(positions[8])
        assert await again.mark_delete_position() == positions[9]
        await again.close()


async def test_a_truncation_inside_an_acknowledged_range_redelivers_none_of_it() -> None:
    """The log truncated into the middle of a range acknowledged beyond the mark-delete
    position while no consumer held the cursor: the next one resumes at the truncation point
    and skips the rest of the range (its acknowledgements returned)."""
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        async with await log.writer() as w:
            positions = [await w.append(b"r%d" % i) for i in range(10)]
            cur = await log.subscribe("c")
            await take(cur, 10)
            for i in (3, 4, 5, 6):
                await cur.ack(positions[i])
            assert await cur.mark_delete_position() is None
            await cur.abort()
            await w.truncate(positions[5])
        again = await log.subscribe("c")
        got = [r.position for r in await take(again, 3)]
        assert got == positions[7:]
        assert await again.mark_delete_position() == positions[6]
        await again.close()


async def test_a_new_owner_fences_the_old_one_and_keeps_its_acks() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 5)
        first = await log.subscribe("c")
        await take(first, 3)
        await first.ack(positions[0])
        second = await log.subscribe("c")
        with pytest.raises(LedgerFencedError):
            await first.ack(positions[1])
        assert [r.position for r in await take(second, 4)] == positions[1:]
        await second.ack_cumulative(positions[4])
        await second.close()
        await first.close()  # fenced: closes locally
        assert await log.cursors() == {"c": positions[4]}


async def test_nack_and_ack_timeout_redeliver() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 3)
        cur = await log.subscribe("c", redelivery_delay=0.05)
        recs = await take(cur, 3)
        cur.nack(recs[1].position)
        again = await take(cur, 1)
        assert again[0].position == positions[1] and again[0].data == b"r1"
        await cur.close()
        timed = await log.subscribe("t", ack_timeout=0.05)
        first = await take(timed, 1)
        await timed.ack(first[0].position)
        # the other two are handed out, then again after the timeout (not the acked one)
        got = [r.position for r in await take(timed, 4)]
        assert got[:2] == positions[1:] and sorted(got[2:]) == positions[1:]
        await timed.close()


async def test_start_latest_and_at_a_position_and_the_tail_is_followed() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 4)
        latest = await log.subscribe("late", start="latest")
        at = await log.subscribe("at", start=positions[2])
        assert [r.position for r in await take(at, 2)] == positions[2:]
        waiting = asyncio.ensure_future(latest.receive())
        more = await write(log, 1, b"new")
        rec = await asyncio.wait_for(waiting, 10)
        assert rec.position == more[0] and rec.data == b"new0"
        await latest.close()
        await at.close()


async def test_the_cursor_ledger_rolls_and_the_state_survives() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        positions = await write(log, 12)
        cur = await log.subscribe("c", rollover_entries=3)
        key = cursor_key("default", "l", "c")
        first_ledger = CursorRecord.from_bytes((await client.store.read_value(key)).value).ledger
        await take(cur, 12)
        for i in (0, 2, 4, 6, 8, 10):
            await cur.ack(positions[i])
        rec = CursorRecord.from_bytes((await client.store.read_value(key)).value)
        assert rec.ledger != first_ledger
        with pytest.raises(NoSuchLedgerError):  # the rolled-over ledger is deleted
            await client.open_ledger(first_ledger, recovery=False)
        await cur.abort()
        again = await log.subscribe("c")
        assert again.ack_ranges == [(positions[i], positions[i]) for i in (2, 4, 6, 8, 10)]
        assert await again.mark_delete_position() == positions[0]
        await again.close()


async def test_delete_cursor_and_bad_input() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 4)
        cur = await log.subscribe("c", max_ack_ranges=1)
        await take(cur, 4)
        with pytest.raises(ValueError, match="not handed out"):
            await cur.ack(Position(9, 0, 0))
        with pytest.raises(TypeError):
            await cur.ack("1:0:0")  # type: ignore[arg-type]
        await cur.ack(positions[1])  # one range
        with pytest.raises(TooManyRequestsError):
            await cur.ack(positions[3])  # 2 is pending between: a second range, refused
        await cur.ack(positions[0])  # the oldest: the mark-delete position moves, no range
        assert await cur.mark_delete_position() == positions[1]
        await cur.ack(positions[3])  # now it is the only range
        assert cur.ack_ranges == [(positions[3], positions[3])]
        with pytest.raises(ValueError, match="bad cursor name"):
            await log.subscribe("../x")
        with pytest.raises(ValueError, match="start must be"):
            await log.subscribe("x", start="middle")
        with pytest.raises(ValueError):
            CursorOptions(redelivery_delay=-1)
        with pytest.raises(TypeError):
            await log.subscribe("x", options=CursorOptions(), ack_timeout=1.0)
        await log.delete_cursor("c")
        with pytest.raises(LedgerFencedError):
            await cur.ack(positions[2])
        assert await log.cursors() == {}
        with pytest.raises(CursorNotFoundError):
            await log.delete_cursor("c")



def test_the_synchronous_cursor(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pybk

    with pybk.sync.LocalCluster(str(tmp_path / "c"), bookies=3) as cluster:
        log = cluster.client().namespace().create_log("l")
        with log.writer() as w:
            positions = w.append_many([b"a", b"b", b"c"])
        with log.subscribe("s") as cur:
            recs = [cur.receive(timeout=10) for _ in range(3)]
            assert [r.position for r in recs] == positions
            cur.ack(positions[1])
            cur.ack_cumulative(positions[0])
            assert cur.mark_delete_position() == positions[1]
            cur.nack(positions[2], delay=0.0)
            assert cur.receive(timeout=10).position == positions[2]
        assert log.cursors() == {"s": positions[1]}
        log.set_retention(after_consumed=True)
        log.delete_cursor("s")


async def test_deleting_the_log_deletes_its_cursors() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        ns = client.namespace()
        log = await ns.create_log("l")
        positions = await write(log, 2)
        cur = await log.subscribe("c")
        await cur.ack((await take(cur, 2))[0].position)
        ledger = CursorRecord.from_bytes(
            (await client.store.read_value(cursor_key("default", "l", "c"))).value).ledger
        await ns.delete_log("l")
        with pytest.raises(LedgerFencedError):
            await cur.ack(positions[1])
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(ledger, recovery=False)
        again = await ns.create_log("l")
        assert await again.cursors() == {}
