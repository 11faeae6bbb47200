"""Preallocated journal segments (``journal_preallocate``): made ahead of use as synced zeros,
renamed into place, written in place; a segment is rotated only once its data reaches the
preallocated length, so only the last segment may end in zeros, and replay cuts those zeros
without calling them damage. Where preallocation fails, segments are created the plain way."""

from __future__ import annotations

import uuid

import pytest

from pybk.errors import CorruptRecordError, JournalFailedError, ReadOnlyBookieError
from pybk.storage import MemFileSystem
from pybk.storage.journal import parse_segment_name
from pybk.storage.prealloc import PREP_CHUNK, PREP_SUFFIX
from pybk.storage.records import SEGMENT_HEADER_SIZE
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=11, version=4))
KEY = b"k" * 32
CONFIG = StoreConfig(journal_preallocate=True, segment_size=1024)


def body(lid: int, eid: int) -> bytes:
    return DigestManager(lid).frame(eid, eid - 1, 0, bytes([lid, eid % 256]) * 40)


async def _store(fs: MemFileSystem, config: StoreConfig = CONFIG) -> LedgerStore:
    s = LedgerStore(fs, "/data", IID, config)
    await s.open()
    return s


async def _fill(s: LedgerStore, n: int, lid: int = 1) -> None:
    for eid in range(n):
        await s.add(lid, eid, body(lid, eid), KEY)


def _segments(fs: MemFileSystem, s: LedgerStore) -> list[int]:
    return sorted(q for q in map(parse_segment_name, fs.listdir(s.journal_dir))
                  if q is not None)


async def _crash_and_restart(fs: MemFileSystem, s: LedgerStore,
                             config: StoreConfig = CONFIG) -> LedgerStore:
    s.abandon(JournalFailedError("crash"))
    fs.crash("drop")
    return await _store(fs, config)


async def test_segments_are_made_ahead_and_written_in_place():
    fs = MemFileSystem()
    s = await _store(fs)
    await _fill(s, 40)  # ~5.5 KB of records: five rotations
    stats = s.journal.stats
    assert stats["rotations"] >= 4 and stats["preallocated"] == stats["rotations"] + 1
    assert stats["prealloc_failures"] == 0
    active = s.journal.segment_seq
    for seq in _segments(fs, s):
        size = fs.file_size(s.journal_path(seq))
        if seq == active:  # the preallocated length; the data ends earlier
            assert size == 1024 and s.journal.position.offset < size
        else:  # sealed: its data reached the preallocated length, no zeros after it
            assert size == s.segment_usage()[seq][1]
            assert fs.pread(s.journal_path(seq), size - 8, 8) != bytes(8)
    s2 = await _crash_and_restart(fs, s)
    assert s2.report.torn_tails == 0 and s2.report.zero_tail_bytes > 0
    for eid in range(40):
        assert s2.read(1, eid) == body(1, eid)
    assert not [n for n in fs.listdir(s2.journal_dir) if n.endswith(PREP_SUFFIX)]
    s2._check()
    await s2.close()


async def test_a_sealed_segment_ending_in_zeros_is_corruption_not_a_tail():
    """Zeros are cut only at the end of the last segment: a sealed one never ends in them."""
    fs = MemFileSystem()
    s = await _store(fs)
    await _fill(s, 20)
    first = _segments(fs, s)[0]
    path = s.journal_path(first)
    s.abandon(JournalFailedError("crash"))
    fh = fs.open_append(path)
    fh.write(bytes(300))
    await fh.sync()
    fh.close()
    with pytest.raises(CorruptRecordError) as info:
        await _store(fs)
    assert info.value.path == path and "not the last one" in str(info.value)


async def test_a_failed_background_preparation_falls_back_to_a_plain_segment():
    fs = MemFileSystem()
    s = await _store(fs)
    fs.fail_next_fsync(path_prefix=s.journal.preparer.prep_path(1))  # the next segment's prep
    await _fill(s, 20)
    stats = s.journal.stats
    assert stats["prealloc_failures"] == 1 and stats["rotations"] >= 2
    assert stats["preallocated"] == stats["rotations"]  # all but segment 1
    assert fs.file_size(s.journal_path(1)) == s.segment_usage()[1][1]
    s2 = await _crash_and_restart(fs, s)
    for eid in range(20):
        assert s2.read(1, eid) == body(1, eid)
    await s2.close()


