"""Fencing and recovery (BookKeeper's TestFencing, LedgerRecovery2Test,
ParallelLedgerRecoveryTest, BookieFailureTest), against real bookies.

Where BookKeeper scripts mock bookies, these tests seed entries straight into real bookies
(``seed``) and pin each interleaving with transport hooks: no sleeps, no timing luck.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from pybk.client.context import ClientConfig
from pybk.errors import (
    LedgerFencedError,
    LedgerRecoveryError,
    NotEnoughBookiesError,
    UnauthorizedError,
    UnexpectedConditionError,
)
from pybk.metadata.base import CLOSED, IN_RECOVERY, OPEN
from pybk.testing.hooks import is_fencing, is_recovery_add
from pybk.testing.mutations import RECOVERY_READS_DONT_FENCE, Mutations
from pybk.wire import (
    LAST_ENTRY,
    AddRequest,
    DigestManager,
    ListEntriesRequest,
    Op,
    ReadRequest,
    Request,
    Status,
    master_key,
)

from .conftest import mem_cluster, until

E3 = ["b1", "b2", "b3"]

#: a writer whose bookies learn the LAC only from its adds (it lags one entry: what these
#: tests of reading an open ledger start from)
_LAGGING = ClientConfig(immediate_lac=False)


async def seed(
    cluster: Any, bookie: str, ledger_id: int, entry_id: int, lac: int, length: int,
    payload: bytes, password: bytes = b"",
) -> None:
    """Store one framed entry on one bookie, as a writer whose other adds were lost would."""
    body = DigestManager(ledger_id).frame(entry_id, lac, length, payload)
    resp = await cluster.bookie(bookie).handle(
        AddRequest(ledger_id, entry_id, master_key(password), body)
    )
    assert resp.status == Status.OK, resp


async def held_entries(cluster: Any, bookie: str, ledger_id: int) -> tuple[tuple[int, int], ...]:
    resp = await cluster.bookie(bookie).handle(ListEntriesRequest(ledger_id))
    return resp.ranges if resp.status == Status.OK else ()


async def ledger_on(cluster: Any, e: int, w: int, a: int, order: list[str] | None = None) -> Any:
    """Create a ledger; rewrite its first ensemble to ``order`` (named bookies, BK style)."""
    lh = await cluster.client().create_ledger(e, w, a)
    if order is not None:
        md = await cluster.store.read_ledger(lh.id)
        await cluster.store.write_ledger(md.with_changes(ensembles={0: tuple(order)}), md.version)
    return lh


# --------------------------------------------------------------------------- TestFencing


async def test_basic_fencing() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        for i in range(10):
            await lh.append(b"e%d" % i)
        rh = await cluster.client().open_ledger(lh.id, recovery=True)
        assert rh.last_add_confirmed == lh.last_add_confirmed == 9
        assert rh.is_closed and rh.metadata.length == sum(len(b"e%d" % i) for i in range(10))
        with pytest.raises(LedgerFencedError):
            await lh.append(b"late")
        assert [e.data for e in await rh.read(0, 9)] == [b"e%d" % i for i in range(10)]


async def test_no_recovery_open_does_not_disturb_writer() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client(config=_LAGGING).create_ledger(3, 3, 2)
        for i in range(10):
            await lh.append(b"e%d" % i)
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        assert rh.last_add_confirmed == 8  # the piggybacked LAC lags by one
        assert not rh.is_closed
        for i in range(10, 15):
            assert await lh.append(b"e%d" % i) == i  # not fenced
        assert rh.last_add_confirmed == 8  # does not move by itself
        with pytest.raises(ValueError, match="no confirmed entry"):
            await rh.read(0, 9)
        assert [e.data for e in await rh.read_unconfirmed(9, 14)] == [
            b"e%d" % i for i in range(9, 15)
        ]
        assert await rh.read_last_add_confirmed() == 13
        assert (await cluster.client().ledger_metadata(lh.id)).state == OPEN
        await lh.close()


async def test_fencing_survives_bookie_restarts() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 2)
        await lh.append_many([b"a", b"b"])
        await cluster.client().open_ledger(lh.id, recovery=True)
        for b in cluster.bookie_ids:
            await cluster.stop_bookie(b)
            await cluster.start_bookie(b)
        with pytest.raises(LedgerFencedError):
            await lh.append(b"late")


async def test_many_parallel_recoveries_converge() -> None:
    async with mem_cluster(5) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        acked = await lh.append_many([b"x%d" % i for i in range(20)])
        pending = [lh.append(b"y%d" % i) for i in range(10)]  # in flight during recovery
        handles = await asyncio.gather(
            *(cluster.client().open_ledger(lh.id, recovery=True) for _ in range(6))
        )
        lasts = {h.metadata.last_entry_id for h in handles}
        assert len(lasts) == 1
        last = lasts.pop()
        assert last >= acked[-1]
        results = await asyncio.gather(*pending, return_exceptions=True)
        ok = [r for r in results if isinstance(r, int)]
        assert all(r <= last for r in ok)  # nothing acked beyond the close
        assert all(isinstance(r, int | LedgerFencedError) for r in results)
        md = await cluster.client().ledger_metadata(lh.id)
        assert (md.state, md.last_entry_id) == (CLOSED, last)
        data = [e.data for e in await handles[0].read(0, last)]
        assert data[:20] == [b"x%d" % i for i in range(20)]


async def test_recovery_with_bad_password_leaves_ledger_open() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2, password=b"good")
        await lh.append(b"a")
        with pytest.raises(UnauthorizedError):
            await cluster.client().open_ledger(lh.id, password=b"bad", recovery=True)
        assert (await cluster.client().ledger_metadata(lh.id)).state == OPEN
        assert await lh.append(b"b") == 1  # still writable, not fenced


async def test_recovery_of_closed_ledger_does_nothing() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger()
        await lh.append(b"a")
        await lh.close()
        t = cluster.local_transport()
        fence = t.hooks.hold(predicate=is_fencing)
        rh = await cluster.client(transport=t).open_ledger(lh.id, recovery=True)
        assert rh.last_add_confirmed == 0 and fence.matched == 0


# --------------------------------------------------------------------------- LedgerRecovery2Test


async def test_cant_recover_when_all_bookies_down() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        await seed(cluster, "b1", lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        for b in E3:
            t.hooks.unavailable(b)
        with pytest.raises(LedgerRecoveryError, match="stays IN_RECOVERY"):
            await cluster.client(transport=t).open_ledger(lh.id, recovery=True)
        assert (await cluster.store.read_ledger(lh.id)).state == IN_RECOVERY


async def test_can_read_lac_but_cant_write_back() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        for b in ("b1", "b2"):  # e0 reached Qa (b1, b2) before the writer died
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        t.hooks.fail(status=Status.IO_ERROR, predicate=is_recovery_add)
        with pytest.raises(NotEnoughBookiesError):
            await cluster.client(transport=t).open_ledger(lh.id, recovery=True)
        assert (await cluster.store.read_ledger(lh.id)).state == IN_RECOVERY


async def test_recovery_bookie_failed_at_start() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        await cluster.add_bookie("b4")
        await seed(cluster, "b1", lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        t.hooks.unavailable("b2")
        rh = await cluster.client(transport=t).open_ledger(lh.id, recovery=True)
        md = rh.metadata
        assert (md.state, md.last_entry_id, md.length) == (CLOSED, 0, 1)
        assert dict(md.ensembles) == {0: ("b1", "b4", "b3")}
        assert [e.data for e in await rh.read(0, 0)] == [b"a"]
        assert await held_entries(cluster, "b4", lh.id) == ((0, 0),)


async def test_recovery_one_bookie_fails_during() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        await cluster.add_bookie("b4")
        for b in ("b1", "b3"):  # a pipelined writer got e0 and e1 to b1 and b3 only
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
            await seed(cluster, b, lh.id, 1, -1, 2, b"b")
        t = cluster.local_transport()
        hold = t.hooks.hold("b2", entry_id=1, predicate=is_recovery_add)
        others = t.hooks.hold(entry_id=1, predicate=is_recovery_add)
        opening = asyncio.ensure_future(cluster.client(transport=t).open_ledger(lh.id))
        await hold.wait_held(1)
        await others.wait_held(2)
        # entry 0's write-back is acknowledged before entry 1's fails on b2
        await until(lambda: all(
            cluster.bookie(b).store.index.get(lh.id) is not None
            and 0 in cluster.bookie(b).store.index.get(lh.id).entries
            for b in E3
        ))
        for _ in range(50):
            await asyncio.sleep(0)
        hold.fail_held(Status.IO_ERROR)
        for _ in range(5):  # the failure reaches the pipeline: the change starts
            await asyncio.sleep(0)
        others.remove()
        rh = await opening
        md = rh.metadata
        assert md.last_entry_id == 1
        assert dict(md.ensembles) == {0: ("b1", "b2", "b3"), 1: ("b1", "b4", "b3")}
        assert [e.data for e in await rh.read(0, 1)] == [b"a", b"b"]


async def test_recovery_two_bookies_fail_on_same_entry() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        await cluster.add_bookie("b4")
        await cluster.add_bookie("b5")
        for b in ("b1", "b3"):
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        t.hooks.fail("b1", predicate=is_recovery_add, times=1)
        t.hooks.fail("b2", predicate=is_recovery_add, times=1)
        rh = await cluster.client(transport=t).open_ledger(lh.id)
        md = rh.metadata
        assert md.last_entry_id == 0
        assert list(md.ensembles) == [0]
        assert sorted(md.ensembles[0]) == ["b3", "b4", "b5"] and md.ensembles[0][2] == "b3"


async def test_metadata_closed_during_recovery_is_adopted() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        for b in ("b1", "b2"):  # e0 reached Qa (b1, b2) before the writer died
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        hold = t.hooks.hold(predicate=is_recovery_add)
        opening = asyncio.ensure_future(cluster.client(transport=t).open_ledger(lh.id))
        await hold.wait_held(3)
        md = await cluster.store.read_ledger(lh.id)
        await cluster.store.write_ledger(
            md.with_changes(state=CLOSED, last_entry_id=-1, length=0), md.version
        )
        hold.remove()
        rh = await opening
        assert (rh.metadata.last_entry_id, rh.metadata.length, rh.last_add_confirmed) == (-1, 0, -1)


async def test_new_ensemble_added_during_recovery_fails() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        await cluster.add_bookie("b4")
        for b in ("b1", "b2"):  # e0 reached Qa (b1, b2) before the writer died
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        hold = t.hooks.hold(predicate=is_recovery_add)
        opening = asyncio.ensure_future(cluster.client(transport=t).open_ledger(lh.id))
        await hold.wait_held(3)
        md = await cluster.store.read_ledger(lh.id)
        ens = dict(md.ensembles)
        ens[1] = ("b1", "b2", "b4")
        await cluster.store.write_ledger(md.with_changes(ensembles=ens), md.version)
        hold.remove()
        with pytest.raises(UnexpectedConditionError, match="ensemble was added"):
            await opening
        assert (await cluster.store.read_ledger(lh.id)).state == IN_RECOVERY


def _is_lac_fence(bookie: str, req: Request) -> bool:
    return isinstance(req, ReadRequest) and req.fence and req.entry_id == LAST_ENTRY


@pytest.mark.parametrize("broken", [False, True], ids=["fencing-reads", "mutation"])
async def test_first_writer_cannot_commit_after_second_closes(broken: bool) -> None:
    """The TLA+-found interleaving (BookKeeper #2614): the fence to b2 is lost; recovery
    hears NoSuchEntry for e2 from b1 and b2 and closes at 1. Because the recovery read of
    e2 also fences b2, w1's delayed add of e2 to b2 is refused and w1 never acks e2.
    With the RECOVERY_READS_DONT_FENCE mutation, w1 does ack e2: data loss."""
    slow = ClientConfig(add_timeout=60, read_timeout=60, speculative_read_delay=0)
    async with mem_cluster(E3) as cluster:
        t1 = cluster.local_transport()
        lh = await cluster.client(transport=t1, config=slow).create_ledger(3, 3, 2)
        b1, b2, b3 = lh.metadata.ensembles[0]
        await lh.append(b"e0")
        await lh.append(b"e1")
        h1 = t1.hooks.hold(b1, op=Op.ADD, entry_id=2)
        h2 = t1.hooks.hold(b2, op=Op.ADD, entry_id=2)
        f2 = lh.append(b"e2")
        await h1.wait_held(1)
        await h2.wait_held(1)
        await until(lambda: lh._pipeline.core.acked_by(2) == frozenset({2}))  # b3 has e2

        t2 = cluster.local_transport()
        t2.hooks.hold(b2, predicate=_is_lac_fence)  # the fence to b2 is lost
        t2.hooks.hold(b3, op=Op.READ, entry_id=2)  # b3's answer about e2 comes too late
        recovering = dataclasses.replace(
            slow, mutations=Mutations(RECOVERY_READS_DONT_FENCE) if broken else Mutations())
        rh = await cluster.client(transport=t2, config=recovering).open_ledger(lh.id)
        assert rh.metadata.last_entry_id == 1

        h2.release()
        if broken:
            assert await f2 == 2  # acked although the ledger closed at 1: the bug
            assert lh.last_add_confirmed == 2 > rh.metadata.last_entry_id
        else:
            with pytest.raises(LedgerFencedError):
                await f2
            assert lh.last_add_confirmed == 1 == rh.metadata.last_entry_id
        h1.remove()
        t1.hooks.clear(release=False)
        t2.hooks.clear(release=False)


async def test_recovery_when_last_ensemble_reports_lac_minus_one() -> None:
    async with mem_cluster(["b1", "b2", "b3", "b4"]) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        md = await cluster.store.read_ledger(lh.id)
        await cluster.store.write_ledger(
            md.with_changes(ensembles={0: ("b1", "b2", "b3"), 1: ("b1", "b2", "b4")}), md.version
        )
        for b in ("b1", "b2", "b3"):
            await seed(cluster, b, lh.id, 0, -1, 2, b"e0")
        for b in ("b1", "b2", "b4"):
            await seed(cluster, b, lh.id, 1, -1, 4, b"e1")
        rh = await cluster.client().open_ledger(lh.id)
        md = rh.metadata
        assert (md.last_entry_id, md.length, len(md.ensembles)) == (1, 4, 2)
        assert [e.data for e in await rh.read(0, 1)] == [b"e0", b"e1"]


# --------------------------------------------------------------------------- Parallel / failures


async def test_recovery_stops_at_entry_gap() -> None:
    async with mem_cluster(["b1"]) as cluster:
        lh = await cluster.client(config=_LAGGING).create_ledger(1, 1, 1)
        for i in range(10):
            await lh.append(b"e%d" % i)
        await seed(cluster, "b1", lh.id, 14, 8, 99, b"stray")
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        assert rh.last_add_confirmed == 8
        rh = await cluster.client().open_ledger(lh.id, recovery=True)
        assert rh.metadata.last_entry_id == 9
        assert rh.metadata.length == sum(len(b"e%d" % i) for i in range(10))


async def test_recovery_unknown_entry_fails_instead_of_closing_short() -> None:
    """Entry 1 is on one bookie only and the others answer with errors: recovery must not
    decide it is absent (R2/#2908)."""
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        for b in E3:
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        t.hooks.fail("b1", op=Op.READ, entry_id=1, status=Status.IO_ERROR)
        t.hooks.fail("b2", op=Op.READ, entry_id=1, status=Status.IO_ERROR)
        with pytest.raises(LedgerRecoveryError, match="cannot tell whether entry 1 exists"):
            await cluster.client(transport=t).open_ledger(lh.id)
        assert (await cluster.store.read_ledger(lh.id)).state == IN_RECOVERY
        # once the bookies answer again, a retry recovers and closes
        rh = await cluster.client().open_ledger(lh.id)
        assert rh.metadata.last_entry_id == 0


@pytest.mark.parametrize("batch", [1, 3, 13])
async def test_recovery_with_slow_bookie_and_batches(batch: int) -> None:
    """One bookie never answers recovery reads; pipelined entries (all carrying LAC -1) are
    all recovered, whatever the read batch size."""
    config = ClientConfig(add_timeout=5, read_timeout=5, speculative_read_delay=0.01,
                          recovery_read_batch_size=batch)
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 2)
        ids = await lh.append_many([b"e%d" % i for i in range(15)])
        slow = lh.metadata.ensembles[0][0]
        t = cluster.local_transport()
        t.hooks.hold(slow, op=Op.READ)
        rh = await cluster.client(transport=t, config=config).open_ledger(lh.id)
        assert rh.metadata.last_entry_id == ids[-1] == 14
        # normal reads skip the slow replica after the speculative delay
        assert [e.data for e in await rh.read(0, 14)] == [b"e%d" % i for i in range(15)]
        t.hooks.clear(release=False)


async def test_no_recovery_open_after_bookie_crash() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client(config=_LAGGING).create_ledger(3, 3, 2)
        for i in range(10):
            await lh.append(b"e%d" % i)
        await cluster.stop_bookie(lh.metadata.ensembles[0][1])
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        assert rh.last_add_confirmed == 8


async def test_recovery_open_after_bookie_crash_with_spare() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 2)
        for i in range(10):
            await lh.append(b"e%d" % i)
        await cluster.stop_bookie(lh.metadata.ensembles[0][1])
        await cluster.add_bookie()
        rh = await cluster.client().open_ledger(lh.id, recovery=True)
        assert rh.last_add_confirmed == lh.last_add_pushed == 9
        assert [e.data for e in await rh.read(0, 9)] == [b"e%d" % i for i in range(10)]



