"""An overlapped journal (``journal_overlap_syncs``) keeps every guarantee of the serial one.

It completes batch k (index updates, answers) while batch k+1 syncs, and splits a big buffer
in two when nothing is waiting to be completed. Still: an add is answered only once the sync
covering it is done (checked by crashing a copy of the disk at the moment of every answer),
exactly once, and a failed sync answers nothing it covers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from pybk.errors import JournalFailedError
from pybk.storage import MemFileSystem
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=9, version=4))
KEY = b"k" * 32
CONFIG = StoreConfig(journal_overlap_syncs=True, journal_overlap_split_min=2)
#: the same over preallocated segments written in place, small enough to rotate often
PREALLOC = StoreConfig(journal_overlap_syncs=True, journal_overlap_split_min=2,
                       journal_preallocate=True, segment_size=1024)
CONFIGS = pytest.mark.parametrize("config", [CONFIG, PREALLOC], ids=["appended", "preallocated"])


def body(lid: int, eid: int) -> bytes:
    return DigestManager(lid).frame(eid, eid - 1, 0, bytes([lid, eid % 256]) * 8)


class ChainedWriters:
    """``writers`` ledgers, each sending its next entry from the previous one's answer (the
    closed loop that makes an overlapped journal run two cohorts)."""

    def __init__(self, store: LedgerStore, fs: MemFileSystem, writers: int, per_writer: int,
                 snapshot: bool = True) -> None:
        self.store, self.fs, self.per_writer, self.snapshot = store, fs, per_writer, snapshot
        self.answers: Counter[tuple[int, int]] = Counter()
        self.errors: dict[tuple[int, int], BaseException] = {}
        #: (disk as a crash at the moment of the answer would leave it, ledger, entry)
        self.crashed_copies: list[tuple[MemFileSystem, int, int]] = []
        self.sent = 0
        self.finished = asyncio.get_running_loop().create_future()
        self.running = writers
        for lid in range(1, writers + 1):
            self.send(lid, 0)

    def send(self, lid: int, eid: int) -> None:
        self.sent += 1
        try:
            self.store.add_entry(lid, eid, body(lid, eid), KEY, False,
                                 lambda exc: self.answered(lid, eid, exc))
        except JournalFailedError as exc:
            self.answered(lid, eid, exc, refused=True)

    def answered(self, lid: int, eid: int, exc: BaseException | None,
                 refused: bool = False) -> None:
        self.answers[(lid, eid)] += 1
        if exc is None:
            if self.snapshot:
                copy = self.fs.clone()
                copy.crash("drop")
                self.crashed_copies.append((copy, lid, eid))
            if eid + 1 < self.per_writer:
                self.send(lid, eid + 1)
                return
        else:
            self.errors[(lid, eid)] = exc
        self.running -= 1
        if not self.running and not self.finished.done():
            self.finished.set_result(None)


async def _store(fs: MemFileSystem, config: StoreConfig = CONFIG) -> LedgerStore:
    s = LedgerStore(fs, "/data", IID, config)
    await s.open()
    return s


@CONFIGS
async def test_every_answer_is_durable_at_the_moment_it_is_given(config):
    fs = MemFileSystem()
    s = await _store(fs, config)
    w = ChainedWriters(s, fs, writers=8, per_writer=6)
    await asyncio.wait_for(w.finished, 10)
    stats = s.journal.stats
    assert stats["splits"] >= 1 and stats["overlapped"] >= 5, stats  # the overlap happened
    if config.journal_preallocate:  # and the segments were written in place
        assert stats["rotations"] >= 2 and stats["preallocated"] == stats["rotations"] + 1
    assert set(w.answers.values()) == {1} and len(w.answers) == w.sent == 48
    assert not w.errors
    for copy, lid, eid in w.crashed_copies:
        # a crash right when the answer went out keeps the entry
        restarted = LedgerStore(copy, "/data", IID, config)
        await restarted.open()
        assert restarted.read(lid, eid) == body(lid, eid), (lid, eid)
        restarted.abandon(JournalFailedError("done"))
    await s.close()


async def test_a_failed_sync_while_overlapping_answers_nothing_it_covers():
    fs = MemFileSystem()
    s = await _store(fs)
    w = ChainedWriters(s, fs, writers=8, per_writer=1000, snapshot=False)
    while s.journal.stats["overlapped"] < 4:  # well into the two-cohort rhythm
        await asyncio.sleep(0)
    acked_before = {k for k in w.answers if k not in w.errors}
    fs.fail_next_fsync()
    await asyncio.wait_for(w.finished, 10)
    assert s.journal.failed is not None
    assert set(w.answers.values()) == {1} and len(w.answers) == w.sent  # each answered once
    failed = set(w.errors)
    assert len(failed) == 8  # every writer's entry in flight got the error...
    assert all(isinstance(e, JournalFailedError) for e in w.errors.values())
    acked = set(w.answers) - failed
    # ...and every success survives the crash (the failed fsync's batch was never answered)
    s.abandon(JournalFailedError("crash"))
    fs.crash("drop")
    restarted = LedgerStore(fs, "/data", IID, CONFIG)
    await restarted.open()
    assert acked >= acked_before
    for lid, eid in acked:
        assert restarted.read(lid, eid) == body(lid, eid)
    await restarted.close()


async def test_a_lone_add_is_not_split_or_delayed():
    fs = MemFileSystem()
    s = await _store(fs)
    for eid in range(3):
        await asyncio.wait_for(s.add(1, eid, body(1, eid), KEY), 5)
    stats = s.journal.stats
    assert stats["splits"] == 0 and stats["overlapped"] == 0
    assert stats["batches"] >= 3  # the master key record may ride with the first entry
    await s.close()


async def test_small_cohorts_merge_back_into_one_batch():
    """Ten writers split into two cohorts of five; three of the first cohort stop early.
    Its remaining two are below ``journal_overlap_split_min`` (4): that batch is answered
    before the next write, its writers' next records join the other cohort's, and from
    then on all seven writers share each batch (serial again: nothing split or overlapped)."""
    fs = MemFileSystem()
    s = LedgerStore(fs, "/data", IID, StoreConfig(journal_overlap_syncs=True,
                                                  journal_overlap_split_min=4))
    await s.open()
    w = ChainedWriters(s, fs, writers=10, per_writer=40, snapshot=False)
    stop_early = {1, 2, 3}
    send = w.send

    def send_unless_stopped(lid: int, eid: int) -> None:
        if lid in stop_early and eid >= 3:
            w.answers[(lid, eid)] += 1  # counted as done: this writer leaves
            w.running -= 1
            return
        send(lid, eid)

    w.send = send_unless_stopped  # type: ignore[method-assign]
    sizes: list[int] = []  # entries per completed batch, in order
    on_synced = s.journal._on_synced

    def record_size(seg: int, tags: list, offsets: list) -> None:  # type: ignore[type-arg]
        sizes.append(sum(1 for tag in tags if tag is not None and tag[3]))
        on_synced(seg, tags, offsets)

    s.journal._on_synced = record_size  # type: ignore[method-assign]
    await asyncio.wait_for(w.finished, 10)
    stats = s.journal.stats
    assert stats["splits"] >= 1 and stats["overlapped"] >= 1  # the cohorts existed
    assert 5 in sizes[:10]  # cohorts of five at first...
    # ...then all seven writers in each batch (the last batch holds only the cohort that was
    # one entry behind: its writers finish one batch after the others)
    assert sizes[-21:-1] == [7] * 20, str(sizes)
    assert not w.errors
    await s.close()


@pytest.mark.parametrize("preallocate", [False, True], ids=["appended", "preallocated"])
@pytest.mark.parametrize("sync_process", [True, False], ids=["helper", "thread"])
async def test_overlapped_journal_on_real_files(tmp_path, sync_process, preallocate):
    """On OS files, through the sync helper or (its fallback) the sync thread, appending or
    writing preallocated segments in place: every add is answered once, and everything
    answered is read back after a restart."""
    from pybk.storage import OsFileSystem

    config = PREALLOC if preallocate else CONFIG
    fs = OsFileSystem(sync_process=sync_process)
    try:
        s = LedgerStore(fs, str(tmp_path), IID, config)
        await s.open()
        w = ChainedWriters(s, fs, writers=16, per_writer=30, snapshot=False)  # type: ignore[arg-type]
        await asyncio.wait_for(w.finished, 30)
        assert set(w.answers.values()) == {1} and not w.errors
        assert s.journal.stats["overlapped"] > 0
        if preallocate:
            assert s.journal.stats["preallocated"] == s.journal.stats["rotations"] + 1 > 2
        await s.close()
        again = LedgerStore(fs, str(tmp_path), IID, config)
        await again.open()
        for lid, eid in w.answers:
            assert again.read(lid, eid) == body(lid, eid)
        await again.close()
    finally:
        fs.close()


@pytest.mark.parametrize("config", [
    StoreConfig(journal_overlap_syncs=True),  # production's thresholds (100 entries)
    StoreConfig(journal_overlap_syncs=True, journal_preallocate=True, segment_size=64 << 10),
], ids=["appended", "preallocated"])
async def test_batched_adds_overlap_by_the_entries_they_hold(config):
    """A batched add goes to the journal as one record holding its whole batch: the
    thresholds count its entries, so clients that batch (every client, at load) get the
    overlapped journal too; counted in records, a buffer of a few batches of 150 never
    reached them and every batch synced serially. Still: each batch is answered once, only
    when it is durable (a crash copy of the disk at each answer keeps it)."""
    fs = MemFileSystem()
    s = await _store(fs, config)
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    answers: Counter[tuple[int, int]] = Counter()
    copies: list[tuple[MemFileSystem, int, int]] = []
    running = 3
    per_batch, batches = 150, 6

    def send(lid: int, k: int) -> None:
        ids = list(range(k * per_batch, (k + 1) * per_batch))
        s.add_batch(lid, ids, [body(lid, e) for e in ids], KEY, False,
                    lambda outcome: answered(lid, k, outcome))

    def answered(lid: int, k: int, outcome: object) -> None:
        nonlocal running
        assert outcome is None, outcome
        answers[(lid, k)] += 1
        copy = fs.clone()
        copy.crash("drop")
        copies.append((copy, lid, (k + 1) * per_batch - 1))
        if k + 1 < batches:
            send(lid, k + 1)
            return
        running -= 1
        if not running:
            finished.set_result(None)

    for lid in (1, 2, 3):
        send(lid, 0)
    await asyncio.wait_for(finished, 10)
    stats = s.journal.stats
    assert stats["overlapped"] >= 3 and stats["splits"] >= 1, stats
    assert set(answers.values()) == {1} and len(answers) == 3 * batches
    for copy, lid, last in copies:
        restarted = LedgerStore(copy, "/data", IID, config)
        await restarted.open()
        assert restarted.read(lid, last) == body(lid, last), (lid, last)
        restarted.abandon(JournalFailedError("done"))
    await s.close()
