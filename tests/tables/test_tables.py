"""Tables on an in-memory cluster: the operations, their errors, and what survives a crash,
a checkpoint and a takeover (nothing that was acknowledged is lost; revisions never go
back)."""

from __future__ import annotations

import asyncio
import random

import pytest
from logs_kit import mem_cluster, until

import pybk
from pybk.cluster import LocalCluster
from pybk.tables import AsyncTable, TablesEngine
from pybk.tables.engine import LOG_NAMESPACE
from pybk.tables.range import log_names


async def _table(engine: TablesEngine, name: str = "t", ranges: int = 4) -> AsyncTable:
    try:
        await engine.create_namespace("default")
    except pybk.NamespaceExistsError:
        pass
    try:
        info = await engine.catalog.create_table("default", name, ranges)
    except pybk.TableExistsError:
        info = await engine.catalog.get_table("default", name)
    return AsyncTable(engine, info)


def _engine(cluster: LocalCluster, **kw: object) -> TablesEngine:
    return TablesEngine(cluster.client(), **kw)  # type: ignore[arg-type]


async def test_operations_and_their_results() -> None:
    async with mem_cluster() as cluster:
        t = await _table(_engine(cluster))
        r1 = await t.put(b"k", b"v")
        kv = await t.get(b"k")
        assert kv == pybk.KeyValue(b"k", b"v", 0, r1, r1)
        r2 = await t.put("k", "w")
        kv = await t.get(b"k")
        assert kv is not None and kv.value == b"w" and kv.version == 1 and kv.mod_revision == r2
        assert await t.increment(b"n", 5) == 5 and await t.increment(b"n", -2) == 3
        assert (await t.get(b"n")).value == 3  # type: ignore[union-attr]
        with pytest.raises(pybk.TableBadRequestError):
            await t.put(b"n", b"x")
        with pytest.raises(pybk.TableBadRequestError):
            await t.increment(b"k", 1)
        assert await t.delete(b"k") is True and await t.delete(b"k") is False
        assert await t.get(b"k") is None
        for i in range(30):
            await t.put(b"s%02d" % i, b"%d" % i)
        keys = [kv.key async for kv in t.scan(start=b"s05", end=b"s20", limit=10)]
        assert keys == [b"s%02d" % i for i in range(5, 15)]


async def test_txn_on_a_one_range_table() -> None:
    async with mem_cluster() as cluster:
        t = await _table(_engine(cluster), ranges=1)
        assert await t.txn(compare=[(b"k", "version", "==", -1)],
                           success=[("put", b"k", b"v"), ("incr", b"c", 1)])
        assert not await t.txn(compare=[(b"k", "version", "==", -1)],
                               success=[("put", b"k", b"again")], failure=[("incr", b"c", 1)])
        assert (await t.get(b"k")).value == b"v"  # type: ignore[union-attr]
        assert (await t.get(b"c")).value == 2  # type: ignore[union-attr]
        assert await t.txn(compare=[(b"k", "version", "==", 0)],
                           success=[("put", b"k", b"v2")])


async def test_txn_across_ranges_is_refused() -> None:
    async with mem_cluster() as cluster:
        t = await _table(_engine(cluster), ranges=64)
        with pytest.raises(pybk.TableBadRequestError, match="different ranges"):
            await t.txn(success=[("put", b"a%d" % i, b"x") for i in range(20)])


async def test_catalog_errors() -> None:
    async with mem_cluster() as cluster:
        e = _engine(cluster)
        with pytest.raises(pybk.NamespaceNotFoundError):
            await e.catalog.create_table("nope", "t", 4)
        await e.create_namespace("ns")
        with pytest.raises(pybk.NamespaceExistsError):
            await e.create_namespace("ns")
        with pytest.raises(ValueError, match="bad table name"):
            await e.catalog.create_table("ns", "a/b", 4)
        with pytest.raises(ValueError, match="ranges"):
            await e.catalog.create_table("ns", "t", 0)
        with pytest.raises(pybk.TableNotFoundError):
            await e.catalog.get_table("ns", "t")
        info = await e.catalog.create_table("ns", "t", 2)
        assert await e.catalog.table_by_id(info.table_id) == info
        with pytest.raises(pybk.TableExistsError):
            await e.catalog.create_table("ns", "t", 2)
        t = AsyncTable(e, info)
        await t.put(b"k", b"v")
        await e.delete_namespace("ns")  # its tables and their logs go with it
        assert await cluster.client().namespace(LOG_NAMESPACE).list_logs() == []
        with pytest.raises(pybk.NamespaceNotFoundError):
            await e.catalog.get_namespace("ns")


