"""Index checkpoints after a base are deltas holding only what changed: small, chained by
generation and sequence number, and the base plus its deltas is exactly the index at the last
one's position. A damaged or missing link is damage (the index is rebuilt from the segments);
a delta of an older base is never applied; a checkpoint that was not written makes the next
one a base."""

from __future__ import annotations

import errno
from typing import Any

import pytest
from storage_kit import CHAIN, CONFIG, KEY, body, fill, open_store

from pybk.storage import MemFileSystem
from pybk.storage.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointEncoder,
    decode_checkpoint,
    delta_checkpoint_name,
    parse_delta_checkpoint_name,
)
from pybk.storage.entryindex import EntryColumns, Loc
from pybk.storage.index import Index, Position
from pybk.storage.store import LedgerStore, StoreConfig


def _state(index: Index) -> dict[int, Any]:
    """Everything an index says, in comparable form."""
    return {
        lid: (st.master_key, st.fenced, st.explicit_lac, st.explicit_lac_body,
              st.max_piggyback_lac, st.entries.items())
        for lid, st in index.ledgers.items()
    } | {"seg_live": dict(index.seg_live), "deleted": index.deleted.ranges()}


def _written_ids(cols: EntryColumns, rows: list[tuple[int, Loc]]) -> list[int]:
    """The entry ids a checkpoint file holds for one ledger (dense slots and rows)."""
    return sorted([cols.first + i for i, size in enumerate(cols.sizes) if size]
                  + [eid for eid, _loc in rows])


def _deltas(fs: MemFileSystem) -> list[tuple[int, int]]:
    return sorted(d for d in map(parse_delta_checkpoint_name, fs.listdir("/data"))
                  if d is not None)


async def _reopen(fs: MemFileSystem, s: LedgerStore,
                  config: StoreConfig = CONFIG) -> LedgerStore:
    """A clean stop (which checkpoints), then a start."""
    await s.close()
    return await open_store(fs, config)


def test_delta_names_round_trip_and_nothing_else_parses():
    assert parse_delta_checkpoint_name(delta_checkpoint_name(7, 3)) == (7, 3)
    for name in (CHECKPOINT_FILE, CHECKPOINT_FILE + ".tmp", delta_checkpoint_name(7, 3) + ".tmp",
                 "index.ckpt.zz00000000000007.00000003", "journal", "x.ckpt.0.1"):
        assert parse_delta_checkpoint_name(name) is None, name


async def test_after_the_base_a_checkpoint_holds_only_the_changed_ledgers_and_entries():
    fs = MemFileSystem()
    s = await open_store(fs)
    for lid in range(1, 6):
        await fill(s, lid, range(60))
    await s.checkpoint()  # a delta on start-up's (empty) base: everything since
    await s.checkpoint()  # that delta outweighs the base: a new base
    assert (s.checkpoint_stats["bases"], s.checkpoint_stats["deltas"]) == (2, 1)
    await fill(s, 3, range(60, 63))
    await s.fence(4, KEY)
    base_bytes = fs.file_size("/data/" + CHECKPOINT_FILE)
    await s.checkpoint()
    assert s.checkpoint_stats["deltas"] == 2
    gen, seq = _deltas(fs)[-1]
    delta = decode_checkpoint(fs.read_file("/data/" + delta_checkpoint_name(gen, seq)), "d")
    assert [(lid, _written_ids(cols, rows)) for lid, _st, cols, rows in delta.ledgers] == [
        (3, [60, 61, 62]), (4, [])]
    assert delta.ledgers[1][1].fenced
    assert fs.file_size("/data/" + delta_checkpoint_name(gen, seq)) < base_bytes / 10
    expected = _state(s.index)
    again = await _reopen(fs, s)  # (the stop writes one more delta)
    assert again.report.checkpoint_loaded and again.report.checkpoint_deltas == 2
    assert again.report.records_replayed == 0  # the chain covered the whole journal
    assert _state(again.index) == expected
    assert again.read(3, 62) == body(3, 62)
    await again.close()


