"""Journal group commit, fsync failure, rotation; LedgerStore replay (torn tail vs corruption)."""

from __future__ import annotations

import asyncio
import errno
import struct
import uuid

import pytest

from pybk.errors import BookieStateError, CorruptRecordError, JournalFailedError
from pybk.storage import FileHandle, MemFileSystem
from pybk.storage.journal import Journal, parse_segment_name, segment_name
from pybk.storage.records import SEGMENT_HEADER_SIZE, encode_batch, encode_fence
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=99, version=4))


class GatedHandle(FileHandle):
    """Wraps a handle so a test decides when each sync completes."""

    def __init__(self, inner: FileHandle) -> None:
        self.inner = inner
        self.path = inner.path
        self.gate = asyncio.Event()
        self.writes: list[int] = []
        self.syncs = 0

    def write(self, data):  # type: ignore[no-untyped-def]
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


async def make_journal(fs: MemFileSystem, **kw) -> tuple[Journal, list, list]:  # type: ignore[no-untyped-def]
    synced: list = []
    fatal: list = []
    fs.makedirs("/j")
    def on_synced(seg: int, tags: list, offsets: list) -> None:  # type: ignore[type-arg]
        synced.extend(zip(tags, offsets[:-1], strict=True))  # (tag, start offset)

    j = Journal(fs, "/j", IID, on_synced=on_synced,
                on_failed=lambda tags, exc: None, on_fatal=fatal.append,
                on_write_error=lambda exc: None, **kw)
    await j.open(0)
    return j, synced, fatal


async def test_lone_append_is_written_at_once_and_acked_after_sync():
    fs = MemFileSystem()
    j, synced, _ = await make_journal(fs, max_wait=10.0)
    gated = GatedHandle(j._fh)
    j._fh = gated
    fut = j.append(encode_fence(1), tag="t")
    for _ in range(3):
        await asyncio.sleep(0)
    assert gated.writes and not fut.done()  # written without waiting for max_wait
    gated.gate.set()
    await asyncio.wait_for(fut, 5)
    assert synced and synced[0][0] == "t"
    await j.close()


