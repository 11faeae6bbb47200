"""A durable cursor on a real (in-memory) cluster against a model, over generated scripts of
receives, acks, cumulative acks, nacks, crashes (the consumer stops without closing and a new
one subscribes), takeovers (a new consumer while the old one lives: the old one is fenced)
and truncation under the cursor. The invariants: nothing whose acknowledgement returned is
handed out again; every record neither acknowledged nor truncated is handed out (in the end,
draining); the mark-delete position is never past an unacknowledged record."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logs_kit import mem_cluster

from pybk import LedgerFencedError, Position

pytestmark = pytest.mark.timeout(600)

TOTAL = 24

step = st.one_of(
    st.tuples(st.just("receive"), st.integers(1, 6)),
    st.tuples(st.just("ack"), st.integers(0, 100)),
    st.tuples(st.just("cum"), st.integers(0, 100)),
    st.tuples(st.just("nack"), st.integers(0, 100)),
    st.tuples(st.just("crash"), st.just(0)),
    st.tuples(st.just("takeover"), st.just(0)),
    st.tuples(st.just("truncate"), st.integers(0, TOTAL - 1)),
)


async def _script(steps: list[tuple[str, int]]) -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=3)
        async with await log.writer() as w:
            positions: list[Position] = []
            for i in range(TOTAL):  # 2 records per entry, 3 entries per segment
                positions += await w.append_many([b"%d-a" % i, b"%d-b" % i]) if i % 2 else \
                    [await w.append(b"%d" % i)]
        records = positions
        acked: set[Position] = set()  # acknowledgements that returned
        truncated_before: Position | None = None
        cur = await log.subscribe("c", redelivery_delay=0.0)
        handed: list[Position] = []  # handed out to this consumer, not known acked

        async def receive(wait: float = 0.2) -> Position | None:
            try:
                rec = await asyncio.wait_for(cur.receive(), wait)
            except TimeoutError:
                return None
            assert rec is not None
            assert rec.position not in acked, f"{rec.position} acked, handed out again"
            # (a record the reader had fetched before a truncation may still come: the log
            # reader checks the truncation point per batch read, not per record handed out)
            return rec.position

        for op, n in steps:
            if op == "receive":
                for _ in range(n):
                    pos = await receive()
                    if pos is None:
                        break
                    if pos not in handed:
                        handed.append(pos)
            elif op in ("ack", "cum", "nack") and handed:
                pos = handed[n % len(handed)]
                if op == "ack":
                    await cur.ack(pos)
                    acked.add(pos)
                    handed.remove(pos)
                elif op == "cum":
                    await cur.ack_cumulative(pos)
                    acked.update(p for p in records if p <= pos)
                    handed = [p for p in handed if p > pos]
                else:
                    cur.nack(pos)
            elif op == "crash":
                await cur.abort()
                cur = await log.subscribe("c", redelivery_delay=0.0)
                handed = []
            elif op == "takeover":
                old = cur
                cur = await log.subscribe("c", redelivery_delay=0.0)
                live = [p for p in handed if truncated_before is None or p >= truncated_before]
                if live:
                    with pytest.raises(LedgerFencedError):
                        await old.ack(live[0])
                await old.close()
                handed = []
            elif op == "truncate":
                before = records[n]
                if truncated_before is None or before > truncated_before:
                    await log.truncate(before)
                    truncated_before = before
            md = await cur.mark_delete_position()
            if md is not None:
                unacked = [p for p in records if p <= md and p not in acked
                           and (truncated_before is None or p >= truncated_before)]
                assert not unacked, f"mark-delete {md} past unacknowledged {unacked[:3]}"
        # drain: everything neither acknowledged nor truncated is handed out, then acked
        await cur.abort()
        cur = await log.subscribe("c")
        seen: set[Position] = set()
        want = {p for p in records if p not in acked
                and (truncated_before is None or p >= truncated_before)}
        while not want <= seen:
            pos = await receive(30.0)
            assert pos is not None, f"never handed out: {sorted(want - seen)[:5]}"
            seen.add(pos)
        await cur.close()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(step, min_size=1, max_size=25))
def test_a_cursor_against_a_model(steps: list[tuple[str, int]]) -> None:
    asyncio.run(_script(steps))
