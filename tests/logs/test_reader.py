"""Log readers: from any position or txid across segments, tailing a quiet writer (explicit
LAC), truncation, end of stream, corruption, takeover while tailing, bounded read-ahead."""

from __future__ import annotations

import asyncio

import pytest
from logs_kit import mem_cluster

from pybk import AlreadyTruncatedError, CorruptRecordError, LogNotFoundError, Position
from pybk.logs import TRUNCATED, ReaderOptions
from pybk.wire import Op

pytestmark = pytest.mark.timeout(60)


async def written_log(cluster, n: int = 20, **knobs):  # type: ignore[no-untyped-def]
    log = await cluster.client().namespace().create_log("l", roll_entries=3, **knobs)
    async with await log.writer(flush_records=2) as w:
        positions = [await w.append(b"r%02d" % i, txid=100 + i) for i in range(n)]
    return log, positions


async def test_every_start_position_reads_the_suffix_across_segments() -> None:
    async with mem_cluster() as cluster:
        log, ps = await written_log(cluster, 20)
        assert len({p.segment for p in ps}) > 3
        for i, start in enumerate(ps):
            got = [r async for r in log.reader(start, stop_at=ps[-1])]
            assert [r.position for r in got] == ps[i:]
            assert [r.data for r in got] == [b"r%02d" % j for j in range(i, 20)]
            assert [r.txid for r in got] == list(range(100 + i, 120))
        # positions that hold no record start at the next one
        between = Position(ps[3].segment, ps[3].entry, 7)
        assert (await log.reader(between).__anext__()).position > ps[3]
        before_all = [r.position async for r in log.reader(stop_at=ps[-1])]
        assert before_all == ps


async def test_from_a_txid() -> None:
    async with mem_cluster() as cluster:
        log, ps = await written_log(cluster, 20)
        for t in (0, 100, 107, 119):
            got = [r.txid async for r in log.reader(txid=t, stop_at=ps[-1])]
            assert got == list(range(max(t, 100), 120))
        with pytest.raises(ValueError, match="not both"):
            log.reader(ps[0], txid=3)
        with pytest.raises(ValueError, match="txid"):
            log.reader(txid=-1)


async def test_a_quiet_writers_record_reaches_a_tailing_reader() -> None:
    """Explicit LAC (on by default) makes the last acknowledged record visible although the
    writer writes nothing after it: without it the reader would wait for ever."""
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer()
        reader = log.reader()
        nxt = asyncio.ensure_future(reader.__anext__())
        for _ in range(5):
            await asyncio.sleep(0)
        assert not nxt.done()
        p = await w.append(b"only one")
        rec = await asyncio.wait_for(nxt, 10)
        assert (rec.position, rec.data) == (p, b"only one")
        more = [await w.append(b"%d" % i) for i in range(3)]
        got = [await asyncio.wait_for(reader.__anext__(), 10) for _ in range(3)]
        assert [r.position for r in got] == more
        await reader.aclose()
        await w.close()


async def test_tail_follows_rolls_and_a_takeover() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=2)
        got: list[bytes] = []

        async def tail() -> None:
            async for rec in log.reader():
                got.append(rec.data)

        task = asyncio.ensure_future(tail())
        a = await log.writer()
        for i in range(5):
            await a.append(b"a%d" % i)
        await a.abort()  # crashed writer: its segment is in progress
        b = await log.writer()  # recovers it, starts a new one
        for i in range(3):
            await b.append(b"b%d" % i)
        await b.mark_end_of_stream()
        await asyncio.wait_for(task, 20)  # ends at the end of stream
        assert got == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(3)]


async def test_truncation() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log, ps = await written_log(cluster, 20)
        w = await log.writer()
        cut = ps[10]
        await w.truncate(cut)
        md = await log.metadata()
        assert md.truncated_before == cut
        assert all(s.seq >= cut.segment for s in md.segments)  # wholly-before ones are gone
        assert set(await client.list_ledgers()) == {s.ledger_id for s in md.segments}
        assert [r.position async for r in log.reader(stop_at=ps[-1])] == ps[10:]
        for early in (ps[0], ps[9], Position(1, 0, 0)):
            with pytest.raises(AlreadyTruncatedError, match="truncation point"):
                await log.reader(early).__anext__()
        assert await log.first_position() == cut
        await w.truncate(ps[5])  # already truncated further: nothing to do
        with pytest.raises(ValueError, match="cannot truncate"):
            await w.truncate(Position(99, 0, 0))
        await w.truncate(ps[-1].next_slot())  # everything
        assert await log.first_position() is None and await log.last_position() is None
        p = await w.append(b"after")
        assert [r.data async for r in log.reader(stop_at=p)] == [b"after"]
        await w.close()


async def test_a_reader_behind_a_truncation_gets_already_truncated() -> None:
    async with mem_cluster() as cluster:
        log, ps = await written_log(cluster, 20)
        reader = log.reader(options=ReaderOptions(read_ahead_entries=1))
        assert (await reader.__anext__()).position == ps[0]
        await log.truncate(ps[15])  # truncation by someone who is not the writer
        with pytest.raises(AlreadyTruncatedError):
            async for _ in reader:
                pass
        await reader.aclose()


