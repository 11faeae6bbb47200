"""Offline inspection of a data directory (``pybk.bookie.inspect``, ``pybk bookie inspect``): it
reads only, finds every kind of damage a start-up would refuse or repair, and says a sound
directory is sound."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from pybk.bookie import Bookie, BookieConfig
from pybk.bookie.inspect import inspect_data_dir
from pybk.cli import main
from pybk.errors import ReadOnlyBookieError
from pybk.storage import OsFileSystem
from pybk.storage.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointEncoder,
    delta_checkpoint_name,
    delta_checkpoints,
)
from pybk.storage.index import Index
from pybk.storage.journal import segment_name
from pybk.wire import Status

MUTATIONS = ("write", "create", "rename", "delete", "truncate", "fsync_dir")
#: checkpoints stay deltas (the chain is what some tests damage)
CHAIN = BookieConfig(disk_check_interval=0, checkpoint_interval=0, checkpoint_delta_ratio=1e9)


async def _busy(harness) -> None:  # type: ignore[no-untyped-def]
    """Entries in three ledgers over several segments, a fence, a LAC, a deletion, a
    compaction and a chain of checkpoints."""
    for lid in (1, 2, 3):
        for eid in range(25):
            assert await harness.add(lid, eid) == Status.OK
        await harness.bookie.checkpoint()
    await harness.bookie.store.fence(2, harness.KEY)
    await harness.bookie.store.write_lac(1, 20, b"lac", harness.KEY)
    await harness.bookie.delete_ledger(3)
    await harness.bookie.compact(threshold=1.0)
    await harness.bookie.checkpoint()


async def _stopped_with_segments(harness_cls):  # type: ignore[no-untyped-def]
    """A stopped bookie whose 30 entries of ledger 1 fill several small segments."""
    h = harness_cls(config=BookieConfig(disk_check_interval=0, checkpoint_interval=0,
                                        segment_size=1024))
    await h.start()
    for eid in range(30):
        assert await h.add(1, eid) == Status.OK
    await h.bookie.stop()
    return h


async def test_a_sound_directory_is_reported_sound_and_left_untouched(harness_cls):
    h = harness_cls(config=BookieConfig(disk_check_interval=0, checkpoint_interval=0,
                                        segment_size=2048))
    await h.start()
    await _busy(h)
    await h.bookie.stop()
    before = {op: h.fs.counters[op] for op in MUTATIONS}
    files = {name: h.fs.read_file(f"{h.DATA_DIR}/{name}") for name in h.fs.listdir(h.DATA_DIR)
             if name != "journal"}
    report = inspect_data_dir(h.fs, h.DATA_DIR)
    assert report.ok, report.problems
    assert {op: h.fs.counters[op] for op in MUTATIONS} == before  # it only read
    assert files == {name: h.fs.read_file(f"{h.DATA_DIR}/{name}") for name in files}
    assert report.bookie_id == "b1" and report.instance_id
    assert len(report.segments) >= 2 and all(s.state in ("ok", "zero tail")
                                              for s in report.segments)
    assert (report.ledgers, report.fenced, report.deleted, report.entries) == (2, 1, 1, 50)
    assert sum(s.records.get("ENTRY", 0) for s in report.segments) == 50  # the live, moved
    cp = report.checkpoint
    assert cp.state == "ok" and cp.deltas >= 1 and cp.entries == 50 and not cp.detail


async def test_a_torn_tail_after_a_crash_is_not_a_problem(harness):
    for eid in range(10):
        assert await harness.add(1, eid) == Status.OK
    last = harness.bookie.store.journal.segment_seq
    path = f"{harness.DATA_DIR}/journal/{segment_name(last)}"
    harness.bookie.crash()
    fh = harness.fs.open_append(path)
    fh.write(b"\x00\x00\x01\x00half a batch")  # what a crash mid-write leaves
    await fh.sync()
    report = inspect_data_dir(harness.fs, harness.DATA_DIR)
    assert report.ok, report.problems
    assert report.segments[-1].state == "torn tail" and report.entries == 10


async def test_a_flipped_bit_in_a_sealed_segment_is_corruption(harness_cls):
    h = await _stopped_with_segments(harness_cls)
    path = f"{h.DATA_DIR}/journal/{segment_name(0)}"
    h.fs.flip_bit(path, 200)
    report = inspect_data_dir(h.fs, h.DATA_DIR)
    assert not report.ok and report.segments[0].state == "corrupt"
    assert path in report.problems[0] and "offset" in report.problems[0]
    assert report.checkpoint.detail.startswith("not compared")


async def _stopped_with_a_delta(harness_cls):  # type: ignore[no-untyped-def]
    """A stopped bookie with 5 entries of ledger 1, checkpointed as a delta; and the journal
    position that delta names."""
    harness = harness_cls(config=CHAIN)
    await harness.start()
    for eid in range(5):
        assert await harness.add(1, eid) == Status.OK
    await harness.bookie.checkpoint()
    position = harness.bookie.store.journal.position
    await harness.bookie.stop()
    return harness, position


async def test_a_damaged_checkpoint_delta_is_reported(harness_cls):
    harness, _ = await _stopped_with_a_delta(harness_cls)
    gen, seq = delta_checkpoints(harness.fs, harness.DATA_DIR)[-1]
    harness.fs.flip_bit(f"{harness.DATA_DIR}/{delta_checkpoint_name(gen, seq)}", 30)
    report = inspect_data_dir(harness.fs, harness.DATA_DIR)
    assert report.checkpoint.state == "damaged" and "checksum" in report.checkpoint.detail
    assert len(report.problems) == 1 and report.entries == 5  # the segments are fine


async def test_a_checkpoint_that_disagrees_with_the_segments_is_reported(harness_cls):
    harness, store_pos = await _stopped_with_a_delta(harness_cls)
    # a well-formed next delta that puts entry 0 of ledger 1 where no record is
    gen, seq = delta_checkpoints(harness.fs, harness.DATA_DIR)[-1]
    lie = Index()
    lie.ledger(1).master_key = harness.KEY
    lie.put_entry(1, 0, (0, 12345, 60), 3)
    data = CheckpointEncoder(lie, store_pos, generation=gen, seq=seq + 1, written={}).result()
    await harness.fs.write_file_atomic(
        f"{harness.DATA_DIR}/{delta_checkpoint_name(gen, seq + 1)}", data)
    report = inspect_data_dir(harness.fs, harness.DATA_DIR)
    assert not report.ok and "ledger 1: entries differ" in report.checkpoint.detail


async def test_checkpointed_live_bytes_that_disagree_with_the_entries_are_reported(
        harness_cls):
    harness, store_pos = await _stopped_with_a_delta(harness_cls)
    # a well-formed next delta that changes no ledger but says segment 0 holds 1 live byte
    gen, seq = delta_checkpoints(harness.fs, harness.DATA_DIR)[-1]
    lie = Index()
    lie.seg_live = {0: 1}
    data = CheckpointEncoder(lie, store_pos, generation=gen, seq=seq + 1, written={}).result()
    await harness.fs.write_file_atomic(
        f"{harness.DATA_DIR}/{delta_checkpoint_name(gen, seq + 1)}", data)
    report = inspect_data_dir(harness.fs, harness.DATA_DIR)
    assert not report.ok and "live bytes of segment 0: 1, but its entries add up to" in (
        report.checkpoint.detail)


async def test_a_missing_cookie_and_a_foreign_segment_are_reported(harness_cls):
    a, b = harness_cls(), harness_cls(seed=8)
    for h in (a, b):
        await h.start()
        assert await h.add(1, 0) == Status.OK
        await h.bookie.stop()
    # b's first segment put in a's directory: another instance's data
    a.fs.makedirs(f"{a.DATA_DIR}/journal")
    foreign = b.fs.read_file(f"{b.DATA_DIR}/journal/{segment_name(0)}")
    fh = a.fs.open_append(f"{a.DATA_DIR}/journal/{segment_name(7)}")
    fh.write(foreign)
    await fh.sync()
    report = inspect_data_dir(a.fs, a.DATA_DIR)
    assert report.segments[-1].state == "foreign"
    assert any("belongs to bookie instance" in p for p in report.problems)
    a.fs.delete(f"{a.DATA_DIR}/COOKIE")
    report = inspect_data_dir(a.fs, a.DATA_DIR)
    assert any("no cookie" in p for p in report.problems)


async def test_pybk_bookie_inspect_on_real_files(tmp_path):
    data = str(tmp_path / "b1")
    fs = OsFileSystem()
    bookie = Bookie("b1", data, fs=fs, config=BookieConfig(
        disk_check_interval=0, checkpoint_interval=0, segment_size=1024),
        rng=random.Random(1))
    await bookie.start()
    from pybk.wire import DigestManager, master_key
    for eid in range(20):
        await bookie.add(1, eid, master_key(b"pw"), DigestManager(1).frame(eid, eid - 1, 0,
                                                                          b"x" * 50))
    await bookie.stop()
    fs.close()
    runner = CliRunner()
    result = runner.invoke(main, ["bookie", "inspect", data])
    assert result.exit_code == 0, result.output
    assert "sound" in result.output and "20 entries" in result.output
    result = runner.invoke(main, ["bookie", "inspect", "--json", data])
    assert result.exit_code == 0, (result.output, result.exception)
    doc = json.loads(result.output)
    assert doc["ok"] and doc["entries"] == 20 and doc["checkpoint"]["state"] == "ok"
    seg0 = tmp_path / "b1" / "journal" / segment_name(0)
    raw = bytearray(seg0.read_bytes())
    raw[150] ^= 0x10
    seg0.write_bytes(bytes(raw))
    result = runner.invoke(main, ["bookie", "inspect", data])
    assert result.exit_code == 1
    assert "pybk: error: 1 problem(s)" in result.output and "corrupt" in result.output


async def test_a_checkpoint_pointing_into_a_missing_segment_is_reported(harness_cls):
    h = await _stopped_with_segments(harness_cls)
    h.fs.delete(f"{h.DATA_DIR}/journal/{segment_name(1)}")  # an operator's "cleanup"
    report = inspect_data_dir(h.fs, h.DATA_DIR)
    assert not report.ok
    assert "missing segments [1]" in report.checkpoint.detail


async def test_a_deletion_whose_record_was_not_written_may_stay_in_the_chain(harness_cls):
    """A deletion takes effect in memory when its record is appended (adds are refused at
    once), so a checkpoint taken after its write failed (ENOSPC) holds a deletion the
    segments lack: more than the segments, like a fence, and not a problem. A deletion the
    chain lacks is one."""
    h = harness_cls(config=CHAIN)
    await h.start()
    for eid in range(5):
        assert await h.add(5, eid) == Status.OK
    used = h.fs.disk_usage(h.DATA_DIR)
    h.fs.set_capacity(used[1] - used[0])  # (total - free: full from here on)
    with pytest.raises(ReadOnlyBookieError, match="ENOSPC"):
        await h.bookie.store.delete_ledger(5)
    h.fs.set_capacity(1 << 40)
    assert h.bookie.store.index.is_deleted(5)
    await h.bookie.checkpoint()
    await h.bookie.stop()
    report = inspect_data_dir(h.fs, h.DATA_DIR)
    assert report.ok, report.problems
    assert report.deleted == 0 and report.ledgers == 1  # (the segments' story)
    # the other way round: a chain that forgot a deletion the segments hold
    await h.start()
    await h.bookie.delete_ledger(5)
    store = h.bookie.store
    await h.bookie.stop()
    gen, _seq = delta_checkpoints(h.fs, h.DATA_DIR)[-1]
    forgot = Index()  # a new base that holds ledger 5 as live
    forgot.ledger(5).master_key = h.KEY
    data = CheckpointEncoder(forgot, store.journal.position, generation=gen + 1).result()
    await h.fs.write_file_atomic(f"{h.DATA_DIR}/{CHECKPOINT_FILE}", data)
    report = inspect_data_dir(h.fs, h.DATA_DIR)
    assert not report.ok
    assert "ledger 5: not deleted, but the segments hold its deletion" in report.checkpoint.detail
