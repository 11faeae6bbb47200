"""The checker on known-good and known-bad histories, then on real tables: concurrent
clients on two servers taking one range from each other; the real code passes, and the same
run with the owner's read check switched off (a mutation) is caught."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import pytest
from logs_kit import mem_cluster

import pybk
from pybk.tables import AsyncTable, TablesEngine
from pybk.tables.range import RangeOwner
from pybk.testing.linearizability import Op, check


def test_sequential_history_is_linearizable() -> None:
    h = [Op("put", b"a", None, 0, 1), Op("get", None, b"a", 2, 3),
         Op("incr", 1, "bad", 4, 5), Op("delete", None, True, 6, 7), Op("get", None, None, 8, 9)]
    assert check(h)


def test_overlapping_calls_may_go_either_way() -> None:
    h = [Op("put", b"a", None, 0, 10), Op("get", None, None, 1, 2), Op("get", None, b"a", 3, 4)]
    assert check(h)


def test_a_stale_read_is_caught() -> None:
    h = [Op("put", b"a", None, 0, 1), Op("put", b"b", None, 2, 3), Op("get", None, b"a", 4, 5)]
    assert not check(h)


def test_a_lost_write_is_caught() -> None:
    h = [Op("put", b"a", None, 0, 1), Op("get", None, None, 2, 3)]
    assert not check(h)


def test_reads_going_backwards_are_caught() -> None:
    h = [Op("put", b"a", None, 0, 1), Op("put", b"b", None, 2, 20),
         Op("get", None, b"b", 3, 4), Op("get", None, b"a", 5, 6)]
    assert not check(h)


def test_unknown_outcomes_may_or_may_not_have_happened() -> None:
    took = [Op("put", b"a", None, 0, None), Op("get", None, b"a", 5, 6)]
    did_not = [Op("put", b"a", None, 0, None), Op("get", None, None, 5, 6)]
    assert check(took) and check(did_not)
    both = [Op("put", b"a", None, 0, None), Op("get", None, b"a", 5, 6),
            Op("get", None, None, 7, 8)]
    assert not check(both)  # once seen, it happened


def test_counters_lost_increment_is_caught() -> None:
    h = [Op("incr", 1, 1, 0, 1), Op("incr", 1, 1, 2, 3)]
    assert not check(h)
    assert check([Op("incr", 1, 1, 0, 3), Op("incr", 1, 2, 1, 2)])


def test_too_large_a_search_is_refused() -> None:
    h = [Op("put", bytes([i]), None, 0, 100) for i in range(20)] + [Op("get", None, b"x", 101, 102)]
    with pytest.raises(ValueError, match="too large"):
        check(h, max_states=1000)


async def _history(seed: int) -> dict[bytes, list[Op]]:
    rng = random.Random(seed)
    async with mem_cluster(seed=seed) as cluster:
        engines = [TablesEngine(cluster.client()) for _ in range(2)]
        await engines[0].create_namespace("default")
        info = await engines[0].catalog.create_table("default", "t", 1)
        tables = [AsyncTable(e, info) for e in engines]
        loop = asyncio.get_running_loop()
        history: dict[bytes, list[Op]] = {b"a": [], b"b": []}

        async def client(c: int) -> None:
            for _ in range(12):
                t = tables[rng.randrange(2)]  # either server: they take the range from each other
                key = rng.choice([b"a", b"b"])
                kind = rng.choice(["put", "get", "get", "incr"])
                arg: Any = b"%d" % rng.randrange(1000) if kind == "put" else (
                    rng.randrange(1, 4) if kind == "incr" else None)
                call = loop.time()
                try:
                    if kind == "put":
                        await t.put(key, arg)
                        out: Any = None
                    elif kind == "get":
                        kv = await t.get(key)
                        out = None if kv is None else kv.value
                    else:
                        out = await t.increment(key, arg)
                except pybk.TableBadRequestError:
                    out = "bad"
                except pybk.BKError:
                    if kind != "get":  # a write whose outcome is unknown
                        history[key].append(Op(kind, arg, None, call, None))
                    continue
                history[key].append(Op(kind, arg, out, call, loop.time()))

        await asyncio.gather(*(client(c) for c in range(4)))
        for e in engines:
            await e.close()
        return history


@pytest.mark.parametrize("seed", range(3))
async def test_two_servers_taking_a_range_from_each_other_stay_linearizable(seed: int) -> None:
    history = await _history(seed)
    for ops in history.values():
        assert check(ops), ops


async def test_switching_off_the_owners_read_check_is_caught(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def trust_myself(self: RangeOwner) -> None:  # the mutation: never ask the log
        return None

    monkeypatch.setattr(RangeOwner, "confirm_owner", trust_myself)
    caught = 0
    for seed in range(10):
        history = await _history(seed)
        if not all(check(ops) for ops in history.values()):
            caught += 1
            break
    assert caught, "stale reads from a fenced owner went unnoticed in 10 seeds"


async def _put_lost_in_a_crash(*, mutate: bool) -> list[Op]:
    """put a (acknowledged); put b held at the bookies; a read; the owner dies and b's adds
    are lost; a new owner reads. The history of key k."""
    from logs_kit import FAST

    from pybk.tables.range import APPLY_BEFORE_ACK
    from pybk.testing.hooks import is_normal_add

    config = replace(FAST, mutations=frozenset({APPLY_BEFORE_ACK} if mutate else ()))
    async with mem_cluster(config=config) as cluster:
        loop = asyncio.get_running_loop()
        e1 = TablesEngine(cluster.client())
        await e1.create_namespace("default")
        t1 = AsyncTable(e1, await e1.catalog.create_table("default", "t", 1))
        h: list[Op] = []
        c = loop.time()
        await t1.put(b"k", b"a")
        h.append(Op("put", b"a", None, c, loop.time()))
        hold = cluster.transport.hooks.hold(predicate=is_normal_add)
        pending = asyncio.ensure_future(t1.put(b"k", b"b"))
        await hold.wait_held()
        h.append(Op("put", b"b", None, loop.time(), None))  # its outcome: unknown
        c = loop.time()
        kv = await t1.get(b"k", stale=True)
        h.append(Op("get", None, None if kv is None else kv.value, c, loop.time()))
        await e1.abandon()  # the owner dies; b's adds never reach a disk
        hold.drop_held()
        hold.remove(release=False)
        await asyncio.gather(pending, return_exceptions=True)
        e2 = TablesEngine(cluster.client())
        t2 = AsyncTable(e2, t1.info)
        c = loop.time()
        kv = await t2.get(b"k")
        h.append(Op("get", None, None if kv is None else kv.value, c, loop.time()))
        await e2.close()
        return h


async def test_applying_before_the_log_acknowledges_is_caught() -> None:
    assert check(await _put_lost_in_a_crash(mutate=False))
    assert not check(await _put_lost_in_a_crash(mutate=True))  # the switch APPLY_BEFORE_ACK