async def test_no_room_to_preallocate_at_start_gives_a_plain_segment():
    fs = MemFileSystem(capacity=3000)
    s = await _store(fs, StoreConfig(journal_preallocate=True, segment_size=4096))
    assert s.journal.stats["prealloc_failures"] == 1 and s.journal.stats["preallocated"] == 0
    await _fill(s, 5)
    assert not [n for n in fs.listdir(s.journal_dir) if n.endswith(PREP_SUFFIX)]
    s2 = await _crash_and_restart(fs, s, StoreConfig(segment_size=4096))
    for eid in range(5):
        assert s2.read(1, eid) == body(1, eid)
    await s2.close()


async def test_a_full_disk_while_writing_past_the_preallocated_end_fails_only_that_batch():
    """A batch that runs past the preallocated length grows the file; when that hits ENOSPC
    the batch fails (read-only error), nothing is cut from the preallocated file, and once
    there is room again the journal goes on in place."""
    fs = MemFileSystem()
    s = await _store(fs, StoreConfig(journal_preallocate=True, segment_size=1024))
    await _fill(s, 6)  # 6 x 128 B records: 800 of 1024 bytes written in place
    fs.set_capacity(fs._used())  # no byte more
    with pytest.raises(ReadOnlyBookieError):
        await s.add(1, 6, body(1, 6) * 3, KEY)
    assert fs.file_size(s.journal_path(0)) == 1024  # the preallocation is intact
    fs.set_capacity(1 << 30)
    await s.add(1, 6, body(1, 6), KEY)
    s2 = await _crash_and_restart(fs, s)
    for eid in range(7):
        assert s2.read(1, eid) == body(1, eid)
    await s2.close()


async def test_leftover_prepared_files_are_removed_at_start():
    """A prepared file found at start may not have been synced whole: it is deleted, never
    used (with preallocation on or off)."""
    for preallocate in (True, False):
        fs = MemFileSystem()
        s = await _store(fs)
        await _fill(s, 6)  # past half of the active segment: the next one is being made
        assert s.journal.preparer.task is not None
        await s.journal.preparer.task
        assert any(n.endswith(PREP_SUFFIX) for n in fs.listdir(s.journal_dir))
        s.abandon(JournalFailedError("crash"))
        fs.crash("torn")
        s2 = await _store(fs, StoreConfig(journal_preallocate=preallocate, segment_size=1024))
        assert not [n for n in fs.listdir(s2.journal_dir) if n.endswith(PREP_SUFFIX)]
        for eid in range(6):
            assert s2.read(1, eid) == body(1, eid)
        await s2.close()


@pytest.mark.parametrize("zero_fill_below", [1.0, 1e15], ids=["reserved", "zero-filled"])
async def test_fast_journals_reserve_their_next_segments_slow_ones_zero_fill_them(
        zero_fill_below):
    """Zeros written out cost the disk as much as the data: above ``zero_fill_below`` bytes/s
    the next segment's blocks are only reserved. The first segment is always zero-filled.
    Either way the content is the same (MemFileSystem's allocate writes zeros)."""
    fs = MemFileSystem()
    config = StoreConfig(journal_preallocate=True, segment_size=1024,
                         journal_zero_fill_below=zero_fill_below)
    s = await _store(fs, config)
    await _fill(s, 40)
    stats = s.journal.stats
    assert stats["preallocated"] == stats["rotations"] + 1 >= 5
    # (made: the segments in use, and maybe the next one, made ahead already)
    if zero_fill_below < 1e6:  # every segment filled faster than 1 byte/s
        assert stats["zero_filled"] == 1 and stats["allocated"] >= stats["rotations"]
    else:
        assert stats["allocated"] == 0 and stats["zero_filled"] >= stats["rotations"] + 1
    s2 = await _crash_and_restart(fs, s, config)
    for eid in range(40):
        assert s2.read(1, eid) == body(1, eid)
    await s2.close()


