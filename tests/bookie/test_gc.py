"""The bookie's own garbage collector (pybk.bookie.gc): scheduled runs on loop time collect
the ledgers the metadata no longer has and compact, never on a transient, stale or damaged
answer nor a ledger seen moments ago; disk pressure runs it at once and a bookie read-only
for its disk compacts back to writable; compaction is paced."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from pybk.bookie import READ_ONLY, WRITABLE, Bookie, BookieConfig
from pybk.errors import BookieStateError, CorruptRecordError, MetadataStoreError
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.storage import MemFileSystem
from pybk.wire import AddRequest, ReadRequest, Status

from .conftest import KEY, frame

# (the collector's tests write ledgers the metadata never had, as a bookie that does not
# check adds of unknown ledgers takes them: pybk.bookie.unknown would refuse those adds)
FAST = BookieConfig(segment_size=2048, disk_check_interval=0, checkpoint_interval=0,
                    gc_interval=0.02, gc_min_ledger_age=0.0, gc_minor_interval=1e-3,
                    gc_major_interval=1e-3, gc_compaction_rate=0, check_unknown_ledgers=False)


async def until(cond: Callable[[], Any], what: str, bound: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"not within {bound}s: {what}")
        await asyncio.sleep(0.005)


class Faults:
    """before_op hook: raise on chosen operations (a transient metadata failure)."""

    def __init__(self) -> None:
        self.fail: set[str] = set()
        self.exc: Exception = MetadataStoreError("metadata unreachable")
        self.calls: list[tuple[str, Any]] = []

    async def __call__(self, op: str, key: Any) -> None:
        self.calls.append((op, key))
        if op in self.fail:
            raise self.exc


async def make(config: BookieConfig = FAST, *, capacity: int = 1 << 40,
               live: tuple[int, ...] = (1, 2)) -> tuple[Bookie, MemoryMetadataStore, Faults]:
    faults = Faults()
    meta = MemoryMetadataStore(before_op=faults)
    for lid in live:
        await meta.create_ledger(LedgerMetadata(lid, 1, 1, 1, {0: ("b1",)}))
    bookie = Bookie("b1", "/d", fs=MemFileSystem(capacity=capacity), config=config,
                    cookie_store=meta, rng=random.Random(3))
    await bookie.start()
    return bookie, meta, faults


async def fill(bookie: Bookie, ledgers: tuple[int, ...], n: int, size: int = 60,
               first: int = 0) -> None:
    for e in range(first, first + n):
        lid = ledgers[e % len(ledgers)]
        r = await bookie.handle(AddRequest(lid, e, KEY, frame(lid, e, b"x" * size)))
        assert r.status == Status.OK, r


async def read_status(bookie: Bookie, lid: int, eid: int) -> Status:
    return (await bookie.handle(ReadRequest(lid, eid))).status


async def test_scheduled_run_collects_ledgers_the_metadata_lost_and_compacts():
    bookie, meta, _ = await make(live=(1, 2, 3, 4))
    try:
        await fill(bookie, (1, 2, 3, 4), 80)
        assert bookie.gc is not None
        segs = len(bookie.fs.listdir("/d/journal"))
        await meta.delete_ledger(3)
        await meta.delete_ledger(4)
        await until(lambda: bookie.gc.stats.ledgers_removed == 2
                    and bookie.gc.stats.bytes_reclaimed > 0, "ledgers 3 and 4 collected")
        assert bookie.store.ledger_ids() == [1, 2]
        for e in range(80):
            lid = (1, 2, 3, 4)[e % 4]
            want = Status.OK if lid in (1, 2) else Status.NO_SUCH_LEDGER
            assert await read_status(bookie, lid, e) == want
        assert len(bookie.fs.listdir("/d/journal")) < segs
        st = bookie.gc.status()
        assert st["runs"] >= 1 and st["ledgers_removed"] == 2 and not st["running"]
        assert st["entries_moved"] > 0 and st["majorCompactionCounter"] >= 1
    finally:
        await bookie.stop()


async def test_a_ledger_seen_moments_ago_is_never_collected():
    config = dataclasses.replace(FAST, gc_min_ledger_age=3600.0)
    bookie, _, faults = await make(config)
    try:
        await fill(bookie, (7,), 5)  # no metadata at all for ledger 7
        await until(lambda: bookie.gc.stats.runs >= 5, "five runs")
        assert bookie.store.ledger_ids() == [7]
        assert not any(op == "read_ledger" for op, _ in faults.calls)
    finally:
        await bookie.stop()


@pytest.mark.parametrize("failing", ["list_ledgers", "read_ledger"])
async def test_a_transient_metadata_failure_collects_nothing(failing):
    bookie, _, faults = await make()
    faults.fail.add(failing)
    try:
        await fill(bookie, (1, 3), 20)
        await until(lambda: bookie.gc.stats.runs >= 5, "five runs")
        assert bookie.store.ledger_ids() == [1, 3]
        if failing == "list_ledgers":
            assert bookie.gc.stats.skipped_runs >= 5
            assert "listing" in bookie.gc.status()["last_run"]["skipped"]
        faults.fail.clear()  # the metadata answers again: ledger 3 goes
        await until(lambda: bookie.store.ledger_ids() == [1], "ledger 3 collected")
    finally:
        await bookie.stop()


async def test_damaged_metadata_is_never_a_reason_to_delete():
    bookie, _, faults = await make()
    faults.exc = CorruptRecordError("ledger metadata fails its checksum")
    faults.fail.add("read_ledger")
    try:
        await fill(bookie, (3,), 10)
        await until(lambda: bookie.gc.stats.runs >= 3, "three runs")
        assert bookie.store.ledger_ids() == [3]
    finally:
        await bookie.stop()


async def test_a_stale_listing_is_checked_ledger_by_ledger_twice():
    """The listing misses ledger 3 (stale) but reading it finds it: kept. Each collected
    ledger was read twice before its deletion (rule R8)."""
    bookie, meta, faults = await make(live=(1, 3, 4))
    real_list = meta.list_ledgers

    async def stale_list() -> list[int]:
        return [lid for lid in await real_list() if lid != 3]

    bookie.gc.list_ledgers = stale_list
    try:
        await fill(bookie, (1, 3, 4), 30)
        await meta.delete_ledger(4)
        await until(lambda: bookie.store.ledger_ids() == [1, 3], "ledger 4 collected")
        reads = [k for op, k in faults.calls if op == "read_ledger"]
        assert reads.count(4) == 2
        await until(lambda: bookie.gc.stats.runs >= 4, "more runs")
        assert bookie.store.ledger_ids() == [1, 3]
    finally:
        await bookie.stop()


async def test_no_metadata_store_means_no_collector_and_a_clear_error():
    bookie = Bookie("b1", "/d", fs=MemFileSystem(), config=FAST)
    await bookie.start()
    try:
        assert bookie.gc is None
        with pytest.raises(BookieStateError, match="no metadata store"):
            await bookie.run_gc()
    finally:
        await bookie.stop()


async def test_run_gc_asked_runs_major_compaction_now():
    config = dataclasses.replace(FAST, gc_interval=0, gc_minor_interval=3600,
                                 gc_major_interval=3600)
    bookie, _, _ = await make(config)
    try:
        await fill(bookie, (1, 5), 80)
        assert bookie.gc.stats.runs == 0  # no timer
        result = await bookie.run_gc()
        assert result.ledgers_removed == [5] and result.compaction == "major"
        assert result.bytes_reclaimed > 0
        assert bookie.gc.stats.forced_runs == 1
    finally:
        await bookie.stop()


async def test_disk_pressure_runs_at_once_and_a_full_bookie_compacts_back_to_writable():
    config = dataclasses.replace(FAST, gc_interval=3600, disk_usage_threshold=0.6,
                                 disk_usage_low_water=0.5, gc_disk_pressure=0.6,
                                 disk_check_interval=0.02)
    bookie, meta, _ = await make(config, capacity=64 << 10, live=(9,))
    try:
        states: list[str] = []
        bookie.on_state_change = states.append
        e = 0
        while bookie.check_disk() == WRITABLE:
            await fill(bookie, (9,), 1, size=400, first=e)  # live: nothing to collect
            e += 1
            assert e < 500
        assert bookie.state == READ_ONLY
        await until(lambda: bookie.gc.stats.pressure_runs >= 1, "a run on the pressure")
        assert bookie.gc.stats.runs == bookie.gc.stats.pressure_runs  # none scheduled yet
        assert bookie.state == READ_ONLY and bookie.store.ledger_ids() == [9]
        await meta.delete_ledger(9)  # now the space is garbage: the next check compacts
        await until(lambda: bookie.state == WRITABLE, "back to writable")
        assert bookie.store.ledger_ids() == []
        assert states[-1] == WRITABLE and bookie.gc.stats.bytes_reclaimed > 0
        assert await read_status(bookie, 1, 0) == Status.NO_SUCH_LEDGER
        r = await bookie.handle(AddRequest(1, 0, KEY, frame(1, 0)))
        assert r.status == Status.OK
    finally:
        await bookie.stop()


async def test_compaction_is_paced_on_loop_time_and_a_stop_cuts_the_pause_short():
    rate = 20_000.0  # bytes/s
    config = dataclasses.replace(FAST, gc_interval=0, gc_compaction_rate=rate,
                                 gc_major_threshold=0.9)
    bookie, _, _ = await make(config, live=(1,))
    try:
        await fill(bookie, (1, 6, 6, 6), 200)
        loop = asyncio.get_running_loop()
        began = loop.time()
        result = await bookie.run_gc()
        took = loop.time() - began
        assert result.entries_moved > 0
        moved = sum(len(frame(1, e, b"x" * 60)) for e in range(0, 200, 4))
        assert took >= 0.5 * moved / rate, (took, moved)
        await fill(bookie, (1, 8, 8, 8), 200)
        task = asyncio.ensure_future(bookie.run_gc())
        await until(lambda: bookie.gc.stats.compacting == "major", "compacting")
        began = loop.time()
        await bookie.stop()
        assert loop.time() - began < 1.0
        await asyncio.gather(task, return_exceptions=True)
    finally:
        await bookie.stop()


@pytest.mark.parametrize("knob,value", [
    ("gc_min_ledger_age", -1), ("gc_minor_threshold", 1.5), ("gc_major_threshold", -0.1),
    ("gc_disk_pressure", 2), ("gc_compaction_rate", -5), ("gc_interval", "soon"),
    ("gc_major_interval", True),
])
def test_bad_gc_knobs_are_refused_by_name(knob, value):
    with pytest.raises(ValueError, match=knob):
        BookieConfig(**{knob: value})


async def test_a_run_asked_through_the_metadata_is_answered_with_a_published_status():
    from pybk.bookie.gcremote import read_gc_status, request_gc

    config = dataclasses.replace(FAST, gc_interval=0)
    bookie, meta, _ = await make(config, live=(1, 4))
    try:
        await fill(bookie, (1, 4), 40)
        await meta.delete_ledger(4)
        assert await read_gc_status(meta, "b1") is None
        n = await request_gc(meta, "b1")
        await until(lambda: bookie.gc.stats.runs == 1, "the asked run")
        status: dict[str, Any] = {}

        async def published() -> bool:
            status.update(await read_gc_status(meta, "b1") or {})
            return status.get("handled") == n

        for _ in range(400):
            if await published():
                break
            await asyncio.sleep(0.005)
        assert status["handled"] == n and status["ledgers_removed"] == 1
        assert status["last_run"]["compaction"] == "major"
    finally:
        await bookie.stop()
    # a restart does not run the handled request again
    again = Bookie("b1", "/d", fs=bookie.fs, config=config, cookie_store=meta)
    await again.start()
    try:
        assert again.gc is not None and again.gc.stats.runs == 0
        await asyncio.sleep(0)
        assert again.gc.stats.runs == 0
    finally:
        await again.stop()