async def test_a_crash_loses_nothing_acknowledged() -> None:
    async with mem_cluster() as cluster:
        e1 = _engine(cluster)
        t1 = await _table(e1)
        acked: dict[bytes, bytes] = {}
        revs: dict[bytes, int] = {}

        async def put(k: bytes, v: bytes) -> None:
            revs[k] = await t1.put(k, v)
            acked[k] = v

        tasks = [asyncio.ensure_future(put(b"k%d" % i, b"v%d" % i)) for i in range(200)]
        await until(lambda: len(acked) >= 100)
        await e1.abandon()  # as if the process died now, appends still in flight
        await asyncio.gather(*tasks, return_exceptions=True)
        e2 = _engine(cluster)
        t2 = await _table(e2)
        for k, v in acked.items():
            kv = await t2.get(k)
            assert kv is not None and kv.value == v and kv.mod_revision == revs[k]
        _, range_rev = await t2.get_at(b"k0")
        rev = await t2.put(b"k0", b"new")
        assert rev > range_rev  # the range's revisions go on from where the dead owner's ended
        kv0, served_at = await t2.get_at(b"k0")
        assert kv0 is not None and kv0.mod_revision == rev and served_at >= rev


async def test_revisions_never_reused_after_a_crash() -> None:
    async with mem_cluster() as cluster:
        e1 = _engine(cluster)
        t1 = await _table(e1, ranges=1)
        seen = [await t1.put(b"k", b"%d" % i) for i in range(20)]
        await e1.abandon()
        t2 = await _table(_engine(cluster), ranges=1)
        nxt = await t2.put(b"k", b"after")
        assert nxt > max(seen)


async def test_checkpoint_truncates_and_recovery_uses_it() -> None:
    async with mem_cluster() as cluster:
        e1 = _engine(cluster, checkpoint_every=10)
        t1 = await _table(e1, ranges=1)
        for i in range(55):
            await t1.put(b"k%d" % (i % 7), b"%d" % i)
        owner = e1.owned()[0]
        await until(lambda: owner.checkpoint_revision >= 50)
        await owner.checkpoint()  # and one now, explicitly
        ns = cluster.client().namespace(LOG_NAMESPACE)
        cmd_name, _ = log_names(t1.info.table_id, owner.range_id)
        first = await (await ns.open_log(cmd_name)).first_position()
        md = await (await ns.open_log(cmd_name)).metadata()
        assert md.truncated_before is not None  # the commands behind the checkpoint are gone
        del first
        await t1.put(b"after", b"x")  # one command after the checkpoint
        await e1.abandon()
        e2 = _engine(cluster)
        t2 = await _table(e2, ranges=1)
        kv = await t2.get(b"after")
        owner2 = e2.owned()[0]
        assert kv is not None and owner2.replayed == 1 and owner2.checkpoint_revision >= 55
        for j in range(7):
            last = max(i for i in range(55) if i % 7 == j)
            assert (await t2.get(b"k%d" % j)).value == b"%d" % last  # type: ignore[union-attr]


async def test_a_takeover_fences_the_old_owner() -> None:
    async with mem_cluster() as cluster:
        e1, e2 = _engine(cluster), _engine(cluster)
        t1 = await _table(e1, ranges=1)
        await t1.put(b"k", b"from-1")
        t2 = await _table(e2, ranges=1)
        kv = await t2.get(b"k")  # takes the range over: sees what the old owner acknowledged
        assert kv is not None and kv.value == b"from-1"
        with pytest.raises(pybk.RangeFencedError):
            await t1.put(b"k", b"late")
        assert (await t2.get(b"k")).value == b"from-1"  # type: ignore[union-attr]
        await t2.put(b"k", b"from-2")
        # the old owner's next call takes the range back, caught up
        assert (await t1.get(b"k")).value == b"from-2"  # type: ignore[union-attr]
        with pytest.raises(pybk.RangeFencedError):
            await t2.put(b"k", b"now fenced")


async def test_a_linearizable_read_after_a_silent_takeover() -> None:
    async with mem_cluster() as cluster:
        e1, e2 = _engine(cluster), _engine(cluster)
        t1, t2 = await _table(e1, ranges=1), await _table(e2, ranges=1)
        await t1.put(b"k", b"1")
        await t2.put(b"k", b"2")  # takes over; the old owner has not written since
        # a stale read answers from what the old owner applied; a linearizable one finds the
        # range taken, takes it back and catches up first
        assert (await t1.get(b"k", stale=True)).value == b"1"  # type: ignore[union-attr]
        assert (await t1.get(b"k")).value == b"2"  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", range(4))
