"""Auto-recovery on embedded clusters (real bookies on MemFileSystem, memory metadata)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.errors import LedgerFencedError, UnauthorizedError
from pybk.ops import AutoRecoveryConfig
from pybk.ops.replicator import ENSEMBLE_BEFORE_COPY_DURABLE
from pybk.storage.memfs import MemFileSystem
from pybk.testing import HookedTransport
from pybk.testing.metadata_helpers import wait_until
from pybk.testing.replicas import replication_problems
from pybk.wire import Op, Status

BOUND = 20.0
FAST = AutoRecoveryConfig(open_ledger_grace=0.5, worker_poll_interval=0.2, retry_backoff=0.2,
                          max_retry_backoff=1.0, bookie_check_interval=5.0,
                          ledger_check_interval=0.0)
CLIENT = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0)


@asynccontextmanager
async def cluster_with_recovery(bookies: int | Sequence[str] = 5, *, seed: int = 1,
                                config: AutoRecoveryConfig = FAST,
                                **kwargs: Any) -> AsyncIterator[LocalCluster]:
    kwargs.setdefault("client_config", CLIENT)
    cluster = LocalCluster("/c", bookies, metadata="memory://", fs=MemFileSystem(),
                           rng=random.Random(seed), transport_wrapper=HookedTransport,
                           autorecovery=True, autorecovery_config=config, **kwargs)
    async with cluster:
        yield cluster


async def write_ledgers(client: Any, count: int, entries: int, *, e: int = 3, w: int = 2,
                        a: int = 2, close: bool = True, **kw: Any) -> list[Any]:
    handles = []
    for n in range(count):
        lh = await client.create_ledger(ensemble_size=e, write_quorum=w, ack_quorum=a, **kw)
        await lh.append_many([b"ledger %d entry %d" % (n, i) for i in range(entries)])
        if close:
            await lh.close()
        handles.append(lh)
    return handles


def names(md: Any, bookie: str) -> bool:
    return any(bookie in ensemble for ensemble in md.ensembles.values())


async def wait_repaired(cluster: LocalCluster, lost: str, ledgers: Sequence[int]) -> None:
    store = cluster.store

    async def done() -> bool:
        if await store.list_under_replicated():
            return False
        for lid in ledgers:
            if names(await store.read_ledger(lid), lost):
                return False
        return True

    await wait_until(done, BOUND, f"every ledger to stop naming {lost}")


async def test_a_lost_bookie_s_ledgers_are_copied_elsewhere_and_ensembles_updated() -> None:
    async with cluster_with_recovery(5) as cluster:
        client = cluster.client()
        handles = await write_ledgers(client, 6, 25)
        handles += await write_ledgers(client, 2, 10, e=3, w=3, a=2, digest_type="MAC",
                                       password=b"secret")
        lost = next(b for b in cluster.bookie_ids
                    if sum(names(h.metadata, b) for h in handles) >= 3)
        ids = [h.id for h in handles]
        await cluster.stop_bookie(lost)  # gone for good: it never comes back
        await wait_repaired(cluster, lost, ids)
        assert await replication_problems(cluster.store, cluster.transport) == []
        for h in handles:  # and a reader sees every entry
            rh = await client.open_ledger(h.id, password=b"secret" if h.metadata.digest_type
                                          == "MAC" else b"")
            entries = await rh.read(0, rh.last_add_confirmed)
            assert len(entries) == h.last_add_confirmed + 1
        stats = [r.stats for r in cluster.recoveries.values()]
        assert sum(s.entries_copied for s in stats) > 0
        assert sum(s.leading for s in stats) == 1


async def test_the_auditor_fails_over_when_its_bookie_dies() -> None:
    async with cluster_with_recovery(5) as cluster:
        client = cluster.client()
        handles = await write_ledgers(client, 4, 10)
        auditor = next(b for b, r in cluster.recoveries.items() if r.is_auditor)
        await cluster.stop_bookie(auditor)

        async def new_auditor() -> bool:
            return sum(r.is_auditor for r in cluster.recoveries.values()) == 1

        await wait_until(new_auditor, BOUND, "a new auditor")
        await wait_repaired(cluster, auditor, [h.id for h in handles])
        assert await replication_problems(cluster.store, cluster.transport) == []


async def test_an_idle_open_ledger_is_fenced_after_the_grace_period_then_copied() -> None:
    async with cluster_with_recovery(4) as cluster:
        client = cluster.client()
        (lh,) = await write_ledgers(client, 1, 12, close=False)
        lost = lh.metadata.last_ensemble[0]
        await cluster.stop_bookie(lost)
        await wait_repaired(cluster, lost, [lh.id])
        md = await cluster.store.read_ledger(lh.id)
        assert md.is_closed and md.last_entry_id == 11
        with pytest.raises(LedgerFencedError):
            await lh.append(b"too late")
        assert await replication_problems(cluster.store, cluster.transport) == []


async def test_a_busy_writer_replaces_the_bookie_itself_and_is_never_fenced() -> None:
    config = AutoRecoveryConfig(open_ledger_grace=60.0, worker_poll_interval=0.2,
                                retry_backoff=0.2, ledger_check_interval=0.0)
    async with cluster_with_recovery(5, config=config) as cluster:
        client = cluster.client()
        (lh,) = await write_ledgers(client, 1, 10, close=False)
        lost = lh.metadata.last_ensemble[1]
        await cluster.stop_bookie(lost)
        # the writer keeps writing: its ensemble change moves the open fragment away
        await lh.append_many([b"more %d" % i for i in range(10)])
        await wait_repaired(cluster, lost, [lh.id])  # the closed fragment: copied
        md = await cluster.store.read_ledger(lh.id)
        assert not md.is_closed and len(md.ensembles) == 2
        await lh.append(b"still the writer")
        await lh.close()
        assert await replication_problems(cluster.store, cluster.transport) == []


async def test_a_rolling_restart_within_the_delay_copies_nothing() -> None:
    config = AutoRecoveryConfig(lost_bookie_recovery_delay=30.0, worker_poll_interval=0.2,
                                ledger_check_interval=0.0)
    async with cluster_with_recovery(4, config=config) as cluster:
        client = cluster.client()
        handles = await write_ledgers(client, 3, 10)
        for b in cluster.bookie_ids:
            await cluster.stop_bookie(b)
            await cluster.start_bookie(b)
        auditor = next(r for r in cluster.recoveries.values() if r.is_auditor)
        await auditor.auditor.check_bookies()  # a check now: everyone is back
        assert await cluster.store.list_under_replicated() == {}
        assert sum(r.stats.entries_copied for r in cluster.recoveries.values()) == 0
        assert [h.metadata.ensembles for h in handles] == [
            (await cluster.store.read_ledger(h.id)).ensembles for h in handles]


async def test_the_delay_holds_marks_back_until_it_passes_or_an_audit_is_triggered() -> None:
    config = AutoRecoveryConfig(lost_bookie_recovery_delay=3600.0, worker_poll_interval=0.2,
                                retry_backoff=0.2, ledger_check_interval=0.0)
    async with cluster_with_recovery(4, config=config) as cluster:
        client = cluster.client()
        handles = await write_ledgers(client, 3, 10)
        lost = handles[0].metadata.ensembles[0][0]
        await cluster.stop_bookie(lost)
        auditor = next(r for r in cluster.recoveries.values() if r.is_auditor)

        async def seen_lost() -> bool:
            return lost in auditor.auditor.lost_since

        await wait_until(seen_lost, BOUND, "the auditor to notice the missing bookie")
        assert await cluster.store.list_under_replicated() == {}
        await client.admin().trigger_audit()  # an operator does not want to wait
        await wait_repaired(cluster, lost, [h.id for h in handles])


async def test_nothing_is_copied_while_auto_recovery_is_disabled() -> None:
    async with cluster_with_recovery(4) as cluster:
        client = cluster.client()
        admin = client.admin()
        handles = await write_ledgers(client, 3, 10)
        await admin.disable_autorecovery()
        lost = handles[0].metadata.ensembles[0][0]
        await cluster.stop_bookie(lost)

        async def marked() -> bool:
            return bool(await admin.under_replicated())

        await wait_until(marked, BOUND, "the auditor to mark the lost bookie's ledgers")
        for r in cluster.recoveries.values():
            await r.worker.pass_once()  # a pass now: it must not copy
        assert sum(r.stats.entries_copied for r in cluster.recoveries.values()) == 0
        assert (await admin.autorecovery_status())["enabled"] is False
        await admin.enable_autorecovery()
        await wait_repaired(cluster, lost, [h.id for h in handles])


async def test_a_ledger_deleted_while_marked_is_simply_done() -> None:
    async with cluster_with_recovery(4) as cluster:
        client = cluster.client()
        admin = client.admin()
        await admin.disable_autorecovery()
        handles = await write_ledgers(client, 2, 5)
        lost = handles[0].metadata.ensembles[0][0]
        await cluster.stop_bookie(lost)

        async def marked() -> bool:
            return handles[0].id in await admin.under_replicated()

        await wait_until(marked, BOUND, "the mark")
        await client.delete_ledger(handles[0].id)
        await admin.enable_autorecovery()
        await wait_repaired(cluster, lost, [h.id for h in handles[1:]])


async def test_a_copy_that_cannot_land_leaves_the_ensemble_alone_and_is_retried() -> None:
    async with cluster_with_recovery(4) as cluster:
        client = cluster.client()
        (lh,) = await write_ledgers(client, 1, 20)
        lost = lh.metadata.ensembles[0][0]
        spare = next(b for b in cluster.bookie_ids if b not in lh.metadata.ensembles[0])
        # the only possible target refuses recovery adds for a while
        rule = cluster.transport.hooks.fail(spare, op=Op.ADD, status=Status.IO_ERROR, times=3)
        await cluster.stop_bookie(lost)
        await rule.wait_matched(1)
        assert (await cluster.store.read_ledger(lh.id)).ensembles[0] == lh.metadata.ensembles[0]
        await wait_repaired(cluster, lost, [lh.id])
        assert (await cluster.store.read_ledger(lh.id)).ensembles[0][0] == spare
        assert await replication_problems(cluster.store, cluster.transport) == []
        assert sum(r.stats.repairs_failed for r in cluster.recoveries.values()) >= 1


async def test_the_broken_build_swaps_the_ensemble_before_its_copy_is_durable() -> None:
    """The mutation switch the simulator must catch, shown directly: with the copy failing,
    the broken build records the new bookie anyway and the entries are on too few."""
    client_config = ClientConfig(add_timeout=2.0, read_timeout=2.0,
                                 speculative_read_delay=0.0,
                                 mutations=frozenset({ENSEMBLE_BEFORE_COPY_DURABLE}))
    async with cluster_with_recovery(4, client_config=client_config) as cluster:
        client = cluster.client()
        (lh,) = await write_ledgers(client, 1, 20)
        lost = lh.metadata.ensembles[0][0]
        spare = next(b for b in cluster.bookie_ids if b not in lh.metadata.ensembles[0])
        cluster.transport.hooks.fail(spare, op=Op.ADD, status=Status.IO_ERROR)
        await cluster.stop_bookie(lost)
        await wait_repaired(cluster, lost, [lh.id])
        problems = await replication_problems(cluster.store, cluster.transport)
        assert problems and all(spare in p for p in problems), problems


async def test_ledgers_without_recovery_keys_need_their_password() -> None:
    no_keys = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0,
                           recovery_keys_in_metadata=False)
    async with cluster_with_recovery(4, client_config=no_keys) as cluster:
        client = cluster.client()
        (lh,) = await write_ledgers(client, 1, 5, password=b"pw")
        assert lh.metadata.master_key == b""
        lost = lh.metadata.ensembles[0][0]
        await cluster.stop_bookie(lost)

        async def failed() -> bool:
            return any("password" in r.stats.last_error for r in cluster.recoveries.values())

        await wait_until(failed, BOUND, "the worker to report the missing password")
        # an operator recovers it with the password
        report = await client.admin(passwords=[b"pw"]).recover_bookie(lost)
        assert report.repaired == [lh.id] and report.entries_copied > 0
        await wait_repaired(cluster, lost, [lh.id])
        # without it, an operator's recovery names the ledger and the cause
        other = next(b for b in (await cluster.store.read_ledger(lh.id)).ensembles[0])
        await client.admin().disable_autorecovery()
        await cluster.stop_bookie(other)
        with pytest.raises(UnauthorizedError, match=f"ledger {lh.id}"):
            await client.admin().recover_bookie(other)


SCRUB = AutoRecoveryConfig(open_ledger_grace=0.5, worker_poll_interval=0.2, retry_backoff=0.2,
                           max_retry_backoff=1.0, ledger_check_interval=0.0,
                           ledger_check="scrub")


async def test_an_audit_finds_an_entry_a_live_bookie_never_got_and_copies_it_back() -> None:
    async with cluster_with_recovery(3, config=SCRUB) as cluster:
        client = cluster.client()
        lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        victim = lh.metadata.ensembles[0][2]
        # entry 5 never reaches the victim: acknowledged by the two others, the ledger closed
        rule = cluster.transport.hooks.hold(victim, op=Op.ADD, ledger_id=lh.id, entry_id=5)
        await lh.append_many([b"e%d" % i for i in range(10)])
        await lh.close()
        rule.drop_held()
        rule.remove()
        problems = await replication_problems(cluster.store, cluster.transport)
        assert len(problems) == 1 and "entry 5 on " + victim in problems[0], problems
        await client.admin().trigger_audit()
        await wait_until(lambda: _clean(cluster), BOUND, "the missing copy to be restored")
        md = await cluster.store.read_ledger(lh.id)
        assert md.ensembles == lh.metadata.ensembles  # repaired in place, nothing moved
        assert sum(r.stats.entries_copied for r in cluster.recoveries.values()) == 1


async def test_an_audit_finds_a_damaged_entry_and_moves_that_replica_away() -> None:
    async with cluster_with_recovery(4, config=SCRUB) as cluster:
        client = cluster.client()
        (lh,) = await write_ledgers(client, 1, 10, e=3, w=3, a=2)
        victim = lh.metadata.ensembles[0][1]
        bookie = cluster.bookie(victim)
        loc = bookie.store.index.ledgers[lh.id].location(4)
        bookie.fs.flip_bit(bookie.store.journal_path(loc.seg), loc.offset + loc.size - 1)
        await client.admin().trigger_audit()
        await wait_until(lambda: _clean(cluster), BOUND, "the damaged replica to be replaced")
        md = await cluster.store.read_ledger(lh.id)
        assert victim not in md.ensembles[0]


async def test_a_replica_that_deleted_the_ledger_is_replaced() -> None:
    async with cluster_with_recovery(4, config=SCRUB) as cluster:
        client = cluster.client()
        (lh,) = await write_ledgers(client, 1, 6, e=3, w=3, a=2)
        victim = lh.metadata.ensembles[0][0]
        await cluster.bookie(victim).delete_ledger(lh.id)
        await client.admin().trigger_audit()
        await wait_until(lambda: _clean(cluster), BOUND, "the replica to be replaced")
        assert victim not in (await cluster.store.read_ledger(lh.id)).ensembles[0]


async def _clean(cluster: LocalCluster) -> bool:
    if await cluster.store.list_under_replicated():
        return False
    return await replication_problems(cluster.store, cluster.transport) == []


async def test_re_replication_keeps_a_rack_aware_ensemble_spread() -> None:
    from pybk.client.placement import RackAwarePlacementPolicy

    racks = {f"bookie-{i}": f"/dc/rack-{i % 3}" for i in range(6)}
    config = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0,
                          placement=RackAwarePlacementPolicy(min_racks_per_write_quorum=3))
    async with cluster_with_recovery(6, racks=racks, client_config=config) as cluster:
        client = cluster.client()
        handles = await write_ledgers(client, 4, 8, e=3, w=3, a=2)
        lost = handles[0].metadata.ensembles[0][0]
        await cluster.stop_bookie(lost)
        await wait_repaired(cluster, lost, [h.id for h in handles])
        for h in handles:
            md = await cluster.store.read_ledger(h.id)
            assert {racks[b] for b in md.ensembles[0]} == set(racks.values()), md.ensembles


def test_a_replica_holds_its_entries_only_when_every_one_lies_in_a_listed_range() -> None:
    """The auditor's "entries" check (a bookie's ListEntries ranges against the ids its slot
    should hold): ranges in any order, overlapping or touching, each id judged."""
    from pybk.ops.auditor import holds_all

    strided = list(range(0, 30, 3))  # a slot of a striped ensemble: every third id
    assert holds_all([(0, 29)], strided)
    assert holds_all([(15, 29), (0, 14)], strided)  # any order
    assert holds_all([(0, 10), (5, 20), (21, 27)], strided)  # overlapping, touching
    assert not holds_all([(0, 10), (13, 29)], strided)  # 12 missing
    assert not holds_all([(0, 26)], strided)  # the last one (27) missing
    assert not holds_all([(1, 29)], strided)  # the first one (0) missing
    assert not holds_all([], strided)
    assert holds_all([], [])
    # overlapping ranges must not count an id twice to make up for a missing one
    assert not holds_all([(0, 5), (0, 5), (9, 29)], list(range(0, 30, 3)))
    assert not holds_all([(0, 3), (0, 3)], [0, 3, 6])


async def _turns_until_auditor(instance: Any, turns: int = 50) -> bool:
    for _ in range(turns):
        if instance.is_auditor:
            return True
        await asyncio.sleep(0)
    return instance.is_auditor


@pytest.mark.parametrize("resign", [True, False])
async def test_an_instance_killed_without_resigning_keeps_the_role_until_its_session_ends(
    resign: bool,
) -> None:
    """``stop(resign=False)`` is a killed process (the simulator's lost host): the other
    candidate takes over only once the dead one's session is gone, not at once."""
    from pybk.metadata.memory import MemoryMetadataStore
    from pybk.ops import AutoRecovery
    from pybk.transport.local import LocalTransport

    store = MemoryMetadataStore()
    first = AutoRecovery(store.session(), LocalTransport({}), name="a", config=FAST)
    second = AutoRecovery(store.session(), LocalTransport({}), name="b", config=FAST)
    await first.start()
    assert await _turns_until_auditor(first)
    await second.start()
    try:
        await first.stop(resign=resign)
        assert await _turns_until_auditor(second) == resign
        await first.ctx.store.close()  # (its session lapses)

        async def took_over() -> bool:
            return second.is_auditor

        await wait_until(took_over, 5.0, "the other candidate to become the auditor")
    finally:
        await second.stop()
