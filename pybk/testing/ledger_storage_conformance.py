"""A conformance suite any ledger storage engine can run (:class:`pybk.storage.engine.
LedgerStorage`): the behaviours a bookie relies on, checked from the outside on a
:class:`~pybk.storage.MemFileSystem` (so a crash can be simulated).

Usage in a test::

    def make(fs: FileSystem, data_dir: str) -> LedgerStorage:
        return MyEngine(fs, data_dir, ...)

    await check_ledger_storage(make)           # every check
    await CHECKS["crash_keeps_acked"](make)     # or one (a test per check)
"""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Awaitable, Callable

from pybk.errors import (
    BadRequestError,
    CorruptRecordError,
    EntryExistsError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from pybk.storage import FileSystem, MemFileSystem
from pybk.storage.engine import LedgerStorage
from pybk.storage.records import BATCH_HEADER_SIZE, SEGMENT_HEADER_SIZE, batch_at
from pybk.storage.writes import ResolveFuture
from pybk.wire import DigestManager, Status

__all__ = ["CHECKS", "KEY", "EngineFactory", "body", "check_ledger_storage"]

#: builds an engine over ``fs`` keeping its files under ``data_dir`` (not opened yet); the
#: same arguments twice must give an engine that finds what the first one left
EngineFactory = Callable[[FileSystem, str], LedgerStorage]
Check = Callable[[EngineFactory], Awaitable[None]]

KEY = b"k" * 32
DATA = "/data"


def body(lid: int, eid: int, size: int = 40) -> bytes:
    """A framed entry of ledger ``lid`` (its bytes tell its ids apart)."""
    return DigestManager(lid).frame(eid, eid - 1, 0, bytes([lid % 256, eid % 256]) * (size // 2))


async def _opened(make: EngineFactory, fs: FileSystem) -> LedgerStorage:
    engine = make(fs, DATA)
    assert isinstance(engine, LedgerStorage), f"{type(engine).__name__} is no LedgerStorage"
    await engine.open()
    return engine


async def _fill(s: LedgerStorage, lid: int, eids: range, size: int = 40) -> None:
    for eid in eids:
        await s.add(lid, eid, body(lid, eid, size), KEY)


async def _add_batch(s: LedgerStorage, lid: int, eids: list[int]) -> object:
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    def done(outcome: object) -> None:
        if not fut.done():
            fut.set_result(outcome)

    s.add_batch(lid, eids, [body(lid, e) for e in eids], KEY, False, done)
    return await fut


async def _refused(call: Callable[[], object], error: type[BaseException]) -> None:
    """``call()`` (awaited when it returns an awaitable) must raise ``error``."""
    try:
        result = call()
        if inspect.isawaitable(result):
            await result
    except error:
        return
    raise AssertionError(f"expected {error.__name__}")


async def check_add_read(make: EngineFactory) -> None:
    """Adds are read back byte for byte, singly, batched, by range and as "the last"."""
    s = await _opened(make, MemFileSystem())
    await _fill(s, 1, range(10))
    for eid in range(10):
        assert s.read(1, eid) == body(1, eid)
    assert s.read(1, -1) == body(1, 9)
    assert s.state(1).last_entry == 9 and s.find(1) is not None
    assert [e for e, _ in s.read_range(1, 3, 5)] == [3, 4, 5]
    assert s.ranges(1) == ((0, 9),)
    assert s.entry_size(1, 4) is not None and s.entry_size(1, 10) is None
    assert s.ledger_ids() == [1]
    await _refused(lambda: s.read(1, 10), NoSuchEntryError)
    await _refused(lambda: s.read(2, 0), NoSuchLedgerError)
    assert s.find(2) is None and s.lac(2) == -1
    await s.close()


async def check_batches(make: EngineFactory) -> None:
    """A batched add stores every entry (one answer); a batched read answers a prefix, each
    absent id alone, within its byte budget."""
    s = await _opened(make, MemFileSystem())
    assert await _add_batch(s, 3, list(range(20))) is None
    out, errors = s.read_many(3, [0, 1, 50, 2], 1 << 20)
    assert [(e, st) for e, st, _ in out] == [(0, Status.OK), (1, Status.OK),
                                            (50, Status.NO_SUCH_ENTRY), (2, Status.OK)]
    assert out[0][2] == body(3, 0) and out[3][2] == body(3, 2)
    assert set(errors) == {2} and isinstance(errors[2], NoSuchEntryError)
    small, _ = s.read_many(3, list(range(20)), 1)
    assert len(small) == 1, "a batched read answers at least one entry, then stops at its budget"
    await _refused(lambda: _add_batch(s, 3, []), BadRequestError)
    await s.close()


async def check_duplicates_and_keys(make: EngineFactory) -> None:
    """The same bytes twice are fine; other bytes, another key or a mislabelled body are not."""
    s = await _opened(make, MemFileSystem())
    await _fill(s, 4, range(3))
    await s.add(4, 1, body(4, 1), KEY)
    for call, error in (
        (lambda: s.add(4, 1, body(4, 1, size=60), KEY), EntryExistsError),
        (lambda: s.add(4, 3, body(4, 3), b"x" * 32), UnauthorizedError),
        (lambda: s.add(4, 3, body(4, 4), KEY), BadRequestError),
        (lambda: s.add(4, 3, b"short", KEY), BadRequestError),
    ):
        await _refused(call, error)
    assert s.ranges(4) == ((0, 2),)
    await s.close()


async def check_fence_and_lac(make: EngineFactory) -> None:
    """A fence stops later adds (not recovery adds) at once; explicit and piggybacked LACs."""
    fs = MemFileSystem()
    s = await _opened(make, fs)
    await _fill(s, 5, range(4))  # each body piggybacks eid - 1
    assert s.lac(5) == 2
    await s.fence(5, KEY)
    assert s.state(5).fenced
    await _refused(lambda: s.add(5, 4, body(5, 4), KEY), LedgerFencedError)
    await s.add(5, 4, body(5, 4), KEY, recovery=True)
    await s.write_lac(5, 7, b"lac-body", KEY)
    assert s.lac(5) == 7 and s.state(5).explicit_lac_body == b"lac-body"
    await s.fence(6, KEY)  # an unknown ledger is created fenced
    assert s.find(6) is not None and s.state(6).fenced and s.state(6).last_entry == -1
    await s.close()
    s = await _opened(make, fs)
    assert s.state(5).fenced and s.lac(5) == 7 and s.state(5).last_entry == 4
    await s.close()


async def check_delete(make: EngineFactory) -> None:
    """A deleted ledger is gone for good: reads, adds, fences, LAC writes refused, after a
    restart too; its ids leave ``ledger_ids``."""
    fs = MemFileSystem()
    s = await _opened(make, fs)
    await _fill(s, 7, range(5))
    await _fill(s, 8, range(5))
    await s.delete_ledger(7)
    await s.delete_ledger(99)  # never held: the deletion is recorded all the same
    for _ in range(2):
        await _deleted_stays_refused(s)
        await s.checkpoint()
        await s.close()
        s = await _opened(make, fs)
    await s.close()


async def _deleted_stays_refused(s: LedgerStorage) -> None:
    assert s.is_deleted(7) and s.is_deleted(99) and s.find(7) is None
    assert s.ledger_ids() == [8]
    await _refused(lambda: s.read(7, 0), NoSuchLedgerError)
    await _refused(lambda: s.add(7, 5, body(7, 5), KEY), LedgerFencedError)
    await _refused(lambda: s.fence(7, KEY), NoSuchLedgerError)
    await _refused(lambda: s.write_lac(7, 1, b"x", KEY), LedgerFencedError)
    assert s.read(8, 4) == body(8, 4)


async def check_restart(make: EngineFactory) -> None:
    """A clean close and reopen finds every ledger and entry, over many ledgers interleaved."""
    fs = MemFileSystem()
    s = await _opened(make, fs)
    rng = random.Random(7)
    held: dict[int, int] = {}
    for _ in range(300):
        lid = rng.randrange(10, 30)
        eid = held.get(lid, -1) + 1
        await s.add(lid, eid, body(lid, eid, rng.choice((10, 200, 2000))), KEY)
        held[lid] = eid
        if rng.random() < 0.02:
            await s.checkpoint()
    await s.close()
    s = await _opened(make, fs)
    assert s.ledger_ids() == sorted(held)
    for lid, last in held.items():
        assert s.ranges(lid) == ((0, last),)
        assert s.state(lid).last_entry == last
    await s.close()


async def check_crash_keeps_acked(make: EngineFactory) -> None:
    """A power cut (no close) at any point loses nothing acknowledged: each crash mode,
    with and without a checkpoint between the writes."""
    for mode in ("drop", "torn", "reorder"):
        for checkpoint_at in (-1, 20, 45):
            fs = MemFileSystem()
            s = await _opened(make, fs)
            acked: list[tuple[int, int]] = []
            unacked: list[tuple[int, int]] = []
            for i in range(60):
                lid, eid = 40 + i % 3, i // 3
                if i == checkpoint_at:
                    await s.checkpoint()
                if i < 50:
                    await s.add(lid, eid, body(lid, eid), KEY)
                    acked.append((lid, eid))
                else:  # written, never awaited: may or may not survive
                    s.add_entry(lid, eid, body(lid, eid), KEY, False, lambda e: None)
                    unacked.append((lid, eid))
            s.abandon(OSError("power cut"))
            fs.crash(mode, random.Random(checkpoint_at + 7))
            s = await _opened(make, fs)
            for lid, eid in acked:
                assert s.read(lid, eid) == body(lid, eid), (mode, checkpoint_at, lid, eid)
            for lid in (40, 41, 42):  # what survived of the rest is a prefix, intact
                last = s.state(lid).last_entry
                for eid in range(last + 1):
                    assert s.read(lid, eid) == body(lid, eid)
            await s.close()


async def check_misdirected_last_batch(make: EngineFactory) -> None:
    """A synced batch written over the journal's last one (misdirected I/O) is damage, not a
    torn tail: the engine refuses to start rather than drop the last batch's acknowledged
    entry. With a checkpoint between the two batches, too (a checkpoint's mark may be past
    the batch the misdirected bytes came from)."""
    for checkpoint_between in (False, True):
        fs = MemFileSystem()
        s = await _opened(make, fs)
        await _fill(s, 70, range(5))
        if checkpoint_between:
            await s.checkpoint()
        await _fill(s, 70, range(5, 6))
        s.abandon(OSError("power cut"))
        jdir = f"{DATA}/journal"
        path = f"{jdir}/{max(n for n in fs.listdir(jdir) if n.endswith('.seg'))}"
        data = fs.read_file(path)
        batches, pos = [], SEGMENT_HEADER_SIZE
        while (found := batch_at(data, pos)) is not None:
            batches.append((pos, BATCH_HEADER_SIZE + found[1]))
            pos += BATCH_HEADER_SIZE + found[1]
        (prev, size), (last, _) = batches[-2], batches[-1]
        fs.misdirect_write(path, prev, size, last)
        try:
            await _opened(make, fs)
        except CorruptRecordError:
            continue
        raise AssertionError(f"a misdirected write over the last batch went undetected "
                             f"(checkpoint between: {checkpoint_between})")


async def check_maintenance(make: EngineFactory) -> None:
    """Checkpoints, usage and compaction keep every live entry readable."""
    fs = MemFileSystem()
    s = await _opened(make, fs)
    for lid in range(50, 56):
        await _fill(s, lid, range(40), size=200)
    for lid in range(50, 55):
        await s.delete_ledger(lid)
    await s.checkpoint()
    assert isinstance(s.checkpoint_stats, dict)
    for seq, (live, size) in s.segment_usage().items():
        assert 0 <= live <= size, (seq, live, size)
    await s.compact(0.9)
    for eid in range(40):
        assert s.read(55, eid) == body(55, eid, 200)
    await s.close()
    s = await _opened(make, fs)
    assert s.ledger_ids() == [55] and s.read(55, 39) == body(55, 39, 200)
    s._check()
    await s.close()


async def check_callbacks(make: EngineFactory) -> None:
    """``add_entry`` answers exactly once through its callback."""
    s = await _opened(make, MemFileSystem())
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    s.add_entry(60, 0, body(60, 0), KEY, False, ResolveFuture(fut))
    await fut
    assert s.read(60, 0) == body(60, 0)
    await s.close()


CHECKS: dict[str, Check] = {
    "add_read": check_add_read,
    "batches": check_batches,
    "duplicates_and_keys": check_duplicates_and_keys,
    "fence_and_lac": check_fence_and_lac,
    "delete": check_delete,
    "restart": check_restart,
    "crash_keeps_acked": check_crash_keeps_acked,
    "misdirected_last_batch": check_misdirected_last_batch,
    "maintenance": check_maintenance,
    "callbacks": check_callbacks,
}


async def check_ledger_storage(make: EngineFactory) -> None:
    """Run every check of :data:`CHECKS` against engines from ``make``."""
    for check in CHECKS.values():
        await check(make)