async def test_half_done_truncation_is_finished_by_the_next_writer() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log, ps = await written_log(cluster, 12)
        from pybk.logs.truncation import plan_truncation

        cat = log._cat
        await cat.update(lambda md: plan_truncation(md, ps[7]))  # step 1 only (a crash)
        md = await log.metadata()
        assert any(s.state == TRUNCATED for s in md.segments)
        assert [r.position async for r in log.reader(stop_at=ps[-1])] == ps[7:]
        w = await log.writer()
        md = await log.metadata()
        assert not any(s.state == TRUNCATED for s in md.segments)
        assert set(await client.list_ledgers()) == {s.ledger_id for s in md.segments}
        await w.close()


async def test_retention_by_size_and_by_age() -> None:
    now = [1000.0]
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace(clock=lambda: now[0])
        sized = await ns.create_log("s", roll_entries=2, retention_bytes=400)
        async with await sized.writer() as w:
            ps = [await w.append(bytes(100)) for _ in range(10)]
        segs = await sized.segments()
        assert sum(s.bytes for s in segs if s.state != TRUNCATED) <= 400 + 2 * 136
        first = await sized.first_position()
        assert first is not None and first.segment > 1
        assert [r.position async for r in sized.reader(stop_at=ps[-1])] == [
            p for p in ps if p >= first]
        aged = await ns.create_log("a", roll_entries=2, retention_seconds=60)
        w = await aged.writer()
        for _ in range(4):
            await w.append(b"x")
        await w._wait_roll()  # segment 2 completed at the old time (and its retention ran)
        now[0] += 3600  # an hour later (the injected wall clock)
        for _ in range(2):
            last = await w.append(b"y")
        await w._wait_roll()  # the roll and the retention it runs after it
        md = await aged.metadata()
        assert md.truncated_before is not None and md.truncated_before.segment == 3
        assert [r.data async for r in aged.reader(stop_at=last)] == [b"y", b"y"]
        await w.close()


async def test_a_corrupt_envelope_is_an_error_not_a_record() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer()
        good = await w.append(b"good")
        assert w._lh is not None
        await w._lh.append(b"PE\x01\x00 not an envelope at all")  # a foreign entry
        reader = log.reader(stop_at=Position(1, 1, 0))
        assert (await reader.__anext__()).position == good
        with pytest.raises(CorruptRecordError, match="envelope"):
            await asyncio.wait_for(reader.__anext__(), 10)
        await reader.aclose()
        await w.abort()


async def test_unknown_log_and_bad_arguments() -> None:
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace()
        log = await ns.create_log("l")
        await ns.delete_log("l")
        with pytest.raises(LogNotFoundError):
            await log.reader().__anext__()
        with pytest.raises(TypeError):
            log.reader("1:0:0")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            ReaderOptions(read_ahead_entries=0)


async def test_read_ahead_is_bounded() -> None:
    """A reader of a long log never has more than 2 x read_ahead_entries reads in flight
    (and so never holds more envelopes than that), whatever the log's length."""
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        async with await log.writer(flush_records=1) as w:
            ps = await asyncio.gather(*(w.append(b"%d" % i) for i in range(200)))
        seg_ledger = (await log.segments())[0].ledger_id
        hold = cluster.transport.hooks.hold(op=Op.READ, ledger_id=seg_ledger,
                                            predicate=lambda b, r: r.previous_lac is None)
        reader = log.reader(stop_at=ps[-1], options=ReaderOptions(read_ahead_entries=4))
        got: list[Position] = []

        async def consume() -> None:
            async for rec in reader:
                got.append(rec.position)

        task = asyncio.ensure_future(consume())
        peak = 0
        while not task.done():
            try:
                await hold.wait_held(1, timeout=0.5)
            except TimeoutError:
                continue
            for _ in range(20):
                await asyncio.sleep(0)
            peak = max(peak, len(hold.held))
            hold.release()
        hold.remove()
        await task
        assert got == list(ps)
        assert 4 <= peak <= 8, peak


def test_synchronous_logs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pybk

    with pybk.sync.LocalCluster(tmp_path) as cluster:
        ns = cluster.client().namespace("sync")
        log = ns.create_log("l", roll_entries=2)
        assert ns.list_logs() == ["l"]
        with log.writer() as w:
            ps = [w.append(b"%d" % i) for i in range(5)] + w.append_many([b"x", b"y"])
            w.flush()
        got = list(log.reader(stop_at=ps[-1]))
        assert [r.position for r in got] == ps
        assert [r.data for r in got] == [b"0", b"1", b"2", b"3", b"4", b"x", b"y"]
        assert log.last_position() == ps[-1] and log.first_position() == ps[0]
        log.truncate(ps[2])
        with log.reader(stop_at=ps[-1]) as reader:
            first = reader.read_batch(100)  # what the first read brought (up to 100)
            assert first and [r.position for r in first] == ps[2:2 + len(first)]
            assert [r.position for r in reader] == ps[2 + len(first):]
        ns.delete_log("l")
        assert ns.list_logs() == []