async def test_recovery_writes_around_a_dead_bookie_without_spare() -> None:
    """No spare bookie: write-backs reach Qa on the live bookies and recovery completes
    (BookKeeper's delayed ensemble change), instead of failing the whole recovery."""
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 2, E3)
        for b in ("b1", "b3"):
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
            await seed(cluster, b, lh.id, 1, -1, 2, b"b")
        await cluster.stop_bookie("b2")
        rh = await cluster.client().open_ledger(lh.id)
        md = rh.metadata
        assert (md.state, md.last_entry_id, dict(md.ensembles)) == (CLOSED, 1, {0: tuple(E3)})
        assert [e.data for e in await rh.read(0, 1)] == [b"a", b"b"]


async def test_recovery_without_spare_fails_when_ack_quorum_is_lost() -> None:
    async with mem_cluster(E3) as cluster:
        lh = await ledger_on(cluster, 3, 3, 3, E3)
        for b in E3:
            await seed(cluster, b, lh.id, 0, -1, 1, b"a")
        t = cluster.local_transport()
        t.hooks.unavailable("b2", predicate=is_recovery_add)
        for b in ("b1", "b3"):  # e1 is on b1 and b3 only
            await seed(cluster, b, lh.id, 1, -1, 2, b"b")
        with pytest.raises(NotEnoughBookiesError, match="cannot reach 3"):
            await cluster.client(transport=t).open_ledger(lh.id)
        assert (await cluster.store.read_ledger(lh.id)).state == IN_RECOVERY
