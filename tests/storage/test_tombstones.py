"""A deleted ledger leaves only its id behind (``Index.deleted``, compact ranges), and that is
enough: every later add, fence, LAC write and read is refused, across checkpoints (base and
delta), rebuilds from the segments and compaction, and checkpoints no longer cost anything
per deleted ledger. Version 2 checkpoints (tombstones as flagged ledgers) still load."""

from __future__ import annotations

import struct

import crc32c
import pytest
from storage_kit import CHAIN, KEY, body, fill, open_store

from pybk.errors import CorruptRecordError, LedgerFencedError, NoSuchLedgerError
from pybk.storage import MemFileSystem
from pybk.storage.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_MAGIC,
    CheckpointEncoder,
    decode_checkpoint,
    delta_checkpoint_name,
    load_checkpoint_chain,
)
from pybk.storage.index import Index, Position
from pybk.storage.records import (
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
    iter_records,
)
from pybk.storage.replay import apply_record
from pybk.storage.store import LedgerStore, StoreConfig

BASES = StoreConfig(segment_size=4096, checkpoint_max_deltas=0)





def _drop_checkpoints(fs: MemFileSystem) -> None:
    for name in fs.listdir("/data"):
        if name.startswith(CHECKPOINT_FILE):
            fs.delete("/data/" + name)


async def _assert_refused(s: LedgerStore, lid: int) -> None:
    with pytest.raises(LedgerFencedError, match="deleted"):
        await s.add(lid, 99, body(lid, 99), KEY)
    with pytest.raises(NoSuchLedgerError, match="deleted"):
        await s.fence(lid, KEY)
    with pytest.raises(LedgerFencedError, match="deleted"):
        await s.write_lac(lid, 0, b"lac", KEY)
    with pytest.raises(NoSuchLedgerError, match="deleted"):
        s.read(lid, 0)
    assert lid not in s.index.ledgers and lid not in s.ledger_ids()


@pytest.mark.parametrize("way_back", ["base", "delta", "rebuild"])
async def test_a_deleted_ledger_leaves_only_its_id_and_stays_refused(way_back: str) -> None:
    fs = MemFileSystem()
    config = BASES if way_back == "base" else CHAIN
    s = await open_store(fs, config)
    for lid in range(30):
        await fill(s, lid, range(3))
    if way_back == "delta":
        await s.checkpoint()  # the deletions below then travel in deltas
    for lid in range(1, 30):
        await s.delete_ledger(lid)
    await s.fence(40, KEY)  # a deletion of a ledger held only as a fence
    await s.delete_ledger(40)
    await s.delete_ledger(31)  # and of one this bookie never held
    assert sorted(s.index.ledgers) == [0]  # no state left behind for any deleted ledger
    assert s.index.deleted.ranges() == [(1, 29), (31, 31), (40, 40)]
    assert set(s.index.seg_live.values()) == {sum(len(body(0, e)) + 9 for e in range(3))}
    for lid in (1, 29, 31, 40):
        await _assert_refused(s, lid)
    s.index._check()
    if way_back == "rebuild":
        await s.journal.drain()
        s.abandon(RuntimeError("stop without the closing checkpoint"))
        _drop_checkpoints(fs)
        await fs.fsync_dir("/data")
        again = await open_store(fs)
        assert not again.report.checkpoint_loaded
    else:
        await s.close()
        again = await open_store(fs, config)
        assert again.report.checkpoint_loaded and again.report.records_replayed == 0
        assert (again.report.checkpoint_deltas > 0) == (way_back == "delta")
    assert sorted(again.index.ledgers) == [0]
    assert again.index.deleted.ranges() == [(1, 29), (31, 31), (40, 40)]
    for lid in (1, 29, 31, 40):
        await _assert_refused(again, lid)
    assert [again.read(0, e) for e in range(3)] == [body(0, e) for e in range(3)]
    again.index._check()
    await again.close()


