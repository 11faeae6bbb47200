"""The write hot path's shortcuts keep every guarantee of the slow path.

* ``FileHandle.sync_inline`` (MemFileSystem): the same effects and failures as ``sync``,
  declined when syncs take (virtual) time;
* the journal syncs tiny batches inline only while it is the process's one journal, and an
  inline fsync failure is as fatal as a threaded one (nothing covered is acknowledged);
* ``LedgerStore.add_entry(..., on_done)``: called exactly once, only once the entry is durable
  and readable, with the error otherwise; never called when ``add_entry`` raises;
* the index keeps plain location tuples (untracked by the garbage collector) and its
  checkpoint still round-trips the journal position.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import tracemalloc
import uuid

import pytest

from pybk.errors import EntryExistsError, JournalFailedError
from pybk.storage import MemFileSystem
from pybk.storage.checkpoint import decode_checkpoint, encode_checkpoint
from pybk.storage.index import Index, Location, Position
from pybk.storage.journal import Journal
from pybk.storage.records import encode_fence
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=7, version=4))
KEY = b"k" * 32


def body(lid: int, eid: int, payload: bytes = b"p") -> bytes:
    return DigestManager(lid).frame(eid, eid - 1, 0, payload)


# --------------------------------------------------------------------------- sync_inline


def test_mem_sync_inline_makes_bytes_durable_and_reports_the_hook():
    fs = MemFileSystem()
    seen: list[str] = []
    fs.fault_hook = lambda op, path: seen.append(op)
    fh = fs.open_append("/f")
    fh.write(b"abc")
    assert fh.sync_inline() is True
    assert seen[-1] == "sync" and fs.counters["sync"] == 1
    fh.write(b"def")
    fs.crash("drop")
    assert not fs.exists("/f")  # the file's creation was never made durable in its dir


def test_mem_sync_inline_keeps_data_across_a_crash_once_the_dir_is_synced():
    fs = MemFileSystem()
    fs.makedirs("/d")
    fh = fs.open_append("/d/f")
    asyncio.run(fs.fsync_dir("/d"))
    fh.write(b"synced")
    assert fh.sync_inline()
    fh.write(b"lost")
    fs.crash("drop")
    assert fs.read_file("/d/f") == b"synced"


def test_mem_sync_inline_fails_like_sync_and_the_data_is_gone():
    fs = MemFileSystem()
    fs.makedirs("/d")
    fh = fs.open_append("/d/f")
    asyncio.run(fs.fsync_dir("/d"))
    fh.write(b"x" * 10)
    fs.fail_next_fsync()
    with pytest.raises(OSError) as info:
        fh.sync_inline()
    assert info.value.errno == errno.EIO
    assert fh.sync_inline()  # a retry "succeeds" (fsyncgate) ...
    fs.crash("drop")
    assert fs.read_file("/d/f") == bytes(10)  # ... but the bytes never became durable


def test_mem_sync_inline_declines_when_syncs_take_virtual_time():
    fs = MemFileSystem()
    fs.sync_delay = 0.001
    fh = fs.open_append("/f")
    fh.write(b"abc")
    assert fh.sync_inline() is False
    assert fs.counters["sync"] == 0


def test_mem_sync_inline_blocks_its_caller_for_the_delay_when_given_a_way_to():
    """With ``stall`` (the simulator's loop) an inline sync that takes time is modelled: the
    caller blocks for ``sync_delay`` and the bytes are durable when it returns."""
    fs = MemFileSystem()
    fs.sync_delay = 0.004
    blocked: list[float] = []
    fs.stall = blocked.append
    fh = fs.open_append("/f")
    fh.write(b"abc")
    assert fh.sync_inline() is True
    assert blocked == [0.004] and fs.counters["sync"] == 1
    assert fs.unsynced_bytes() == 0


def test_simulated_inline_sync_moves_virtual_time_with_nothing_else_running():
    from pybk.sim.cluster import SimCluster
    from pybk.sim.loop import run

    async def main() -> tuple[float, list[str]]:
        loop = asyncio.get_running_loop()
        fs = SimCluster(0, 1).bookies["b0"].fs
        fs.sync_delay = 0.25
        order: list[str] = []
        loop.call_later(0.1, order.append, "timer at 0.1")
        fh = fs.open_append("/f")
        fh.write(b"x")
        assert fh.sync_inline()
        order.append(f"sync returned at {loop.time()}")
        await asyncio.sleep(0)
        return loop.time(), order

    now, order = run(main())
    assert now == 0.25
    assert order == ["sync returned at 0.25", "timer at 0.1"]  # the timer ran late


def test_a_simulated_disk_sync_waits_its_delay_in_virtual_time_through_its_wait():
    """A simulated bookie's disk waits out a sync's delay through its ``wait`` (the loop's bare
    timer future): the sync returns ``sync_delay`` later, a timer due meanwhile runs first,
    and the bytes are durable after it (and not before); a directory sync waits the same."""
    from pybk.sim.cluster import SimCluster
    from pybk.sim.loop import run

    async def main() -> tuple[list[str], int, int]:
        loop = asyncio.get_running_loop()
        fs = SimCluster(0, 1).bookies["b0"].fs
        assert fs.wait is not None
        fs.sync_delay = 0.25
        order: list[str] = []
        loop.call_later(0.1, order.append, "timer at 0.1")
        fh = fs.open_append("/f")
        fh.write(b"xyz")
        syncing = asyncio.ensure_future(fh.sync())
        await asyncio.sleep(0.2)
        unsynced_meanwhile = fs.unsynced_bytes()
        await syncing
        order.append(f"sync returned at {loop.time()}")
        await fs.fsync_dir("/")
        order.append(f"dir sync returned at {loop.time()}")
        return order, unsynced_meanwhile, fs.unsynced_bytes()

    order, meanwhile, after = run(main())
    assert order == ["timer at 0.1", "sync returned at 0.25", "dir sync returned at 0.5"]
    assert meanwhile == 3 and after == 0


def test_a_simulated_disk_sync_without_delay_takes_a_turn_as_asyncio_sleep_0_would():
    """With no sync delay a simulated disk's sync yields one turn, like ``asyncio.sleep(0)``
    (not a timer due now, which would run after everything queued meanwhile)."""
    from pybk.sim.cluster import SimCluster
    from pybk.sim.loop import run

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        fs = SimCluster(0, 1).bookies["b0"].fs
        fs.sync_delay = 0.0
        order: list[str] = []
        fh = fs.open_append("/f")
        fh.write(b"x")

        async def sync() -> None:
            await fh.sync()
            order.append("synced")

        async def other() -> None:
            await asyncio.sleep(0)
            order.append("other")

        task = asyncio.ensure_future(sync())
        others = asyncio.ensure_future(other())
        loop.call_soon(loop.call_soon, order.append, "queued later")
        await asyncio.gather(task, others)
        return order

    assert run(main()) == ["synced", "other", "queued later"]


async def _journal(fs: MemFileSystem, name: str, synced: list, fatal: list,
                   inline_sync_max: int = 2) -> Journal:
    fs.makedirs(name)
    def on_synced(seg: int, tags: list, offsets: list) -> None:  # type: ignore[type-arg]
        synced.extend(zip(tags, offsets[:-1], strict=True))  # (tag, start offset)

    j = Journal(fs, name, IID, on_synced=on_synced,
                on_failed=lambda tags, exc: None, on_fatal=fatal.append,
                on_write_error=lambda exc: None, inline_sync_max=inline_sync_max)
    await j.open(0)
    return j


async def test_journal_syncs_a_lone_record_inline_and_a_big_batch_on_the_thread_path():
    fs = MemFileSystem()
    synced: list = []
    j = await _journal(fs, "/j", synced, [])
    try:
        await asyncio.wait_for(j.append(encode_fence(1), tag="a"), 5)
        assert j.stats["inline_syncs"] == 1
        futs = [j.append(encode_fence(i), tag=i) for i in range(10)]
        await asyncio.wait_for(asyncio.gather(*futs), 5)
        assert j.stats["inline_syncs"] == 1 and j.stats["batches"] == 2
        assert [t for t, _ in synced] == ["a", *range(10)]
    finally:
        await j.close()


async def test_inline_syncs_are_explicit_configuration_not_process_state():
    """Off by default (bookies sharing a loop keep overlapping syncs); on only when asked;
    and never dependent on how many other journals the process has open (determinism)."""
    fs = MemFileSystem()
    synced: list = []
    off = await _journal(fs, "/j1", synced, [], inline_sync_max=0)
    on = await _journal(fs, "/j2", synced, [], inline_sync_max=2)
    try:
        await asyncio.wait_for(off.append(encode_fence(1)), 5)
        await asyncio.wait_for(on.append(encode_fence(1)), 5)  # another journal is open
        assert off.stats["inline_syncs"] == 0 and on.stats["inline_syncs"] == 1
    finally:
        await off.close()
        await on.close()
    fs2 = MemFileSystem()
    default = Journal(fs2, "/d", IID, on_synced=lambda seg, tags, offsets: None,
                      on_failed=lambda tags, exc: None, on_fatal=lambda exc: None,
                      on_write_error=lambda exc: None)
    assert default.inline_sync_max == 0


async def test_inline_fsync_failure_is_fatal_and_acknowledges_nothing():
    fs = MemFileSystem()
    synced: list = []
    fatal: list = []
    j = await _journal(fs, "/j", synced, fatal)
    fs.fail_next_fsync()
    fut = j.append(encode_fence(1), tag="t")
    with pytest.raises(JournalFailedError, match="fsync"):
        await asyncio.wait_for(fut, 5)
    assert synced == [] and len(fatal) == 1 and j.failed is not None
    later = j.append(encode_fence(2))
    with pytest.raises(JournalFailedError):
        await later
    j.abandon(JournalFailedError("test over"))


# --------------------------------------------------------------------------- add_entry(on_done)


async def _store(fs: MemFileSystem) -> LedgerStore:
    s = LedgerStore(fs, "/data", IID, StoreConfig())
    await s.open()
    return s


async def test_on_done_runs_once_after_the_entry_is_durable_and_readable():
    fs = MemFileSystem()
    s = await _store(fs)
    calls: list = []

    def on_done(exc: BaseException | None) -> None:
        # at this moment the entry is in the index and readable
        calls.append((exc, s.read(1, 0) if exc is None else None))

    b = body(1, 0)
    s.add_entry(1, 0, b, KEY, False, on_done)
    assert calls == []  # not before the fsync
    await asyncio.wait_for(s.journal.drain(), 5)
    assert calls == [(None, b)]
    # an identical re-add of a stored entry answers at once, a different one raises
    s.add_entry(1, 0, b, KEY, False, on_done)
    assert calls[-1] == (None, b) and len(calls) == 2
    with pytest.raises(EntryExistsError):
        s.add_entry(1, 0, body(1, 0, b"other"), KEY, False, on_done)
    assert len(calls) == 2  # not called when add_entry raises
    await s.close()


async def test_on_done_of_a_duplicate_pending_add_waits_for_the_original():
    fs = MemFileSystem()
    s = await _store(fs)
    calls: list = []
    b = body(2, 0)
    s.add_entry(2, 0, b, KEY, False, lambda e: calls.append(("first", e)))
    s.add_entry(2, 0, b, KEY, False, lambda e: calls.append(("dup", e)))
    assert calls == []
    with pytest.raises(EntryExistsError):  # different bytes while the first is pending
        s.add_entry(2, 0, body(2, 0, b"other"), KEY, False, calls.append)
    await asyncio.wait_for(s.journal.drain(), 5)
    assert calls == [("first", None), ("dup", None)]
    assert s.read(2, 0) == b
    await s.close()


async def test_on_done_gets_the_error_when_the_fsync_fails_or_the_store_crashes():
    fs = MemFileSystem()
    s = await _store(fs)
    got: list = []
    fs.fail_next_fsync()
    b = body(3, 0)
    s.add_entry(3, 0, b, KEY, False, got.append)
    s.add_entry(3, 0, b, KEY, False, got.append)  # a duplicate waiting on the same fsync
    await asyncio.wait_for(s.journal.drain(), 5)
    assert len(got) == 2 and all(isinstance(e, JournalFailedError) for e in got)
    assert got[0] is not got[1]  # one exception object per waiter
    s.abandon(JournalFailedError("crash"))
    # a journal that is gone refuses a new add at once (and on_done is never called)
    with pytest.raises(JournalFailedError):
        s.add_entry(5, 0, body(5, 0), KEY, False, got.append)
    assert len(got) == 2


async def test_a_crash_answers_every_pending_add_once():
    fs = MemFileSystem()
    s = await _store(fs)
    got: list = []
    for eid in range(5):
        s.add_entry(4, eid, body(4, eid), KEY, False, got.append)
    s.abandon(JournalFailedError("crash"))
    assert len(got) == 5 and all(isinstance(e, JournalFailedError) for e in got)
    await asyncio.sleep(0)
    assert len(got) == 5


async def test_a_failing_on_done_does_not_break_the_journal():
    fs = MemFileSystem()
    s = await _store(fs)

    def boom(exc: BaseException | None) -> None:
        raise RuntimeError("listener bug")

    s.add_entry(6, 0, body(6, 0), KEY, False, boom)
    await asyncio.wait_for(s.journal.drain(), 5)
    assert s.read(6, 0) == body(6, 0)
    await asyncio.wait_for(s.add(6, 1, body(6, 1), KEY), 5)  # still writing
    assert s.journal.failed is None
    await s.close()


# --------------------------------------------------------------------------- index


def test_the_index_costs_about_16_bytes_an_entry_and_no_object_per_entry():
    """Locations live in array columns: no tuple, dict slot or int object per entry for the
    garbage collector to walk, ~16 bytes each (a dict of tuples cost ~160)."""
    idx = Index()
    idx.put_entry(1, 0, Location(3, 40, 60), -1)
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for eid in range(1, 100_001):
        idx.put_entry(1, eid, (3 + eid // 1000, 40 + 100 * eid, 60), -1)
    per_entry = (tracemalloc.get_traced_memory()[0] - before) / 100_000
    tracemalloc.stop()
    gc.collect()
    assert per_entry < 24, per_entry
    assert len(gc.get_objects()) - objects < 100
    assert idx.ledgers[1].location(0) == Location(3, 40, 60)
    assert idx.ledgers[1].location(100_000) == Location(103, 40 + 10_000_000, 60)
    assert idx.ledgers[1].location(100_001) is None
    idx._check()


def test_checkpoint_keeps_its_position_whatever_segments_entries_live_in():
    idx = Index()
    idx.put_entry(1, 0, (0, 40, 60), -1)
    idx.put_entry(1, 1, (4, 80, 70), 0)
    cp = decode_checkpoint(encode_checkpoint(idx, Position(9, 220, 3)), "cp")
    back, pos = cp.build_index(), cp.position
    assert pos == Position(9, 220, 3)
    assert back.ledgers[1].entries.items() == [(0, (0, 40, 60)), (1, (4, 80, 70))]
    back._check()


def test_entry_index_matches_a_dict_and_its_changes_rebuild_it():
    """EntryIndex against a plain dict: ids in order, out of order, with short gaps (holes
    in the dense run) and long ones (sparse), moves; what each ``take_changes`` returns,
    applied in turn to a fresh index the way delta checkpoints are loaded, rebuilds it."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from pybk.storage.entryindex import MAX_GAP, EntryIndex

    ids = st.one_of(st.integers(0, 3 * MAX_GAP), st.integers(0, 10**9))

    @settings(derandomize=True, max_examples=300, deadline=None)
    @given(ops=st.lists(st.tuples(st.one_of(ids, st.just(-1)), st.booleans(), st.booleans()),
                        max_size=80))
    def check(ops: list[tuple[int, bool, bool]]) -> None:
        idx = EntryIndex()
        copy = EntryIndex()  # built only from what the checkpoints took
        model: dict[int, tuple[int, int, int]] = {}
        changed: set[int] = set()  # added or moved since the last checkpoint
        for n, (eid, query, checkpoint) in enumerate(ops):
            if eid == -1:  # the next id, as the write path appends it
                eid = idx.end
            loc = (1 + n % 3, n * 100, 10 + n)
            old = idx.put(eid, loc)
            assert old == model.get(eid)
            model[eid] = loc
            changed.add(eid)
            if query:  # ordered questions interleaved with inserts
                assert list(idx) == sorted(model)
                assert list(idx.irange(10, 40)) == [e for e in sorted(model) if 10 <= e <= 40]
            if checkpoint:  # what a delta checkpoint takes: exactly the changes, current
                cols, rows = idx.take_changes()
                taken = {cols.first + i: (cols.segs[i], cols.offs[i], size)
                         for i, size in enumerate(cols.sizes) if size} | rows
                assert taken == {e: model[e] for e in changed}
                changed.clear()
                cols2, rows2 = idx.take_changes()
                assert not len(cols2.sizes) and rows2 == {}
                copy.add_columns(cols)
                for e, where in rows.items():
                    copy.put(e, where)
                assert copy.items() == sorted(
                    (e, where) for e, where in model.items() if e not in changed)
            assert idx.last == max(model)
            assert idx.get(eid) == loc and len(idx) == len(model) and eid in idx
            assert sum(idx.live_by_segment().values()) == sum(x[2] for x in model.values())
        assert idx.items() == sorted(model.items())
        assert sorted(idx.values()) == sorted(model.values())
        idx._check()
        copy._check()
        cols, rows = idx.snapshot()
        assert EntryIndex.from_columns(cols, rows.items()).items() == idx.items()

    check()


def test_columns_that_do_not_continue_the_run_are_put_one_by_one():
    from array import array

    from pybk.storage.entryindex import EntryColumns, EntryIndex

    idx = EntryIndex()
    for eid in range(10):
        idx.put(eid, (1, eid * 10, 10))
    idx.put(500, (2, 0, 10))  # far off the run: sparse
    # a run of 3 slots (one a hole) starting past the end, and one meeting the sparse id
    idx.add_columns(EntryColumns(20, array("I", [3, 0, 3]), array("Q", [0, 0, 20]),
                                 array("I", [10, 0, 10])))
    idx.add_columns(EntryColumns(499, array("I", [4, 4]), array("Q", [0, 10]),
                                 array("I", [10, 10])))
    assert list(idx) == [*range(10), 20, 22, 499, 500]
    assert idx.get(500) == (4, 10, 10) and idx.get(21) is None and idx.last == 500
    idx._check()