async def test_random_ops_crashes_checkpoints_against_a_model(seed: int) -> None:
    rng = random.Random(seed)
    async with mem_cluster(seed=seed) as cluster:
        engine = _engine(cluster, checkpoint_every=rng.choice([5, 20, 1000]))
        t = await _table(engine, ranges=2)
        model: dict[bytes, bytes | int] = {}
        for _ in range(150):
            k = b"k%d" % rng.randrange(6)
            roll = rng.random()
            if roll < 0.4:
                v = b"%d" % rng.randrange(100)
                if isinstance(model.get(k), int):
                    with pytest.raises(pybk.TableBadRequestError):
                        await t.put(k, v)
                else:
                    await t.put(k, v)
                    model[k] = v
            elif roll < 0.6:
                n = rng.randrange(-3, 4)
                if isinstance(model.get(k), bytes):
                    with pytest.raises(pybk.TableBadRequestError):
                        await t.increment(k, n)
                else:
                    model[k] = await t.increment(k, n)
                    assert isinstance(model[k], int)
            elif roll < 0.75:
                assert await t.delete(k) == (k in model)
                model.pop(k, None)
            elif roll < 0.8:
                await t.checkpoint()
            elif roll < 0.87:
                await engine.abandon()  # a crash; a new server takes over and recovers
                engine = _engine(cluster, checkpoint_every=rng.choice([5, 20, 1000]))
                t = await _table(engine, ranges=2)
            else:
                kv = await t.get(k)
                assert (None if kv is None else kv.value) == model.get(k)
        got = {kv.key: kv.value async for kv in t.scan()}
        assert got == model


def test_embedded_sync_tables_survive_a_reopen(tmp_path: object) -> None:
    with pybk.Tables(tmp_path) as tables:
        t = tables.create_table("state", num_ranges=2)
        t.put(b"k", b"v")
        assert t.increment(b"n", 2) == 2
        assert tables.list_tables() == ["state"] and tables.list_namespaces() == ["default"]
        with pytest.raises(pybk.LockedError):
            pybk.Tables(tmp_path)
    with pybk.Tables(tmp_path) as tables:
        t = tables.open_table("state")
        assert t.get(b"k").value == b"v"  # type: ignore[union-attr]
        assert [kv.key for kv in t.scan()] == [b"k", b"n"]


def test_tables_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="directory"):
        pybk.AsyncTables()
    with pytest.raises(TypeError, match="directory"):
        pybk.AsyncTables("/tmp/x", metadata="sqlite:///x.db")


async def test_a_follower_reads_behind_the_owner_never_ahead_and_across_truncation() -> None:
    async with mem_cluster() as cluster:
        owner = _engine(cluster, checkpoint_every=5)
        t = await _table(owner, ranges=1)
        for i in range(12):
            await t.put(b"k", b"%d" % i)
        follower = TablesEngine(cluster.client(), follower=True)
        ft = AsyncTable(follower, t.info)
        with pytest.raises(pybk.TableError, match="reads only"):
            await ft.put(b"k", b"x")

        async def follower_sees(value: bytes) -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while True:
                kv = await ft.get(b"k")
                if kv is not None and kv.value == value:
                    return
                assert loop.time() < deadline, (kv, value)
                await asyncio.sleep(0.005)

        await follower_sees(b"11")
        for i in range(12, 40):  # checkpoints every 5: the log is truncated under the follower
            await t.put(b"k", b"%d" % i)
            kv, rev = await ft.get_at(b"k")
            _, own_rev = await t.get_at(b"k")
            assert rev <= own_rev  # behind, never ahead
            assert kv is not None and int(kv.value) <= i
        await follower_sees(b"39")
        assert (await owner.owned()[0].confirm_owner()) is None  # never fenced by it
        assert [kv.key async for kv in ft.scan()] == [b"k"]
        await follower.close()
        await owner.close()


async def test_submit_appends_then_gives_the_result_and_raises_only_before_appending() -> None:
    """``TablesEngine.submit``: the command appended (``in_flight`` counts it until the log
    acknowledges it), then its result; refused commands raise before anything is appended."""
    from pybk.testing.hooks import is_normal_add

    async with mem_cluster() as cluster:
        engine = _engine(cluster)
        t = await _table(engine, ranges=1)
        await t.put(b"k", b"v")
        owner = engine.owned()[0]
        hold = cluster.transport.hooks.hold(predicate=is_normal_add)
        applied = await engine.submit(t.info, ("incr", b"n", 2))
        await hold.wait_held()
        assert (owner.in_flight, owner.revision) == (1, 1)
        hold.remove(release=True)
        assert await applied == 2
        assert (owner.in_flight, owner.revision) == (0, 2)
        with pytest.raises(pybk.TableBadRequestError):
            await engine.submit(t.info, ("put", b"", b"x"))  # an empty key
        with pytest.raises(pybk.TableBadRequestError):
            await engine.submit(t.info, ("frob", b"k"))
        with pytest.raises(TypeError):
            await engine.submit(t.info, ("put", 7, b"x"))
        follower = TablesEngine(cluster.client(), follower=True)
        with pytest.raises(pybk.TableError, match="reads only"):
            await follower.submit(t.info, ("put", b"k", b"w"))
        assert (owner.in_flight, owner.revision) == (0, 2)  # nothing else was appended
        bad = await engine.submit(t.info, ("incr", b"k", 1))  # appended; applying fails
        with pytest.raises(pybk.TableBadRequestError):
            await bad
        assert owner.revision == 3  # (its revision is spent, as on replay)
        await engine.close()