async def test_checkpoints_cost_nothing_per_deleted_ledger() -> None:
    index = Index()
    for lid in range(5000):
        index.ledger(lid).master_key = KEY
        index.put_entry(lid, 0, (0, lid * 100, 100), -1)
    for lid in range(5000):
        index.delete_ledger(lid)
    base = CheckpointEncoder(index, Position(1, 0, 0), generation=1)
    data = base.result()
    cp = decode_checkpoint(data, "base")
    assert cp.ledgers == [] and cp.deleted.ranges() == [(0, 4999)]
    assert len(data) < 100  # a header and one range, whatever the number of deletions
    index.delete_ledger(7000)
    delta = CheckpointEncoder(index, Position(1, 10, 1), generation=1, seq=1,
                              written=base.metas).result()
    d = decode_checkpoint(delta, "delta")
    assert d.ledgers == [] and d.deleted.ranges() == [(7000, 7000)] and len(delta) < 100
    d.apply_to(back := cp.build_index())
    assert back.deleted.ranges() == [(0, 4999), (7000, 7000)] and not back.ledgers


async def test_compaction_carries_a_deletion_while_older_segments_hold_the_ledger() -> None:
    """Segment 0 keeps ledger 1's entries (ledger 2's keep it mostly live) after ledger 1's
    DELETE record's segment is compacted away: the DELETE must move on with it, or a rebuild
    from the segments would bring ledger 1 back."""
    fs = MemFileSystem()
    s = await open_store(fs)
    await fill(s, 1, range(4))
    eid = 0
    while s.journal.segment_seq == 0:
        await fill(s, 2, range(eid, eid + 1))
        eid += 1
    deletion_seg = s.journal.segment_seq
    await s.delete_ledger(1)
    n = 0
    while s.journal.segment_seq == deletion_seg:  # fill the DELETE's segment with garbage
        await fill(s, 3, range(n, n + 1))
        n += 1
    await s.delete_ledger(3)
    result = await s.compact(threshold=0.5)
    assert deletion_seg in result.segments_compacted and 0 not in result.segments_compacted
    assert fs.exists(s.journal_path(0)) and not fs.exists(s.journal_path(deletion_seg))
    await s.journal.drain()
    s.abandon(RuntimeError("stop without the closing checkpoint"))
    _drop_checkpoints(fs)
    await fs.fsync_dir("/data")
    again = await open_store(fs)  # rebuilt from the segments left
    assert not again.report.checkpoint_loaded
    assert again.index.deleted.ranges() == [(1, 1), (3, 3)]
    await _assert_refused(again, 1)
    assert [again.read(2, e) for e in range(eid)] == [body(2, e) for e in range(eid)]
    again.index._check()
    await again.close()


def _v2_checkpoint(ledgers: list[tuple[int, int, bytes, list[tuple[int, int, int, int]]]],
                   seq: int = 0) -> bytes:
    """A version-2 file (a base, or delta ``seq`` of generation 1) as pybk wrote it before
    deleted ledgers became ranges: ``ledgers`` are (id, flags, key, entries as (id, seg,
    offset, size)); flag 2 was "deleted"."""
    payload = struct.pack(">BQIQQQII", 1 if seq else 0, 1, seq, 1, 500 + seq, 3 + seq, 0,
                          len(ledgers))
    for lid, flags, key, entries in ledgers:
        payload += struct.pack(">qBqqHI", lid, flags, -1, -1, len(key), 0) + key
        payload += struct.pack(">I", len(entries))
        payload += b"".join(struct.pack(">qQQI", *e) for e in entries)
    return struct.pack(">8sHIQ", CHECKPOINT_MAGIC, 2, crc32c.crc32c(payload),
                       len(payload)) + payload


def test_a_version_2_checkpoint_loads_with_its_tombstones_as_ids() -> None:
    data = _v2_checkpoint([(1, 4, KEY, [(0, 0, 40, 80), (1, 0, 120, 80)]), (2, 2 | 4, KEY, []),
                           (3, 2, b"", [])])
    cp = decode_checkpoint(data, "old")
    index = cp.build_index()
    assert sorted(index.ledgers) == [1] and index.deleted.ranges() == [(2, 3)]
    assert index.ledgers[1].entries.items() == [(0, (0, 40, 80)), (1, (0, 120, 80))]
    assert cp.position == Position(1, 500, 3)
    index._check()


