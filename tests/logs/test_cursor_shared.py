"""Shared consumption of one cursor: consumers (tasks, or threads through the sync facade)
each get distinct records, all of them once; a consumer that closes hands what it held to
the others at once; a consumer acknowledges only what it received; closing the cursor under
waiting consumers ends them with a clear error; what was acknowledged stays acknowledged
for the cursor's next owner."""

from __future__ import annotations

import asyncio
import threading

import pytest
from logs_kit import mem_cluster

pytestmark = pytest.mark.timeout(60)


async def write(log, n):  # type: ignore[no-untyped-def]
    async with await log.writer() as w:
        positions = await w.append_many([b"r%d" % i for i in range(n)])
        await w.mark_end_of_stream()
        return positions


async def test_each_record_goes_to_one_consumer_and_all_are_consumed() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=7)
        cur = await log.subscribe("c")
        got: dict[str, list] = {}  # type: ignore[type-arg]

        async def work(name: str) -> None:
            async with cur.consumer(name) as c:
                got[name] = []
                async for rec in c:
                    got[name].append(rec.position)
                    await asyncio.sleep(0)  # (the others' turn)
                    await c.ack(rec)

        workers = [asyncio.create_task(work(f"w{i}")) for i in range(3)]
        positions = await write(log, 60)  # written while the consumers already wait
        await asyncio.wait_for(asyncio.gather(*workers), 30)
        everything = sorted(p for ps in got.values() for p in ps)
        assert everything == positions  # each record once, none missing
        assert all(got[name] for name in got), {n: len(ps) for n, ps in got.items()}
        assert await cur.mark_delete_position() == positions[-1]
        await cur.close()


async def test_a_closed_consumers_records_go_to_the_others_at_once() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 6)
        cur = await log.subscribe("c")
        a, b = cur.consumer("a"), cur.consumer("b")
        held = [(await asyncio.wait_for(a.receive(), 10)).position for _ in range(3)]
        assert a.pending() == held == positions[:3]
        await a.ack(held[1])
        a.close()
        with pytest.raises(ValueError, match="closed"):
            await a.receive()
        again = [(await asyncio.wait_for(b.receive(), 10)).position for _ in range(5)]
        assert sorted(again) == [held[0], held[2], *positions[3:]]  # a's, then the rest
        for p in again:
            await b.ack(p)
        assert await asyncio.wait_for(b.receive(), 10) is None  # end of stream
        assert await cur.mark_delete_position() == positions[-1]
        await cur.close()
        assert await log.cursors() == {"c": positions[-1]}


async def test_a_consumer_settles_only_what_it_received() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 3)
        cur = await log.subscribe("c")
        a, b = cur.consumer("a"), cur.consumer("b")
        rec = await asyncio.wait_for(a.receive(), 10)
        with pytest.raises(ValueError, match="did not receive"):
            await b.ack(rec.position)
        with pytest.raises(ValueError, match="did not receive"):
            b.nack(rec.position)
        a.nack(rec, delay=0.0)  # handed back: any consumer may get it
        assert a.pending() == []
        with pytest.raises(ValueError, match="did not receive"):
            await a.ack(rec)
        assert (await asyncio.wait_for(b.receive(), 10)).position == positions[0]
        await cur.close()


async def test_closing_the_cursor_ends_consumers_waiting_for_records() -> None:
    for _ in range(20):  # (raced: the close lands while both wait, at once)
        async with mem_cluster() as cluster:
            log = await cluster.client().namespace().create_log("l")
            cur = await log.subscribe("c")
            waiting = [asyncio.create_task(cur.consumer().receive()) for _ in range(2)]
            await asyncio.sleep(0)
            await cur.close()
            done = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 10)
            assert all(isinstance(e, ValueError) and "closed" in str(e) for e in done), done


async def test_unacknowledged_records_of_shared_consumers_go_to_the_next_owner() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        positions = await write(log, 4)
        cur = await log.subscribe("c")
        a, b = cur.consumer(), cur.consumer()
        ra = await asyncio.wait_for(a.receive(), 10)
        rb = await asyncio.wait_for(b.receive(), 10)
        await b.ack(rb)
        await cur.abort()  # the owner crashes with a's record unacknowledged
        nxt = await log.subscribe("c")
        redelivered = [(await asyncio.wait_for(nxt.receive(), 10)).position for _ in range(3)]
        assert redelivered == [ra.position, *positions[2:]]
        await nxt.close()


def test_worker_threads_share_a_cursor_through_the_sync_facade(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pybk

    with pybk.sync.LocalCluster(str(tmp_path / "c"), bookies=3) as cluster:
        log = cluster.client().namespace().create_log("l")
        with log.writer() as w:
            positions = w.append_many([b"x%d" % i for i in range(40)])
            w.mark_end_of_stream()
        got: list[list] = [[] for _ in range(4)]  # type: ignore[type-arg]
        errors: list[BaseException] = []
        with log.subscribe("s") as cur:
            def work(i: int) -> None:
                try:
                    with cur.consumer(f"t{i}") as c:
                        for rec in c:
                            got[i].append(rec.position)
                            c.ack(rec)
                except BaseException as exc:  # (reported by the main thread)
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not errors and not any(t.is_alive() for t in threads)
            assert sorted(p for ps in got for p in ps) == positions
            assert cur.mark_delete_position() == positions[-1]