async def test_a_start_on_a_good_chain_continues_it_with_a_delta():
    """Start-up's checkpoint (after replay) extends the chain it loaded: a restart costs what
    replay added, not a rewrite of the whole index."""
    fs = MemFileSystem()
    s = await open_store(fs, CHAIN)
    for lid in (1, 2):
        await fill(s, lid, range(50))
    await s.checkpoint()
    await fill(s, 2, range(50, 55))  # after the last checkpoint: replayed at the next start
    await s.journal.drain()
    s.abandon(RuntimeError("crash"))
    again = await open_store(fs, CHAIN)
    assert again.report.checkpoint_deltas == 1 and again.report.records_replayed == 5
    assert again.checkpoint_stats["bases"] == 0 and again.checkpoint_stats["deltas"] == 1
    gen, seq = _deltas(fs)[-1]
    delta = decode_checkpoint(fs.read_file("/data/" + delta_checkpoint_name(gen, seq)), "d")
    assert [(lid, _written_ids(cols, rows)) for lid, _st, cols, rows in delta.ledgers] == [
        (2, [50, 51, 52, 53, 54])]
    expected = _state(again.index)
    third = await _reopen(fs, again, CHAIN)
    assert _state(third.index) == expected and third.report.records_replayed == 0
    await third.close()


async def test_moves_deletions_keys_and_lacs_travel_in_deltas():
    fs = MemFileSystem()
    s = await open_store(fs, CHAIN)
    for lid in (1, 2, 3):
        await fill(s, lid, range(40))
    await s.checkpoint()
    await s.delete_ledger(2)
    await s.write_lac(1, 30, b"lac-body", KEY)
    await fill(s, 9, range(3))  # a ledger new since the last checkpoint
    result = await s.compact(threshold=1.0)  # moves live entries to new segments (deltas)
    assert result.entries_moved > 0
    expected = _state(s.index)
    again = await _reopen(fs, s, CHAIN)
    assert s.checkpoint_stats["bases"] == 1  # compaction's checkpoints were deltas too
    assert again.report.records_replayed == 0 and again.report.checkpoint_deltas >= 3
    assert _state(again.index) == expected
    assert again.index.is_deleted(2) and 2 not in again.index.ledgers
    assert again.index.ledgers[1].explicit_lac_body == b"lac-body"
    for lid in (1, 3):
        assert again.read(lid, 39) == body(lid, 39)
    await again.close()


async def test_a_new_base_once_the_deltas_add_up_and_old_deltas_go():
    fs = MemFileSystem()
    config = StoreConfig(segment_size=4096, checkpoint_delta_ratio=0.5, checkpoint_max_deltas=64)
    s = await open_store(fs, config)
    await fill(s, 1, range(100))
    await s.checkpoint()  # delta of 100 entries
    await s.checkpoint()  # ... and now a base: the first delta was bigger than half the base
    base_gen = s.checkpointer._gen
    assert s.checkpoint_stats["bases"] == 2 and s.checkpoint_stats["deltas"] == 1
    assert _deltas(fs) == []  # the old base's deltas are gone
    for i in range(3):
        await fill(s, 1, range(100 + i, 101 + i))
        await s.checkpoint()
    assert _deltas(fs) == [(base_gen, 1), (base_gen, 2), (base_gen, 3)]
    few = StoreConfig(segment_size=4096, checkpoint_max_deltas=3)
    s.config = few
    await s.checkpoint()  # the fourth would exceed the count: a base
    assert _deltas(fs) == [] and s.checkpointer._gen == base_gen + 1
    expected = _state(s.index)
    again = await _reopen(fs, s, few)
    assert _state(again.index) == expected
    await again.close()


@pytest.mark.parametrize("damage", ["bit-flip", "missing-link", "wrong-name"])
async def test_a_damaged_chain_rebuilds_the_index_from_the_segments(damage):
    fs = MemFileSystem()
    s = await open_store(fs, CHAIN)
    for step in range(3):
        await fill(s, 1, range(20 * step, 20 * step + 20))
        await s.checkpoint()
    expected = _state(s.index)
    await s.journal.drain()
    s.abandon(RuntimeError("stop without the closing checkpoint"))
    gen, _seq = _deltas(fs)[0]
    path = "/data/" + delta_checkpoint_name(gen, 2)
    if damage == "bit-flip":
        fs.flip_bit(path, 40)
    elif damage == "missing-link":
        fs.delete(path)
    else:  # a file that claims to be delta 2 but holds delta 3
        fs.delete(path)
        fs.rename("/data/" + delta_checkpoint_name(gen, 3), path)
    await fs.fsync_dir("/data")
    again = await open_store(fs)
    assert not again.report.checkpoint_loaded and again.report.checkpoint_error
    assert _state(again.index) == expected  # rebuilt from every segment
    assert again.read(1, 59) == body(1, 59)
    assert _deltas(fs) == []  # start-up's base replaced the broken chain
    await again.close()


