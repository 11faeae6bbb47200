"""Hypothesis: a table against a dict, through server crashes, takeovers by another server,
checkpoints and bookie restarts. Whatever was acknowledged is what every later read sees."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logs_kit import mem_cluster

import pybk
from pybk.tables import AsyncTable, TablesEngine

KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e"])
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("put"), KEYS, st.binary(max_size=3)),
    st.tuples(st.just("incr"), KEYS, st.integers(-3, 3)),
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("crash")),        # the serving process dies; another starts
    st.tuples(st.just("takeover")),     # another server takes the ranges while this one lives
    st.tuples(st.just("bookie"), st.integers(0, 3)),  # restart one bookie
), max_size=40)


async def _run(actions: list[tuple[Any, ...]]) -> None:
    async with mem_cluster(bookies=4) as cluster:
        def new_engine() -> TablesEngine:
            return TablesEngine(cluster.client(), checkpoint_every=7)

        engine = new_engine()
        await engine.create_namespace("default")
        info = await engine.catalog.create_table("default", "t", 2)
        t = AsyncTable(engine, info)
        model: dict[bytes, bytes | int] = {}
        old: list[TablesEngine] = []
        for action in actions:
            kind = action[0]
            if kind == "put":
                _, k, v = action
                try:
                    await t.put(k, v)
                    assert not isinstance(model.get(k), int)
                    model[k] = v
                except pybk.TableBadRequestError:
                    assert isinstance(model.get(k), int)
            elif kind == "incr":
                _, k, n = action
                try:
                    model[k] = await t.increment(k, n)
                    assert not isinstance(model.get(k), bytes)
                except pybk.TableBadRequestError:
                    assert isinstance(model.get(k), bytes)
            elif kind == "delete":
                assert await t.delete(action[1]) == (action[1] in model)
                model.pop(action[1], None)
            elif kind == "get":
                kv = await t.get(action[1])
                assert (None if kv is None else kv.value) == model.get(action[1])
            elif kind == "checkpoint":
                await t.checkpoint()
            elif kind == "crash":
                await engine.abandon()
                engine = new_engine()
                t = AsyncTable(engine, info)
            elif kind == "takeover":
                old.append(engine)  # still alive, fenced on its next write
                engine = new_engine()
                t = AsyncTable(engine, info)
                await t.get(b"a")
                await t.get(b"e")
            else:
                bookie = cluster.bookie_ids[action[1]]
                await cluster.stop_bookie(bookie)
                await cluster.start_bookie(bookie)
        assert {kv.key: kv.value async for kv in t.scan()} == model
        for e in [*old, engine]:
            await e.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ACTIONS)
def test_table_matches_a_dict_through_crashes_takeovers_checkpoints_and_bookie_restarts(
        actions: list[tuple[Any, ...]]) -> None:
    asyncio.run(_run(actions))
