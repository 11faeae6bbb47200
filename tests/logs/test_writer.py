"""The log writer: batching, rolling (with the next ledger made ahead, appends queued during a
roll), takeover (fencing, recovery of the old segment, racing writers), txids, limits checked
before anything is sent, end of stream, close."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logs_kit import MetaOps, mem_cluster, until

from pybk import (
    EndOfStreamError,
    LedgerClosedError,
    LedgerFencedError,
    Position,
    RecordTooLargeError,
    WriterConflictError,
)
from pybk.errors import ClientClosedError, TooManyRequestsError
from pybk.logs import COMPLETED, IN_PROGRESS, WriterOptions
from pybk.metadata.memory import MemoryMetadataStore
from pybk.testing.hooks import is_normal_add
from pybk.wire import Op

pytestmark = pytest.mark.timeout(60)


async def read_all(log, stop):  # type: ignore[no-untyped-def]
    return [(r.position, r.data) async for r in log.reader(stop_at=stop)]


async def test_one_loop_pass_is_one_envelope_and_limits_split_batches() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer(flush_records=10, flush_bytes=4096)
        positions = await asyncio.gather(*(w.append(b"%03d" % i) for i in range(25)))
        assert positions == [Position(1, i // 10, i % 10) for i in range(25)]
        big = await asyncio.gather(*(w.append(bytes(1000)) for _ in range(9)))
        assert [p.entry for p in big] == [3] * 5 + [4] * 4  # sealed once >= 4096 B
        w._check()
        later = await w.append(b"alone")
        assert later == Position(1, 5, 0)
        await w.close()
        got = await read_all(log, later)
        assert [d for _, d in got[:25]] == [b"%03d" % i for i in range(25)]
        assert [p for p, _ in got] == [*positions, *big, later]


async def test_flush_delay_gathers_records_of_several_loop_passes() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer(flush_delay=30.0)
        first = w.append(b"a")
        for _ in range(5):
            await asyncio.sleep(0)
        second = w.append(b"b")
        assert not first.done()
        await w.flush()  # flush does not wait for the delay
        assert [await first, await second] == [Position(1, 0, 0), Position(1, 0, 1)]
        await w.close()


async def test_roll_by_entries_completes_segments_with_their_counts() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=3)
        async with await log.writer() as w:
            positions = [await w.append(b"x%d" % i, txid=10 + i) for i in range(7)]
        assert [p.segment for p in positions] == [1, 1, 1, 2, 2, 2, 3]
        segs = await log.segments()
        assert [(s.seq, s.state, s.last_entry, s.last_slot, s.records, s.max_txid)
                for s in segs] == [(1, COMPLETED, 2, 0, 3, 12), (2, COMPLETED, 2, 0, 3, 15),
                                   (3, COMPLETED, 0, 0, 1, 16)]
        assert all(s.bytes > 0 for s in segs)
        assert await log.last_position() == positions[-1]
        assert await log.first_position() == Position(1, 0, 0)


async def test_roll_by_bytes_and_by_age() -> None:
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace()
        by_bytes = await ns.create_log("b", roll_bytes=250)
        async with await by_bytes.writer() as w:
            ps = [await w.append(bytes(100)) for _ in range(6)]
        assert [p.segment for p in ps] == [1, 1, 2, 2, 3, 3]  # 2 x 136 B envelopes per 250
        by_age = await ns.create_log("a", roll_seconds=60.0)
        w = await by_age.writer()
        assert (await w.append(b"1")).segment == 1
        w._seg_started -= 61  # the segment is a minute old (the loop clock, not a sleep)
        assert (await w.append(b"2")).segment == 1  # the append that finds it old rolls it
        assert (await w.append(b"3")).segment == 2
        await w.close()


async def test_the_next_ledger_is_made_ahead_and_a_roll_creates_none() -> None:
    ops = MetaOps()
    async with mem_cluster(metadata=MemoryMetadataStore(before_op=ops)) as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=4)
        w = await log.writer()
        for i in range(2):
            await w.append(b"%d" % i)
        await until(lambda: w._next is not None and w._next.done())
        ahead = (await log.metadata()).allocated
        assert len(ahead) == 1
        created = ops.counts.get("create_ledger", 0)
        p = [await w.append(b"%d" % i) for i in range(2, 5)]
        assert p[-1].segment == 2
        assert ops.counts.get("create_ledger", 0) == created  # the roll used the made one
        md = await log.metadata()
        assert md.segments[-1].ledger_id == ahead[0] and md.allocated == ()
        await w.close()
        md = await log.metadata()
        assert md.allocated == () and md.segments[-1].state == COMPLETED
        live = set(await cluster.client().list_ledgers())
        assert live == {s.ledger_id for s in md.segments}  # nothing made ahead is left over


async def test_appends_queue_during_a_roll_and_keep_their_order() -> None:
    ops = MetaOps()
    async with mem_cluster(metadata=MemoryMetadataStore(before_op=ops)) as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        w = await log.writer()
        await w.append(b"a")
        ops.hold()  # the roll's metadata write waits
        second = w.append(b"b")  # the segment's 2nd entry: a roll starts once it is sent
        await asyncio.sleep(0)
        await until(lambda: w._rolling)
        during = [w.append(b"q%d" % i) for i in range(5)]  # accepted, queued
        await until(lambda: ops.held > 0)
        assert not any(f.done() for f in during)
        ops.release()
        got = await asyncio.gather(second, *during)
        assert got[0] == Position(1, 1, 0)
        assert [p.segment for p in got[1:]] == [2] * 5 and got[1:] == sorted(got[1:])
        await w.close()
        assert [d for _, d in await read_all(log, got[-1])] == [b"a", b"b"] + [
            b"q%d" % i for i in range(5)]


async def test_takeover_fences_the_old_writer_and_recovers_its_segment() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        old = await log.writer(label="old")
        acked = [await old.append(b"a%d" % i) for i in range(3)]
        hold = cluster.transport.hooks.hold(predicate=is_normal_add)
        pending = [old.append(b"p%d" % i) for i in range(3)]
        await hold.wait_held(2)  # one envelope, on its write set (Qw=2): not stored yet
        new = await log.writer(label="new")  # fences segment 1 and completes it
        md = await log.metadata()
        assert (md.epoch, md.writer) == (2, "new")
        assert md.segments[0].state == COMPLETED
        assert md.segments[0].last_position == acked[-1]
        assert md.segments[0].records == 3
        hold.remove()  # the held adds reach fenced bookies
        for fut in pending:  # they fail; none hangs
            with pytest.raises(LedgerFencedError):
                await asyncio.wait_for(fut, 10)
        with pytest.raises(LedgerFencedError):
            old.append(b"zombie")
        mine = await new.append(b"n")
        assert mine > acked[-1] and mine.segment == 2
        await old.close()  # a fenced writer closes locally
        await new.close()
        assert [d for _, d in await read_all(log, mine)] == [b"a0", b"a1", b"a2", b"n"]


async def test_calls_sharing_an_envelope_settle_each_even_cancelled_or_fenced() -> None:
    """append and append_many calls whose records share envelopes (an append_many's records
    are resolved as runs of slots): a call its caller cancelled is skipped and every other
    one gets exact positions; once the writer is fenced, every pending call fails."""
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        old = await log.writer(label="old", flush_records=8)
        a = old.append(b"a")
        many = old.append_many([b"m%d" % i for i in range(10)])  # entries 0 and 1
        gone = old.append_many([b"x", b"y"])
        b = old.append(b"b")
        lone = old.append(b"c")
        with_txids = old.append_many([b"t0", b"t1", b"t2"], [5, None, 7])
        gone.cancel()
        lone.cancel()
        old._check()
        assert await a == Position(1, 0, 0)
        assert await many == [Position(1, e, s) for e, s in [(0, 1), (0, 2), (0, 3), (0, 4),
                                                             (0, 5), (0, 6), (0, 7),
                                                             (1, 0), (1, 1), (1, 2)]]
        assert await b == Position(1, 1, 5)
        assert await with_txids == [Position(1, 1, 7), Position(1, 2, 0), Position(1, 2, 1)]
        ones = [old.append(b"o%d" % i) for i in range(5)]  # an envelope of futures only
        ones[2].cancel()
        assert [await f for i, f in enumerate(ones) if i != 2] == [
            Position(1, 3, s) for s in (0, 1, 3, 4)]
        hold = cluster.transport.hooks.hold(predicate=is_normal_add)
        pending = [old.append_many([b"p0", b"p1"]), old.append(b"p2"),
                   old.append_many([b"p3"], [9])]
        await hold.wait_held(2)
        new = await log.writer(label="new")
        hold.remove()
        for fut in pending:
            with pytest.raises(LedgerFencedError):
                await asyncio.wait_for(fut, 10)
        await old.close()
        await new.close()
        got = await read_all(log, Position(1, 3, 4))
        assert [d for _, d in got] == [b"a", *(b"m%d" % i for i in range(10)), b"x", b"y",
                                       b"b", b"c", b"t0", b"t1", b"t2",
                                       *(b"o%d" % i for i in range(5))]


async def test_the_old_writer_fails_even_if_idle_and_its_roll_fails() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        old = await log.writer()
        await old.append(b"1")
        new = await log.writer()
        with pytest.raises(LedgerFencedError):
            await asyncio.wait_for(old.append(b"2"), 10)  # its segment was recovered
        assert isinstance(old.error, LedgerFencedError)
        with pytest.raises(LedgerFencedError):
            await old.flush()
        p = await new.append(b"3")
        await new.close()
        assert [d for _, d in await read_all(log, p)] == [b"1", b"3"]


async def test_racing_writers_exactly_one_wins() -> None:
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace()
        await ns.create_log("l")
        logs = [await ns.open_log("l") for _ in range(2)]
        results = await asyncio.gather(*(lg.writer(label=f"w{i}") for i, lg in enumerate(logs)),
                                       return_exceptions=True)
        winners = [r for r in results if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(winners) == 1 and len(losers) == 1, results
        assert isinstance(losers[0], WriterConflictError), losers
        assert "same time" in str(losers[0])
        w = winners[0]
        assert (await logs[0].metadata()).writer == w._label
        p = await w.append(b"x")
        await w.close()
        assert [d for _, d in await read_all(logs[1], p)] == [b"x"]


async def test_recovery_deletes_an_empty_segment_and_the_ledgers_made_ahead() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l", roll_entries=2)
        crashed = await log.writer()
        await crashed.append(b"1")  # half the roll: the next ledger is made ahead
        await until(lambda: crashed._next is not None and crashed._next.done())
        crashed.append(b"2")
        await crashed.flush()
        await until(lambda: not crashed._rolling)
        # now segment 2 is empty (in progress) and maybe a ledger is made ahead
        await crashed.abort()
        md = await log.metadata()
        assert md.segments[-1].state == IN_PROGRESS and md.segments[-1].seq == 2
        w = await log.writer()
        md = await log.metadata()
        assert [s.seq for s in md.segments] == [1, 3] and md.allocated == ()
        assert set(await client.list_ledgers()) == {s.ledger_id for s in md.segments}
        await w.close()


async def test_txids_never_decrease_and_bad_ones_queue_nothing() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer()
        await w.append(b"a", txid=5)
        await w.append(b"b")  # records without a txid are fine anywhere
        for bad in (4, -1):
            with pytest.raises(ValueError, match="txid"):
                w.append(b"c", txid=bad)
        with pytest.raises(TypeError):
            w.append(b"c", txid="7")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="txid"):
            await w.append_many([b"x", b"y"], txids=[6, 5])
        with pytest.raises(ValueError, match="2 records but 1"):
            await w.append_many([b"x", b"y"], txids=[6])
        ps = await w.append_many([b"x", b"y", b"z"], txids=[5, None, 9])
        await w.close()
        got = [(r.data, r.txid) async for r in log.reader(stop_at=ps[-1])]
        assert got == [(b"a", 5), (b"b", None), (b"x", 5), (b"y", None), (b"z", 9)]
        assert (await log.metadata()).max_txid == 9
        w2 = await log.writer()
        with pytest.raises(ValueError, match="below the log's last txid 9"):
            w2.append(b"old", txid=8)
        await w2.close()


async def test_size_limits_are_checked_before_anything_is_sent() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer(max_record_bytes=1000, max_envelope_bytes=4096)
        sent = cluster.transport.inner.sent
        with pytest.raises(RecordTooLargeError, match="1001 bytes"):
            w.append(bytes(1001))
        with pytest.raises(RecordTooLargeError, match="record 2"):
            await w.append_many([b"ok", b"ok", bytes(5000)])
        with pytest.raises(ValueError):  # a RecordTooLargeError is also a ValueError
            w.append(bytes(10_000))
        with pytest.raises(TypeError):
            w.append("text")  # type: ignore[arg-type]
        for _ in range(3):
            await asyncio.sleep(0)
        assert cluster.transport.inner.sent == sent and w._buf == []
        ps = await asyncio.gather(*(w.append(bytes(1000)) for _ in range(10)))
        assert [p.entry for p in ps] == [0] * 4 + [1] * 4 + [2] * 2  # envelopes <= 4096 B
        await w.close()
    with pytest.raises(ValueError, match="max_record_bytes"):
        WriterOptions(max_record_bytes=4096, max_envelope_bytes=4096)
    with pytest.raises(ValueError, match="flush_delay"):
        WriterOptions(flush_delay=-1)


async def test_pending_bytes_are_bounded() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer(max_pending_bytes=3012)  # 3 records and their 4-byte lengths
        hold = cluster.transport.hooks.hold(op=Op.ADD)
        futs = [w.append(bytes(1000)) for _ in range(3)]
        with pytest.raises(TooManyRequestsError, match="max_pending_bytes"):
            w.append(bytes(1))
        hold.remove()
        await asyncio.gather(*futs)
        await w.append(bytes(1000))  # room again once acknowledged
        await w.close()


async def test_end_of_stream() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer()
        last = await w.append(b"final")
        tail = log.reader()
        await w.mark_end_of_stream()
        with pytest.raises(EndOfStreamError):
            w.append(b"more")
        assert (await log.metadata()).end_of_stream
        assert [r.data async for r in tail] == [b"final"]  # and the reader ends there
        w2 = await log.writer()
        with pytest.raises(EndOfStreamError):
            w2.append(b"more")
        await w2.close()
        assert await log.last_position() == last


async def test_close_and_abort() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        w = await log.writer()
        await w.close()  # an empty segment goes
        assert await log.segments() == [] and await client.list_ledgers() == []
        with pytest.raises(LedgerClosedError):
            w.append(b"x")
        await w.close()  # idempotent
        w = await log.writer()
        unsent = w.append(b"never flushed")
        await w.abort()
        with pytest.raises(ClientClosedError):
            await unsent
        w2 = await log.writer()
        assert [s.state for s in await log.segments()] == [IN_PROGRESS]  # 1 gone (empty), 2
        await w2.close()


async def test_a_roll_cancelled_under_the_writer_fails_its_appends_with_a_pybk_error() -> None:
    """The writer's roll task torn down (its loop or process going away) fails what waited
    for the roll with ClientClosedError, never with a bare CancelledError in the appends'
    futures (which callers handling pybk errors would not expect: the simulator's X1 found
    it, seed 333)."""
    ops = MetaOps()
    async with mem_cluster(metadata=MemoryMetadataStore(before_op=ops)) as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        w = await log.writer()
        await w.append(b"a")
        ops.hold()  # the roll's metadata write waits
        second = w.append(b"b")
        await until(lambda: w._rolling)
        queued = [w.append(b"q%d" % i) for i in range(3)]
        await until(lambda: ops.held > 0)
        w._roll_task.cancel()
        results = await asyncio.wait_for(asyncio.gather(*queued, return_exceptions=True), 10)
        assert all(type(r) is ClientClosedError for r in results), results
        assert "stopped while rolling" in str(results[0])
        assert await second == Position(1, 1, 0)  # sent before the roll: acknowledged
        with pytest.raises(ClientClosedError):
            w.append(b"after")
        ops.release()
        await w.abort()


async def test_a_writer_that_cannot_write_fails_its_records_never_hangs() -> None:
    async with mem_cluster(bookies=3) as cluster:
        log = await cluster.client().namespace().create_log("l", ensemble_size=3,
                                                             write_quorum=3, ack_quorum=3)
        w = await log.writer()
        await w.append(b"ok")
        await cluster.stop_bookie("bookie-1")  # no spare bookie: the ensemble cannot change
        futs = [w.append(b"%d" % i) for i in range(5)]
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 30)
        assert all(isinstance(r, BaseException) for r in results), results
        with pytest.raises(type(results[0])):
            w.append(b"after")
        await w.close()


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["one", "many", "many_txids"]),
                          st.lists(st.integers(0, 900), min_size=1, max_size=30)),
                min_size=1, max_size=8),
       st.integers(200, 3000), st.integers(1, 12))
def test_batches_respect_the_limits_and_keep_order(
        calls: list[tuple[str, list[int]]], flush_bytes: int, flush_records: int) -> None:
    """Records appended one by one and in append_many calls (with txids for some: the
    record-by-record path), of any sizes, interleaved: positions strictly increase in call
    order, every envelope holds at most flush_records records and max_envelope_bytes bytes,
    and everything reads back."""

    async def go() -> None:
        async with mem_cluster() as cluster:
            log = await cluster.client().namespace().create_log("l")
            w = await log.writer(flush_bytes=flush_bytes, flush_records=flush_records,
                                 max_record_bytes=1000, max_envelope_bytes=2048)
            futs: list[asyncio.Future[object]] = []
            expected: list[bytes] = []
            for how, sizes in calls:
                items = [bytes([len(expected) % 251]) * n for n in sizes]
                base = len(expected)
                expected += items
                if how == "many":
                    futs.append(w.append_many(items))  # type: ignore[arg-type]
                elif how == "many_txids":  # every other record with a txid
                    txids = [base + i if i % 2 else None for i in range(len(items))]
                    futs.append(w.append_many(items, txids))  # type: ignore[arg-type]
                else:
                    futs += [w.append(b) for b in items]  # type: ignore[misc]
                w._check()
            done = await asyncio.gather(*futs)
            positions: list[Position] = []
            for d in done:
                positions += d if isinstance(d, list) else [d]
            assert positions == sorted(set(positions)) and len(positions) == len(expected)
            per_entry: dict[int, int] = {}
            for p in positions:
                per_entry[p.entry] = per_entry.get(p.entry, 0) + 1
            assert max(per_entry.values()) <= flush_records
            assert w.stats["stored_bytes"] <= 2048 * w.stats["entries"]
            await w.close()
            got = [r async for r in log.reader(stop_at=positions[-1])]
            assert [r.data for r in got] == expected
            assert [r.position for r in got] == positions

    asyncio.run(go())
