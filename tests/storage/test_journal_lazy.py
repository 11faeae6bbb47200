"""Lazy journal records (an explicit LAC's): held for the next batch, never a batch and a
sync of their own while other records follow; written alone after ``lazy_wait``, by
``drain`` and ``close``; failed with the journal."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from pybk.errors import JournalFailedError
from pybk.storage import FileHandle, MemFileSystem
from pybk.storage.config import StoreConfig
from pybk.storage.journal import Journal
from pybk.storage.journallazy import LazyRecords
from pybk.storage.records import encode_explicit_lac, encode_fence


class GatedHandle(FileHandle):
    """Counts writes and syncs; each sync waits for the gate."""

    def __init__(self, inner: FileHandle) -> None:
        self.inner, self.path = inner, inner.path
        self.gate = asyncio.Event()
        self.writes: list[int] = []
        self.syncs = 0

    def write(self, data: Any) -> None:
        self.writes.append(len(data))
        self.inner.write(data)

    async def sync(self) -> None:
        await self.gate.wait()
        self.syncs += 1
        await self.inner.sync()

    def size(self) -> int:
        return self.inner.size()

    def close(self) -> None:
        self.inner.close()


async def make_journal(fs: MemFileSystem, **kw: Any) -> tuple[Journal, list[Any], list[Any]]:
    synced: list[Any] = []
    fs.makedirs("/j")
    j = Journal(fs, "/j", str(uuid.UUID(int=7, version=4)),
                on_synced=lambda seg, tags, offsets: synced.extend(
                    zip(tags, offsets[:-1], strict=True)),
                on_failed=lambda tags, exc: None, on_fatal=lambda exc: None,
                on_write_error=lambda exc: None, **kw)
    await j.open(0)
    return j, synced, []


async def _passes(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_lazy_record_rides_the_next_batch_and_makes_none_of_its_own():
    j, synced, _ = await make_journal(MemFileSystem(), lazy_wait=10.0)
    gated = GatedHandle(j._fh)
    j._fh = gated
    gated.gate.set()
    lac = j.append_lazy(encode_explicit_lac(1, 0, b"x"))
    await _passes()
    assert gated.writes == [] and not lac.done()  # held: nothing written, nothing synced
    assert j.stats["lazy"] == 1
    fence = j.append(encode_fence(1), tag="f")
    await asyncio.wait_for(fence, 5)
    await asyncio.wait_for(lac, 5)
    assert len(gated.writes) == 1 and gated.syncs == 1  # one batch held both
    assert j.stats["records"] == 2 and synced == [(None, synced[0][1]), ("f", synced[1][1])]
    j._check()
    await j.close()


async def test_a_lazy_record_joins_records_already_buffered():
    j, _, _ = await make_journal(MemFileSystem(), lazy_wait=10.0)
    gated = GatedHandle(j._fh)
    j._fh = gated
    first = j.append(encode_fence(1))
    lac = j.append_lazy(encode_explicit_lac(1, 0, b"x"))  # (buffered: joins at once)
    assert j.stats["lazy"] == 0 and not j.lazy.data
    gated.gate.set()
    await asyncio.wait_for(asyncio.gather(first, lac), 5)
    assert len(gated.writes) == 1
    await j.close()


async def test_a_held_record_alone_is_written_after_lazy_wait():
    j, _, _ = await make_journal(MemFileSystem(), lazy_wait=0.01)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    lac = j.append_lazy(encode_explicit_lac(1, 0, b"x"))
    await asyncio.wait_for(lac, 5)
    assert loop.time() - t0 >= 0.01
    assert j.stats["batches"] == 1 and not j.lazy.data
    j._check()
    await j.close()


async def test_drain_and_close_write_held_records():
    fs = MemFileSystem()
    j, _, _ = await make_journal(fs, lazy_wait=100.0)
    lac = j.append_lazy(encode_explicit_lac(1, 0, b"x"))
    await asyncio.wait_for(j.drain(), 5)
    assert lac.done() and lac.exception() is None
    lac2 = j.append_lazy(encode_explicit_lac(1, 1, b"y"))
    await asyncio.wait_for(j.close(), 5)
    assert lac2.done() and lac2.exception() is None and j.stats["batches"] == 2


async def test_a_crash_fails_held_records():
    j, _, _ = await make_journal(MemFileSystem(), lazy_wait=100.0)
    lac = j.append_lazy(encode_explicit_lac(1, 0, b"x"))
    j.abandon(JournalFailedError("crash"))
    assert isinstance(lac.exception(), JournalFailedError)
    late = j.append_lazy(encode_explicit_lac(1, 1, b"y"))  # refused like any append
    await _passes(1)
    assert isinstance(late.exception(), JournalFailedError)


def test_a_negative_lazy_wait_is_refused():
    with pytest.raises(ValueError, match="lazy wait"):
        LazyRecords(-1.0, lambda: None)
    with pytest.raises(ValueError, match="journal_lazy_wait"):
        StoreConfig(journal_lazy_wait=-0.5)
