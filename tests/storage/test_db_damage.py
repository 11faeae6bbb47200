"""Damage to the db engine's entry logs is found, reported and repaired, never served or
taken for absence: every location row and body is checked against its CRC32C on reads,
compaction and the scrubber's passes; a repair's copy supersedes the damaged one; a bookie
started over suspect journal segments says "unknown", not "absent" (rule R4)."""

from __future__ import annotations

import json
import uuid

import pytest

from pybk.errors import (
    BookieStateError,
    CorruptRecordError,
    IOBookieError,
    NoSuchEntryError,
    UnknownLedgerStateError,
)
from pybk.storage import MemFileSystem
from pybk.storage.dbstore import DbLedgerStore
from pybk.storage.entrylogs import ROW
from pybk.storage.scrub import Scrubber
from pybk.storage.store import StoreConfig
from pybk.testing.ledger_storage_conformance import KEY, body
from pybk.wire import Status

IID = str(uuid.UUID(int=39, version=4))
LOGS = "/data/entrylogs"


def _store(fs: MemFileSystem, **kw: object) -> DbLedgerStore:
    return DbLedgerStore(fs, "/data", IID, StoreConfig(
        storage="db", segment_size=1 << 16, db_read_ahead_bytes=1 << 20, **kw))  # type: ignore[arg-type]


async def _flushed(fs: MemFileSystem, ledgers: range = range(1, 3), n: int = 20,
                   ) -> DbLedgerStore:
    """A store whose ledgers' ``n`` entries each sit in one entry log (log 0)."""
    s = _store(fs)
    await s.open()
    for lid in ledgers:
        for eid in range(n):
            await s.add(lid, eid, body(lid, eid, 100), KEY)
    await s.checkpoint()
    assert sorted(s.logs.logs) == [0]
    s.logs.cache.drop_all()
    return s


def _where(s: DbLedgerStore, lid: int, eid: int) -> tuple[int, int, int, int]:
    found = s.logs.locate(lid, eid)
    assert found is not None
    return found


async def test_a_damaged_body_is_an_error_its_neighbours_are_served() -> None:
    fs = MemFileSystem()
    s = await _flushed(fs)
    log_id, _, off, _ = _where(s, 1, 5)
    fs.flip_bit(f"{LOGS}/{log_id:016d}.log", off + 40)
    with pytest.raises(CorruptRecordError, match="ledger 1 entry 5"):
        s.read(1, 5)
    for eid in (4, 6):  # (read ahead past the damage, or from before it)
        assert s.read(1, eid) == body(1, eid, 100)
    s.logs.cache.drop_all()
    out, errors = s.read_many(1, list(range(20)), 1 << 20)
    assert [(e, st) for e, st, _ in out if st != Status.OK] == [(5, Status.CORRUPT)]
    assert [b for e, st, b in out if st == Status.OK] == [
        body(1, e, 100) for e in range(20) if e != 5]
    assert isinstance(errors[5], CorruptRecordError)


async def test_a_damaged_location_row_is_an_error_never_absent() -> None:
    fs = MemFileSystem()
    s = await _flushed(fs)
    log_id, row, _, _ = _where(s, 2, 7)
    fs.flip_bit(f"{LOGS}/{log_id:016d}.idx", row * ROW.size + 9)  # (its entry id)
    with pytest.raises(CorruptRecordError, match="location row"):
        s.read(2, 7)
    out, _ = s.read_many(2, list(range(20)), 1 << 20)
    assert [(e, st) for e, st, _ in out if st != Status.OK] == [(7, Status.CORRUPT)]
    assert s.read(2, 8) == body(2, 8, 100)


async def test_a_latent_read_error_is_an_io_error() -> None:
    fs = MemFileSystem()
    s = await _flushed(fs)
    log_id, _, off, _ = _where(s, 1, 3)
    fs.fail_reads(f"{LOGS}/{log_id:016d}.log", off, 10)
    with pytest.raises(IOBookieError):
        s.read(1, 3)


async def test_the_scrubber_finds_damage_and_a_repair_supersedes_it() -> None:
    fs = MemFileSystem()
    s = await _flushed(fs)
    found_by_callback: list[tuple[int, int]] = []
    scrubber = Scrubber(s, rate=1 << 30, on_damage=lambda lid, eid, _: found_by_callback.append(
        (lid, eid)))
    assert await scrubber.run_once() == {}
    assert scrubber.checked == 40
    log_id, _, off, _ = _where(s, 1, 5)
    fs.flip_bit(f"{LOGS}/{log_id:016d}.log", off + 40)
    _, row2, _, _ = _where(s, 2, 11)
    fs.flip_bit(f"{LOGS}/{log_id:016d}.idx", row2 * ROW.size + 20)  # (its offset)
    found = await scrubber.run_once()
    assert sorted(found) == [(1, 5), (2, 11)]
    assert sorted(found_by_callback) == [(1, 5), (2, 11)]
    assert sorted(s.damaged) == [(1, 5), (2, 11)]
    # compaction never copies damage under a fresh checksum: the log stays
    result = await s.compact(1.01)
    assert result.entries_moved == 0 and sorted(s.logs.logs) == [0]
    assert s.checkpoint_stats["compaction_damage"] == 1
    # the repair (auto-recovery's add of the good copy) is taken, not refused as a duplicate
    await s.add(1, 5, body(1, 5, 100), KEY, True)
    await s.add(2, 11, body(2, 11, 100), KEY, True)
    assert s.read(1, 5) == body(1, 5, 100)
    await s.checkpoint()  # (the repairs reach a newer log)
    assert await scrubber.run_once() == {}
    assert s.damaged == {}
    result = await s.compact(1.01)  # now the old log goes, its damaged copies with it
    assert 0 not in s.logs.logs and result.entries_moved == 40
    await s.close()
    s = _store(fs)
    await s.open()
    for lid in (1, 2):
        for eid in range(20):
            assert s.read(lid, eid) == body(lid, eid, 100)
    s._check()
    await s.close()


async def test_a_checkpoint_of_the_older_format_is_refused_with_a_reason() -> None:
    fs = MemFileSystem()
    s = await _flushed(fs)
    await s.close()
    path = "/data/db-checkpoint"
    doc = json.loads(fs.read_file(path))
    del doc["format"]
    await fs.write_file_atomic(path, json.dumps(doc).encode())
    with pytest.raises(BookieStateError, match="format 1"):
        await _store(fs).open()


async def test_a_bookie_over_a_suspect_segment_says_unknown_not_absent() -> None:
    """Rule R4 (as the journal engine): with damage in its journal allowed, a db bookie
    cannot prove an entry absent."""
    fs = MemFileSystem()
    s = _store(fs, db_write_cache_bytes=1 << 30)
    await s.open()
    for eid in range(6):
        await s.add(3, eid, body(3, eid, 100), KEY)
    s.abandon(OSError("power cut"))
    path = f"/data/journal/{max(fs.listdir('/data/journal'))}"
    data = fs.read_file(path)
    fs.flip_bit(path, data.rstrip(b"\0").rfind(body(3, 2, 100)) + 50)  # (mid-log)
    with pytest.raises(CorruptRecordError):
        await _store(fs).open()
    s = _store(fs, allow_suspect_segments=True)
    await s.open()
    assert s.suspect
    with pytest.raises(UnknownLedgerStateError):
        s.read(3, 4)
    with pytest.raises(UnknownLedgerStateError):
        s.state(99)
    assert s.read(3, 1) == body(3, 1, 100)
    clean = await _flushed(MemFileSystem())
    with pytest.raises(NoSuchEntryError):
        clean.read(1, 99)
