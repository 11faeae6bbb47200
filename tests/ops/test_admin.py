"""client.admin(): bookies, marks, recover / decommission, the auto-recovery switches."""

from __future__ import annotations

import random

import pytest

from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.errors import BookieStateError, CorruptRecordError, IOBookieError
from pybk.ops import BookieInfo
from pybk.ops.replicator import repair_ledger
from pybk.ops.settings import DELAY_KEY
from pybk.storage.memfs import MemFileSystem
from pybk.testing.replicas import replication_problems

CLIENT = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0)


def cluster(n: int = 4, **kw: object) -> LocalCluster:
    return LocalCluster("/c", n, metadata="memory://", fs=MemFileSystem(),
                        rng=random.Random(5), client_config=CLIENT, **kw)  # type: ignore[arg-type]


async def test_list_bookies_shows_state_address_and_rack() -> None:
    async with cluster(3, racks={"bookie-0": "/eu/r1"}) as c:
        admin = c.client().admin()
        assert await admin.list_bookies() == [
            BookieInfo("bookie-0", "", "writable", "/eu/r1"),
            BookieInfo("bookie-1", "", "writable", ""),
            BookieInfo("bookie-2", "", "writable", ""),
        ]
        await c.stop_bookie("bookie-1")
        assert [b.id for b in await admin.list_bookies()] == ["bookie-0", "bookie-2"]
        info = await admin.bookie_info("bookie-0")
        assert info["state"] == "writable" and info["total_bytes"] >= info["free_bytes"] > 0


async def test_decommission_refuses_a_running_bookie_and_retires_a_stopped_one() -> None:
    async with cluster(4) as c:  # no auto-recovery running: the admin does the work itself
        client = c.client()
        admin = client.admin()
        ledgers = []
        for n in range(5):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            await lh.append_many([b"%d-%d" % (n, i) for i in range(20)])
            if n < 4:
                await lh.close()
            ledgers.append(lh)
        victim = ledgers[4].metadata.ensembles[0][0]  # named by the open ledger too
        with pytest.raises(BookieStateError, match="still running"):
            await admin.decommission_bookie(victim)
        assert await admin.ledgers_of(victim)
        await c.stop_bookie(victim)
        report = await admin.decommission_bookie(victim, timeout=30, poll_interval=0.05,
                                                 delete_cookie=True)
        assert await admin.ledgers_of(victim) == []
        assert await admin.under_replicated() == []
        assert set(report.repaired) == set(report.ledgers) and report.entries_copied > 0
        assert await c.store.read_cookie(victim) is None
        assert await replication_problems(c.store, c.transport) == []
        # the open ledger was fenced and closed at what its writer had acknowledged
        md = await c.store.read_ledger(ledgers[4].id)
        assert md.is_closed and md.last_entry_id == 19


async def test_recover_bookie_moves_every_fragment_even_of_a_live_bookie() -> None:
    async with cluster(4) as c:
        client = c.client()
        admin = client.admin()
        for _ in range(3):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await lh.append_many([b"x"] * 5)
            await lh.close()
        victim = "bookie-0"
        before = await admin.ledgers_of(victim)
        report = await admin.recover_bookie(victim)
        assert report.ledgers == before and set(report.repaired) == set(before)
        assert await admin.ledgers_of(victim) == []
        assert await replication_problems(c.store, c.transport) == []


async def test_marks_status_and_switches() -> None:
    async with cluster(3) as c:
        admin = c.client().admin()
        await c.store.mark_under_replicated(7, ["bookie-9"])
        await c.store.mark_under_replicated(3, ["bookie-8"])
        assert await admin.under_replicated() == [3, 7]
        assert await admin.under_replicated_details() == {3: ["bookie-8"], 7: ["bookie-9"]}
        status = await admin.autorecovery_status()
        assert status == {"enabled": True, "auditor": None, "lost_bookie_recovery_delay": None,
                          "under_replicated": 2, "repairing": {}}
        await admin.disable_autorecovery()
        await admin.disable_autorecovery()  # idempotent
        await admin.set_lost_bookie_recovery_delay(12.5)
        status = await admin.autorecovery_status()
        assert status["enabled"] is False and status["lost_bookie_recovery_delay"] == 12.5
        await admin.enable_autorecovery()
        await admin.set_lost_bookie_recovery_delay(None)
        assert (await admin.autorecovery_status())["lost_bookie_recovery_delay"] is None
        assert await admin.trigger_audit() == 1
        assert await admin.trigger_audit() == 2