async def test_a_version_2_chain_loads_without_a_rebuild() -> None:
    """An upgrade: a version-2 base and delta (which moves an entry, adds two and deletes a
    ledger) load as the same index a version-3 chain would give, live bytes summed."""
    fs = MemFileSystem()
    fs.makedirs("/data")
    await fs.write_file_atomic("/data/" + CHECKPOINT_FILE, _v2_checkpoint(
        [(1, 4, KEY, [(0, 0, 40, 80), (1, 0, 120, 80)]), (2, 4, KEY, [(0, 0, 200, 90)])]))
    await fs.write_file_atomic("/data/" + delta_checkpoint_name(1, 1), _v2_checkpoint(
        [(1, 4, KEY, [(1, 1, 0, 80), (2, 1, 80, 70), (3, 1, 150, 70)]), (2, 2 | 4, KEY, [])],
        seq=1))
    chain = load_checkpoint_chain(fs, "/data")
    index = chain.index
    assert chain.deltas == 1 and chain.last.position == Position(1, 501, 4)
    assert index.ledgers[1].entries.items() == [(0, (0, 40, 80)), (1, (1, 0, 80)),
                                               (2, (1, 80, 70)), (3, (1, 150, 70))]
    assert index.deleted.ranges() == [(2, 2)] and sorted(index.ledgers) == [1]
    assert index.seg_live == {0: 80, 1: 220}
    index._check()


def test_a_checkpoint_that_holds_a_deleted_ledger_is_damage() -> None:
    index = Index()
    index.ledger(5).master_key = KEY
    index.deleted.add(5)  # (what no store does: a damaged file's story)
    data = CheckpointEncoder(index, Position(0, 0, 0)).result()
    with pytest.raises(CorruptRecordError, match="both held and deleted"):
        decode_checkpoint(data, "cp")
    # the version-3 layout has no "deleted" flag any more: a well-checksummed file with one
    held = Index()
    held.ledger(6)
    payload = bytearray(CheckpointEncoder(held, Position(0, 0, 0)).result()[22:])
    payload[45 + 8] |= 2  # (the ledger's flags: after the 45-byte head and its id)
    crc = crc32c.crc32c(bytes(payload), crc32c.crc32c(struct.pack(">8sHQ", CHECKPOINT_MAGIC, 3,
                                                                  len(payload))))
    flagged = struct.pack(">8sHIQ", CHECKPOINT_MAGIC, 3, crc, len(payload)) + bytes(payload)
    with pytest.raises(CorruptRecordError, match="flagged deleted"):
        decode_checkpoint(flagged, "cp")


async def test_a_delta_that_holds_a_ledger_its_chain_deleted_is_damage() -> None:
    fs = MemFileSystem()
    fs.makedirs("/data")
    index = Index()
    index.ledger(5).master_key = KEY
    base = CheckpointEncoder(index, Position(0, 0, 0), generation=1)
    await fs.write_file_atomic("/data/" + CHECKPOINT_FILE, base.result())
    index.delete_ledger(5)
    first = CheckpointEncoder(index, Position(0, 10, 1), generation=1, seq=1,
                              written=base.metas)
    await fs.write_file_atomic("/data/" + delta_checkpoint_name(1, 1), first.result())
    stale = Index()
    stale.ledger(5).fenced = True  # a delta written for an index that still held ledger 5
    await fs.write_file_atomic("/data/" + delta_checkpoint_name(1, 2), CheckpointEncoder(
        stale, Position(0, 20, 2), generation=1, seq=2, written=first.metas).result())
    with pytest.raises(CorruptRecordError, match="does not follow its chain"):
        load_checkpoint_chain(fs, "/data")


def test_replayed_records_of_a_deleted_ledger_do_nothing() -> None:
    """Replay after a checkpoint can meet a ledger's fence, key or LAC records written before
    the deletion the checkpoint already holds: they must not bring the ledger back."""
    index = Index()
    index.delete_ledger(7)
    records = (encode_master_key(7, KEY) + encode_fence(7) + encode_explicit_lac(7, 3, b"x")
               + body_record(7, 0))
    for rec in iter_records(records, 0, "seg"):
        apply_record(index, rec, 0)
    assert not index.ledgers and index.deleted.ranges() == [(7, 7)] and not index.seg_live
    index._check()


def body_record(lid: int, eid: int) -> bytes:
    return encode_entry(body(lid, eid))