async def test_a_delta_of_an_older_base_is_never_applied():
    fs = MemFileSystem()
    one_delta = StoreConfig(segment_size=4096, checkpoint_delta_ratio=1e9,
                            checkpoint_max_deltas=1)
    s = await open_store(fs, one_delta)
    await fill(s, 1, range(10))
    await s.checkpoint()  # a delta on start-up's base
    old_gen = s.checkpointer._gen
    await s.checkpoint()  # the count is reached: a new base, a newer generation
    new_gen = s.checkpointer._gen
    assert new_gen > old_gen and _deltas(fs) == []
    # what a crash after the new base, before the older base's deltas were deleted, leaves:
    # here deltas that would fence and delete ledger 1 if they were applied
    other = Index()
    other.ledger(1).fenced = True
    other.delete_ledger(1)
    for seq in (1, 2):
        stale = CheckpointEncoder(other, Position(0, 0, 0), generation=old_gen, seq=seq,
                                  written={}).result()
        await fs.write_file_atomic("/data/" + delta_checkpoint_name(old_gen, seq), stale)
    await fill(s, 1, range(10, 20))
    await s.checkpoint()  # a delta of the new generation
    assert _deltas(fs) == [(old_gen, 1), (old_gen, 2), (new_gen, 1)]
    s.abandon(RuntimeError("crash"))
    again = await open_store(fs, one_delta)
    assert again.report.checkpoint_loaded and again.report.checkpoint_deltas == 1
    st = again.index.ledgers[1]
    assert not st.fenced and not again.index.is_deleted(1) and len(st.entries) == 20
    assert again.read(1, 19) == body(1, 19)
    assert all(gen != old_gen for gen, _seq in _deltas(fs))  # removed at start-up
    await again.close()


async def test_a_half_written_delta_is_ignored_and_removed():
    fs = MemFileSystem()
    s = await open_store(fs, CHAIN)
    await fill(s, 1, range(10))
    await s.checkpoint()
    gen, seq = _deltas(fs)[-1]
    # a crash while writing the next delta leaves its temporary file (never renamed)
    tmp = "/data/" + delta_checkpoint_name(gen, seq + 1) + ".tmp"
    fs.open_append(tmp).write(b"half a delta")
    await fs.fsync_dir("/data")
    await s.journal.drain()
    s.abandon(RuntimeError("crash"))
    again = await open_store(fs, CHAIN)
    assert again.report.checkpoint_loaded and again.report.checkpoint_deltas == 1
    assert len(again.index.ledgers[1].entries) == 10 and not fs.exists(tmp)
    await again.close()


@pytest.mark.parametrize("failure", ["enospc", "eio"])
async def test_a_checkpoint_that_was_not_written_makes_the_next_one_a_base(failure):
    fs = MemFileSystem()
    s = await open_store(fs, CHAIN)
    await fill(s, 1, range(30))
    await s.checkpoint()
    await fill(s, 1, range(30, 40))
    if failure == "enospc":
        fs.set_capacity(fs._used())
    else:
        fs.fail_next_fsync(errno.EIO, path_prefix="/data/" + CHECKPOINT_FILE)
    with pytest.raises(OSError):
        await s.checkpoint()  # its snapshot counted entries 30..39 as checkpointed
    fs.set_capacity(1 << 30)
    bases = s.checkpoint_stats["bases"]
    await s.checkpoint()
    assert s.checkpoint_stats["bases"] == bases + 1  # not a delta missing 30..39
    expected = _state(s.index)
    await s.journal.drain()
    s.abandon(RuntimeError("crash"))
    fs.crash("drop")
    again = await open_store(fs, CHAIN)
    assert again.report.checkpoint_loaded and again.report.records_replayed == 0
    assert _state(again.index) == expected
    await again.close()


def test_an_encoder_for_a_delta_needs_the_metas_it_follows():
    with pytest.raises(ValueError, match="metas"):
        CheckpointEncoder(Index(), Position(0, 0, 0), generation=1, seq=1)