async def test_bad_settings_are_refused_and_damaged_ones_reported() -> None:
    async with cluster(1) as c:
        admin = c.client().admin()
        for bad in (-1, float("nan"), float("inf"), "3", True):
            with pytest.raises(ValueError):
                await admin.set_lost_bookie_recovery_delay(bad)  # type: ignore[arg-type]
        await c.store.create_value(DELAY_KEY, b"soon")
        with pytest.raises(CorruptRecordError, match="not a number"):
            await admin.autorecovery_status()


async def test_a_copy_reaches_its_target_in_batched_recovery_adds(monkeypatch) -> None:
    """Re-replication writes a window of entries to the new bookie as one batched recovery
    add (one request, one journal append), not one add per entry; an entry the target
    refuses fails the copy, and the slot is not swapped."""
    from pybk.bookie import Bookie

    async with cluster(4) as c:
        client = c.client()
        admin = client.admin()
        admin.copy_window = 16
        lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await lh.append_many([b"e%d" % i for i in range(40)])
        await lh.close()
        victim = lh.metadata.ensembles[0][0]
        target = next(b for b in ("bookie-0", "bookie-1", "bookie-2", "bookie-3")
                      if b not in lh.metadata.ensembles[0])
        seen: list[tuple[str, str, int, bool]] = []
        refuse: set[int] = {21}
        add_request = Bookie.add_request

        def spy(self: Bookie, request: object, on_done: object) -> None:
            ids = getattr(request, "entry_ids", None) or [request.entry_id]  # type: ignore[attr-defined]
            seen.append((self.bookie_id, type(request).__name__, len(ids),
                         request.recovery))  # type: ignore[attr-defined]
            if refuse & set(ids):  # the target answers one entry with an error
                on_done([IOBookieError("injected") if i in refuse else None  # type: ignore[operator]
                         for i in ids])
                return
            add_request(self, request, on_done)  # type: ignore[arg-type]

        monkeypatch.setattr(Bookie, "add_request", spy)
        await c.stop_bookie(victim)
        live = [b.bookie_id for b in await c.store.list_bookies()]
        with pytest.raises(IOBookieError, match=f"copying entry 21 of ledger {lh.id} to "):
            await repair_ledger(admin._ctx, lh.id, [victim], live=live, grace_over=True,
                                window=16)
        assert victim in (await c.store.read_ledger(lh.id)).ensembles[0]  # not swapped
        refuse.clear()
        seen.clear()
        report = await admin.decommission_bookie(victim, timeout=30, poll_interval=0.05)
        assert report.entries_copied == 40
        assert seen == [(target, "AddBatchRequest", n, True) for n in (16, 16, 8)]
        assert (await c.store.read_ledger(lh.id)).ensembles[0][
            lh.metadata.ensembles[0].index(victim)] == target
        assert await replication_problems(c.store, c.transport) == []


async def test_collect_garbage_runs_every_bookies_collector_and_gc_status_shows_it() -> None:
    from pybk.bookie import BookieConfig

    config = BookieConfig(segment_size=4096, disk_check_interval=0, gc_interval=0,
                          gc_min_ledger_age=0)
    async with cluster(3, bookie_config=config) as c:
        client = c.client()
        admin = client.admin()
        ids = []
        for n in range(4):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await lh.append_many([b"%d-%d" % (n, i) * 20 for i in range(30)])
            await lh.close()
            ids.append(lh.id)
        for lid in ids[:3]:
            await client.delete_ledger(lid)
        status = await admin.gc_status()
        assert set(status) == {"bookie-0", "bookie-1", "bookie-2"}
        done = await admin.collect_garbage(timeout=10)
        assert set(done) == set(status)
        for b, result in done.items():
            assert sorted(result["ledgers_removed"]) == sorted(ids[:3]), (b, result)
            assert result["compaction"] == "major" and result["bytes_reclaimed"] > 0
        again = await admin.collect_garbage("bookie-1", timeout=10)
        assert list(again) == ["bookie-1"] and again["bookie-1"]["ledgers_removed"] == []
        status = await admin.gc_status()
        for b in status:
            assert status[b]["ledgers_removed"] == 3 and status[b]["runs"] >= 1
            assert not status[b]["running"]
        lh = await client.open_ledger(ids[3])
        assert len(await lh.read(0, 29)) == 30
        await c.stop_bookie("bookie-2")
        late = await admin.collect_garbage("bookie-2", timeout=0.2)
        assert "did not run" in late["bookie-2"]["error"]