async def test_appends_of_one_iteration_share_a_batch_and_later_ones_form_the_next():
    fs = MemFileSystem()
    j, _, _ = await make_journal(fs, max_wait=0.0)
    gated = GatedHandle(j._fh)
    j._fh = gated
    first = [j.append(encode_fence(i)) for i in range(10)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(gated.writes) == 1  # one write for the 10, sync pending
    second = [j.append(encode_fence(i)) for i in range(10, 30)]
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(gated.writes) == 1  # the next batch waits for the sync: serial group commit
    gated.gate.set()
    await asyncio.wait_for(asyncio.gather(*first, *second), 5)
    assert len(gated.writes) == 2 and gated.syncs == 2
    await j.close()


async def test_on_synced_offsets_locate_each_item_in_its_segment():
    """The completion hands the batch's tags and where each item starts: the bytes there are
    the item, for tagged and untagged items, over several batches and segment rotations."""
    fs = MemFileSystem()
    seen: list[tuple[int, object, int]] = []
    fs.makedirs("/j")
    j = Journal(fs, "/j", IID,
                on_synced=lambda seg, tags, offsets: seen.extend(
                    (seg, tag, off) for tag, off in zip(tags, offsets[:-1], strict=True)
                    if tag is not None),
                on_failed=lambda tags, exc: None, on_fatal=lambda exc: None,
                on_write_error=lambda exc: None, segment_size=120, max_batch_count=3)
    await j.open(0)
    records = {i: encode_fence(i) + bytes(i % 4) for i in range(12)}  # varied sizes
    futs = [j.append(rec, tag=i if i % 3 else None) for i, rec in records.items()]
    await asyncio.wait_for(asyncio.gather(*futs), 5)
    await j.close()
    assert [tag for _seg, tag, _off in seen] == [i for i in records if i % 3]
    assert len({seg for seg, _tag, _off in seen}) > 1  # rotated: offsets are per segment
    for seg, tag, off in seen:
        rec = records[tag]  # type: ignore[index]
        assert fs.read_file(j.segment_path(seg))[off:off + len(rec)] == rec


async def test_gathering_continues_while_appends_keep_arriving():
    fs = MemFileSystem()
    j, _, _ = await make_journal(fs, max_wait=10.0)
    gated = GatedHandle(j._fh)
    gated.gate.set()
    j._fh = gated

    await asyncio.sleep(0)  # let the writer go idle
    # two appends in one iteration wake the writer; then one more arrives every iteration:
    # the writer keeps gathering until an iteration brings nothing new
    futs = [j.append(encode_fence(0)), j.append(encode_fence(1))]
    for i in range(2, 8):
        await asyncio.sleep(0)
        futs.append(j.append(encode_fence(i)))
    await asyncio.wait_for(asyncio.gather(*futs), 5)
    assert len(gated.writes) == 1, gated.writes
    await j.close()


async def test_batch_limits_split_batches():
    fs = MemFileSystem()
    j, _, _ = await make_journal(fs, max_wait=0.0, max_batch_count=4)
    gated = GatedHandle(j._fh)
    gated.gate.set()
    j._fh = gated
    await asyncio.gather(*(j.append(encode_fence(i)) for i in range(10)))
    assert len(gated.writes) == 3
    await j.close()


async def test_fsync_failure_fails_every_covered_and_later_append():
    fs = MemFileSystem()
    j, synced, fatal = await make_journal(fs)
    fs.fail_next_fsync(errno.EIO)
    futs = [j.append(encode_fence(i), tag=("x", i)) for i in range(5)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(r, JournalFailedError) for r in results)
    assert fatal and "fsync" in str(fatal[0]) and not synced
    late = j.append(encode_fence(9))
    with pytest.raises(JournalFailedError):
        await late
    await j.close()


async def test_rotation_creates_new_segments():
    fs = MemFileSystem()
    j, _, _ = await make_journal(fs, segment_size=200)
    for i in range(20):
        await j.append(encode_fence(i))
    await j.close()
    names = fs.listdir("/j")
    assert len(names) > 3 and all(parse_segment_name(n) is not None for n in names)
    assert j.position.seg == j.segment_seq == len(names) - 1


def test_segment_names():
    assert segment_name(255) == "00000000000000ff.seg"
    assert parse_segment_name("00000000000000ff.seg") == 255
    assert parse_segment_name("index.ckpt") is None
    assert parse_segment_name("zzzzzzzzzzzzzzzz.seg") is None


# --------------------------------------------------------------------------- replay


def frame(lid: int, eid: int) -> bytes:
    return DigestManager(lid).frame(eid, eid - 1, 0, b"payload-%d" % eid)


async def new_store(fs: MemFileSystem, **kw) -> LedgerStore:  # type: ignore[no-untyped-def]
    s = LedgerStore(fs, "/d", IID, StoreConfig(**kw))
    await s.open()
    return s


async def filled_store(fs: MemFileSystem, n: int = 4) -> tuple[LedgerStore, str]:
    s = await new_store(fs)
    for e in range(n):
        await s.add(1, e, frame(1, e), b"k")
    path = s.journal_path(s.journal.segment_seq)
    return s, path


@pytest.mark.parametrize("tail", [b"\x00" * 300, b"garbage!" * 10, "torn"])
async def test_torn_tail_is_truncated_and_counted(tail):
    """Garbage or a torn batch is a torn tail; zeros (unused preallocated space, or the room
    of a lost batch) are cut too but counted apart: they are not damage."""
    fs = MemFileSystem()
    s, path = await filled_store(fs)
    s.abandon(JournalFailedError("crash"))
    if tail == "torn":
        tail = encode_batch(4, encode_fence(7))[:-3]
    fh = fs.open_append(path)
    fh.write(tail)
    await fh.sync()
    fh.close()
    size = fs.file_size(path)
    s2 = await new_store(fs)
    if tail.count(0) == len(tail):
        assert s2.report.torn_tails == 0 and s2.report.zero_tail_bytes == len(tail)
    else:
        assert s2.report.torn_tails == 1 and s2.report.torn_bytes == len(tail)
        assert s2.report.zero_tail_bytes == 0
    assert fs.file_size(path) == size - len(tail)
    for e in range(4):
        assert s2.read(1, e) == frame(1, e)
    s2._check()
    await s2.close()


@pytest.mark.parametrize("preallocate", [True, False], ids=["zero-tail", "torn-tail"])
async def test_a_tail_cut_whose_sync_failed_is_made_durable_by_the_next_start(preallocate):
    """Start 1 cuts the last segment's tail but the sync of the cut fails: it refuses to run.
    Start 2 (no crash between) reads the cut file: it must make the cut durable before it
    creates a newer segment, or a crash brings the tail back behind that segment, where it
    reads as corruption and the bookie never starts again (found by the simulator)."""
    config = StoreConfig(journal_preallocate=preallocate, segment_size=4096)
    fs = MemFileSystem()
    s = LedgerStore(fs, "/data", IID, config)
    await s.open()
    for e in range(4):
        await s.add(1, e, frame(1, e), b"k")
    path = s.journal_path(s.journal.segment_seq)
    s.abandon(JournalFailedError("crash"))
    if not preallocate:  # a torn batch at the end
        fh = fs.open_append(path)
        fh.write(encode_batch(4, encode_fence(7))[:-3])
        await fh.sync()
        fh.close()
    fs.crash("drop")
    fs.fail_next_fsync(path_prefix=path)
    with pytest.raises(OSError):
        await LedgerStore(fs, "/data", IID, config).open()
    cut = fs.file_size(path)  # start 1 cut it (in the page cache)
    s2 = LedgerStore(fs, "/data", IID, config)
    await s2.open()
    await s2.add(1, 4, frame(1, 4), b"k")
    assert s2.journal.segment_seq > s2.index.ledgers[1].location(0)[0]  # a newer segment
    s2.abandon(JournalFailedError("crash"))
    fs.crash("torn")
    assert fs.file_size(path) == cut, "the tail came back behind a newer segment"
    s3 = LedgerStore(fs, "/data", IID, config)
    await s3.open()
    for e in range(5):
        assert s3.read(1, e) == frame(1, e)
    await s3.close()


async def test_mid_log_corruption_refuses_to_start():
    fs = MemFileSystem()
    s, path = await filled_store(fs)
    loc = s.index.ledgers[1].location(1)
    assert loc is not None
    s.abandon(JournalFailedError("crash"))
    fs.delete("/d/index.ckpt")
    fs.flip_bit(path, loc.offset + loc.size - 2)
    with pytest.raises(CorruptRecordError) as info:
        await new_store(fs)
    assert info.value.path == path
    assert "followed by a valid batch" in str(info.value)


async def test_corruption_in_an_older_segment_refuses_to_start():
    fs = MemFileSystem()
    s = await new_store(fs, segment_size=300)
    for e in range(12):
        await s.add(1, e, frame(1, e), b"k")
    loc = s.index.ledgers[1].location(0)
    assert loc is not None
    s.abandon(JournalFailedError("crash"))
    fs.delete("/d/index.ckpt")
    path = s.journal_path(loc.seg)
    fs.flip_bit(path, fs.file_size(path) - 1)  # last batch of a sealed segment
    with pytest.raises(CorruptRecordError, match="not the last one"):
        await new_store(fs)


async def test_torn_segment_header_of_last_segment_is_dropped():
    fs = MemFileSystem()
    s, _ = await filled_store(fs)
    await s.close()
    fh = fs.open_append("/d/journal/" + segment_name(50))
    fh.write(b"PYBK")
    await fh.sync()
    fh.close()
    s2 = await new_store(fs)
    assert not fs.exists("/d/journal/" + segment_name(50))
    assert s2.read(1, 3) == frame(1, 3)
    await s2.close()


async def test_segment_of_unknown_version_refuses_to_start():
    fs = MemFileSystem()
    s, path = await filled_store(fs)
    await s.close()
    data = bytearray(fs.read_file(path))
    struct.pack_into(">H", data, 8, 7)
    fs.delete(path)
    fs.delete("/d/index.ckpt")
    fh = fs.open_append(path)
    fh.write(bytes(data))
    await fh.sync()
    fh.close()
    with pytest.raises(CorruptRecordError, match="unknown journal format version 7"):
        await new_store(fs)


async def test_segment_of_another_instance_is_refused():
    fs = MemFileSystem()
    s, _ = await filled_store(fs)
    await s.close()
    other = LedgerStore(fs, "/d", str(uuid.UUID(int=5, version=4)))
    with pytest.raises(BookieStateError, match="another bookie"):
        await other.open()


async def test_corrupt_checkpoint_rebuilds_from_segments():
    fs = MemFileSystem()
    s, _ = await filled_store(fs)
    await s.fence(1, b"k")
    await s.close()
    fs.flip_bit("/d/index.ckpt", 30)
    s2 = await new_store(fs)
    assert not s2.report.checkpoint_loaded and "checksum" in s2.report.checkpoint_error
    assert s2.index.ledgers[1].fenced
    assert [s2.read(1, e) for e in range(4)] == [frame(1, e) for e in range(4)]
    await s2.close()


async def test_checkpoint_beyond_the_journal_is_corruption():
    fs = MemFileSystem()
    s, path = await filled_store(fs)
    await s.close()
    fs.truncate(path, SEGMENT_HEADER_SIZE + 10)
    with pytest.raises(CorruptRecordError):
        await new_store(fs)


async def test_read_range_returns_held_entries_and_raises_on_damage():
    fs = MemFileSystem()
    s = await new_store(fs)
    for e in (0, 1, 2, 5, 6):
        await s.add(1, e, frame(1, e), b"k")
    assert s.read_range(1, 1, 5) == [(1, frame(1, 1)), (2, frame(1, 2)), (5, frame(1, 5))]
    assert s.read_range(1, 7, 9) == []
    loc = s.index.ledgers[1].location(2)
    assert loc is not None
    fs.flip_bit(s.journal_path(loc.seg), loc.offset + loc.size - 1)
    with pytest.raises(CorruptRecordError):
        s.read_range(1, 0, 6)
    await s.close()


async def test_compaction_crash_after_checkpoint_before_delete_is_finished_at_start():
    from pybk.storage.fs import SimulatedCrash

    fs = MemFileSystem()
    s = await new_store(fs, segment_size=300)
    for e in range(12):
        await s.add(1, e, frame(1, e), b"k")
        await s.add(2, e, frame(2, e), b"k")
    await s.delete_ledger(2)
    await s.fence(1, b"k")
    before = fs.listdir("/d/journal")

    def hook(op: str, path: str) -> None:
        if op == "delete" and path.endswith(".seg"):
            raise SimulatedCrash(path)

    fs.fault_hook = hook
    with pytest.raises(SimulatedCrash):
        await s.compact(0.9)
    fs.fault_hook = None
    s.abandon(JournalFailedError("crash"))
    fs.crash("drop")
    s2 = await new_store(fs)
    assert s2.report.leftovers_removed  # the retired segments named by the checkpoint
    after = fs.listdir("/d/journal")
    assert len(after) < len(before)
    assert [s2.read(1, e) for e in range(12)] == [frame(1, e) for e in range(12)]
    assert s2.index.ledgers[1].fenced and s2.index.is_deleted(2)
    s2._check()
    await s2.close()


async def test_no_room_to_rotate_keeps_the_current_segment():
    fs = MemFileSystem()
    errors: list = []
    fs.makedirs("/j")
    j = Journal(fs, "/j", IID, on_synced=lambda seg, tags, offsets: None,
                on_failed=lambda tags, exc: None, on_fatal=errors.append,
                on_write_error=errors.append, segment_size=100)
    await j.open(0)
    used = fs.capacity - fs.disk_usage("/")[0]
    fs.set_capacity(used + 80)  # room for one batch, not for a new segment on top
    await j.append(encode_fence(1) * 3)
    await j.drain()
    assert errors and not isinstance(errors[0], JournalFailedError)
    assert j.failed is None and fs.listdir("/j") == [segment_name(0)]
    fs.set_capacity(1 << 30)
    await j.append(encode_fence(2))  # rotation retried after this batch
    await j.close()
    assert fs.listdir("/j") == [segment_name(0), segment_name(1)]
