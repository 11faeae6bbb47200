"""The db engine's background flush: two write caches (adds fill one while the other is
flushed, off the event loop), reads in both, adds held while both are full, crashes and disk
errors in the middle of a flush."""

from __future__ import annotations

import asyncio
import errno
import random
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from pybk.errors import LedgerFencedError
from pybk.storage import MemFileSystem, OsFileSystem
from pybk.storage.dbstore import DbLedgerStore
from pybk.storage.fs import SimulatedCrash
from pybk.storage.store import StoreConfig
from pybk.testing.ledger_storage_conformance import KEY, body

T = TypeVar("T")
IID = str(uuid.UUID(int=64, version=4))
CACHE = 4096  # bytes: a flush after about 25 entries of 100 bytes


class GatedFs(MemFileSystem):
    """A simulated disk whose flush work waits for :attr:`gate`: the test holds a flush in
    the middle, while adds and reads go on."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.offloads = 0

    async def offload(self, work: Callable[[], T]) -> T:
        self.offloads += 1
        await self.gate.wait()
        return await super().offload(work)


async def _db(fs: MemFileSystem, errors: list[OSError] | None = None) -> DbLedgerStore:
    s = DbLedgerStore(fs, "/data", IID, StoreConfig(
        storage="db", segment_size=1 << 16, db_write_cache_bytes=CACHE),
        on_write_error=(errors if errors is not None else []).append)
    await s.open()
    return s


async def _until(cond: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def _fill_until_flushing(s: DbLedgerStore, lid: int = 1) -> int:
    """Add entries to ``lid`` until a background flush is in flight; returns how many."""
    eid = 0
    while not s.flushing_now:
        await s.add(lid, eid, body(lid, eid, 100), KEY)
        eid += 1
        await asyncio.sleep(0)
    return eid


async def test_reads_during_a_flush_find_entries_in_the_flushing_cache_and_the_new_one(
        ) -> None:
    fs = GatedFs()
    s = await _db(fs)
    fs.gate.clear()
    flushing = await _fill_until_flushing(s)
    assert s._table.flushing and not s.logs.logs  # the cache taken, nothing in a log yet
    for eid in range(5):
        await s.add(2, eid, body(2, eid, 100), KEY)
    assert s._table.cache  # adds went on, into the other cache
    for eid in range(flushing):
        assert s.read(1, eid) == body(1, eid, 100)
        assert s.entry_size(1, eid) is not None
    out, errors = s.read_many(1, list(range(flushing)), 1 << 20)
    assert not errors and [b for _, _, b in out] == [body(1, e, 100) for e in range(flushing)]
    assert s.ranges(1) == ((0, flushing - 1),)
    assert [s.read(2, e) for e in range(5)] == [body(2, e, 100) for e in range(5)]
    fs.gate.set()
    await _until(lambda: not s.flushing_now)
    assert s.logs.logs and not s._table.flushing
    for eid in range(flushing):
        assert s.read(1, eid) == body(1, eid, 100)
    s._check()
    await s.close()


async def test_adds_are_held_while_both_caches_are_full_and_run_in_order_after() -> None:
    fs = GatedFs()
    s = await _db(fs)
    fs.gate.clear()
    first = await _fill_until_flushing(s)
    eid = first
    while s.cache_bytes <= CACHE:  # the second cache fills too
        await s.add(1, eid, body(1, eid, 100), KEY)
        eid += 1
    held = [s.add(1, e, body(1, e, 100), KEY) for e in range(eid, eid + 10)]
    late = s.add(3, 0, body(3, 0, 100), KEY)  # another ledger, not fenced
    await s.fence(3, KEY)  # fenced before the held add of ledger 3 is journaled
    for _ in range(50):
        await asyncio.sleep(0)
    assert not any(f.done() for f in held) and not late.done()
    assert s.adds_held == 11
    fs.gate.set()
    await asyncio.gather(*held)
    with pytest.raises(LedgerFencedError):
        await late
    for e in range(eid + 10):
        assert s.read(1, e) == body(1, e, 100)
    s._check()
    await s.close()


@pytest.mark.parametrize("mode", ["drop", "torn", "reorder"])
async def test_a_crash_at_any_step_of_a_background_flush_loses_nothing_acknowledged(
        mode: str) -> None:
    """Crash-point enumeration over the flush: every write, sync, rename and directory sync
    from the moment the cache is taken until the checkpoint file names the new log."""
    step = 0
    while True:
        fs = GatedFs()
        s = await _db(fs)
        acked: list[tuple[int, int]] = []
        fs.gate.clear()
        n = await _fill_until_flushing(s)
        acked += [(1, e) for e in range(n)]
        for e in range(6):  # acknowledged while the flush is held: in the other cache
            await s.add(2, e, body(2, e, 100), KEY)
            acked.append((2, e))
        ops = [0]

        def crash_at(op: str, path: str, ops: list[int] = ops, at: int = step + 1) -> None:
            ops[0] += 1
            if ops[0] == at:
                raise SimulatedCrash(f"{op} {path}")

        fs.fault_hook = crash_at
        fs.gate.set()
        await _until(lambda s=s: not s.flushing_now)  # type: ignore[misc]
        crashed = ops[0] > step
        fs.fault_hook = None
        s.abandon(OSError("crash"))
        fs.crash(mode, random.Random(step))
        s = await _db(fs)
        for lid, e in acked:
            assert s.read(lid, e) == body(lid, e, 100), (mode, step, lid, e)
        s._check()
        await s.close()
        if not crashed:
            break
        step += 1
    assert step >= 6, "the flush's steps were not all reached"


async def test_a_crash_while_the_flush_thread_works_loses_nothing_acknowledged() -> None:
    """The simulator's window: the log written and synced, its checkpoint not yet written."""
    fs = MemFileSystem()
    fs.sync_delay = 0.001
    s = await _db(fs)
    n = await _fill_until_flushing(s)
    await _until(lambda: bool(fs.listdir("/data/entrylogs")))  # in the offload's wait
    assert s.flushing_now and not s.logs.logs
    s.abandon(OSError("crash"))
    fs.crash("drop", random.Random(1))
    s = await _db(fs)
    # the unnamed log is deleted, unless its creation was lost with the directory unsynced
    assert set(s.report.leftovers_removed) <= {"0000000000000000.idx", "0000000000000000.log"}
    for e in range(n):
        assert s.read(1, e) == body(1, e, 100)
    await s.close()


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
async def test_a_disk_error_in_a_background_flush_goes_to_on_write_error_and_held_adds_run(
        err: int) -> None:
    fs = GatedFs()
    errors: list[OSError] = []
    s = await _db(fs, errors)
    fs.gate.clear()
    first = await _fill_until_flushing(s)
    eid = first
    while s.cache_bytes <= CACHE:
        await s.add(1, eid, body(1, eid, 100), KEY)
        eid += 1
    held = [s.add(1, e, body(1, e, 100), KEY) for e in range(eid, eid + 3)]
    if err == errno.ENOSPC:
        def no_room(op: str, path: str) -> None:
            if op == "write" and "/entrylogs/" in path:
                raise OSError(errno.ENOSPC, f"{path}: no space left on device")
        fs.fault_hook = no_room
    else:
        fs.fail_next_fsync(errno.EIO, path_prefix="/data/entrylogs")
    fs.gate.set()
    await asyncio.gather(*held)  # released when the flush ended, failed or not
    await _until(lambda: not s.flushing_now)
    # (the held adds past the bound start another flush, which fails the same way on a
    # full disk: the bookie turned read-only at the first)
    assert errors and {e.errno for e in errors} == {err}
    fs.fault_hook = None
    for e in range(eid + 3):
        assert s.read(1, e) == body(1, e, 100)
    await s.checkpoint()  # the next flush writes what the failed one kept
    assert not s._table.flushing
    for e in range(eid + 3):
        assert s.read(1, e) == body(1, e, 100)
    s._check()
    await s.close()


async def test_on_real_files_the_flush_runs_on_its_own_thread(tmp_path: Path) -> None:
    fs = OsFileSystem()
    s = DbLedgerStore(fs, str(tmp_path), IID, StoreConfig(
        storage="db", db_write_cache_bytes=64 << 10))
    await s.open()
    threads: list[str] = []
    write_now = s.logs.write_now

    def recorded(*args: object) -> object:
        threads.append(threading.current_thread().name)
        return write_now(*args)  # type: ignore[arg-type]

    s.logs.write_now = recorded  # type: ignore[method-assign,assignment]
    n = 2000
    await asyncio.gather(*(s.add(e % 7, e // 7, body(e % 7, e // 7, 100), KEY)
                           for e in range(n)))
    await s.close()
    assert threads and set(threads) == {"pybk-flush"}
    again = DbLedgerStore(fs, str(tmp_path), IID, StoreConfig(storage="db"))
    await again.open()
    for e in range(n):
        assert again.read(e % 7, e // 7) == body(e % 7, e // 7, 100)
    await again.close()
    fs.close()