@pytest.mark.parametrize("zero_fill_below", [1.0, 1e15], ids=["reserved", "zero-filled"])
async def test_preallocated_segments_on_real_files(tmp_path, zero_fill_below):
    """On OS files (posix_fallocate for reserved segments): rotations through prepared
    files, a restart cuts the active segment's zero tail and reads everything back."""
    from pybk.storage import OsFileSystem

    fs = OsFileSystem(sync_process=True)
    config = StoreConfig(journal_preallocate=True, segment_size=8192,
                         journal_zero_fill_below=zero_fill_below)
    try:
        s = LedgerStore(fs, str(tmp_path), IID, config)
        await s.open()
        await _fill(s, 300)  # 300 x 128 B records: four rotations
        stats = s.journal.stats
        assert stats["preallocated"] == stats["rotations"] + 1 >= 5, stats
        assert stats["allocated" if zero_fill_below < 1e6 else "zero_filled"] >= 4, stats
        active = s.journal_path(s.journal.segment_seq)
        assert fs.file_size(active) == 8192  # preallocated, data ends earlier
        await s.close()
        again = LedgerStore(fs, str(tmp_path), IID, config)
        await again.open()
        assert again.report.zero_tail_bytes > 0 and again.report.torn_tails == 0
        for eid in range(300):
            assert again.read(1, eid) == body(1, eid)
        await again.close()
    finally:
        fs.close()


async def test_zeros_are_synced_a_chunk_at_a_time():
    """A segment's zeros are written and synced chunk by chunk, never more than one chunk
    unsynced: a journal sync then waits behind one chunk's flush at most, not a segment's."""
    fs = MemFileSystem()
    ops: list[tuple[str, str, int]] = []  # (op, path, unsynced bytes before it)

    def hook(op: str, path: str) -> None:
        if path.endswith(PREP_SUFFIX):
            ops.append((op, path, fs.unsynced_bytes()))

    config = StoreConfig(journal_preallocate=True, segment_size=3 * PREP_CHUNK + 100,
                         segment_initial_size=0)  # (the first segment full size)
    fs.fault_hook = hook
    s = await _store(fs, config)  # makes the first segment at start
    writes = [unsynced for op, _path, unsynced in ops if op == "write"]
    syncs = [op for op, _path, _unsynced in ops if op == "sync"]
    assert len(writes) == 5 and len(syncs) == 4  # header + 4 chunks of zeros; 4 syncs
    assert max(writes) <= PREP_CHUNK + SEGMENT_HEADER_SIZE  # never more than a chunk behind
    await _fill(s, 3)
    await s.close()


@pytest.mark.parametrize("preallocate", [True, False])
async def test_segments_start_small_and_grow_with_use(preallocate):
    """The first segment after a start is ``segment_initial_size`` long, each next one twice
    the last up to ``segment_size``; everything reads back after a crash and a restart."""
    fs = MemFileSystem()
    config = StoreConfig(journal_preallocate=preallocate, segment_size=8192,
                         segment_initial_size=1024)
    s = await _store(fs, config)
    await _fill(s, 400)
    seqs = _segments(fs, s)
    sealed = [fs.file_size(s.journal_path(q)) for q in seqs[:-1]]
    assert len(sealed) >= 5
    for i, size in enumerate(sealed):  # rotated once past its own length, by one batch
        want = min(8192, 1024 << i)
        assert want <= size < want + 200, (i, size, sealed)
    s = await _crash_and_restart(fs, s, config)
    for eid in range(400):
        assert s.read(1, eid) == body(1, eid)
    first = s.journal.segment_seq  # a start begins small again
    assert s.journal.size_of(first) == 1024 and s.journal.size_of(first + 9) == 8192
    await s.close()


def test_a_bad_initial_segment_size_is_refused():
    with pytest.raises(ValueError, match="segment_initial_size"):
        StoreConfig(segment_initial_size=-1)
