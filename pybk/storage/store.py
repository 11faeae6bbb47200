"""LedgerStore: the bookie's storage engine (journal = entry store, plus an index).

The store is put together from one module per concern:

* :mod:`pybk.storage.config`: the knobs (:class:`StoreConfig`);
* :mod:`pybk.storage.startup`: start-up (checkpoint chain, journal replay, leftovers);
* :mod:`pybk.storage.writes`: adds (one entry or a batch), fences, explicit LACs,
  deletions (:mod:`pybk.storage.addbatch`: a batch's admission, journal tag and answer);
* :mod:`pybk.storage.completions`: the journal callbacks that complete them;
* :mod:`pybk.storage.reads`: entries and ledger state answered from the index;
* :mod:`pybk.storage.checkpointer`: the checkpoint chain (bases and deltas);
* :mod:`pybk.storage.compaction`: rewriting mostly-dead segments.

Writes go through the journal (group commit); an entry enters the index only after the fsync
that covers it, so the index never promises what the disk may not have. Checkpoints are the
index plus the journal position it covers, consistent because the journal moves its position
and updates the index in one synchronous step; start-up loads the last one and replays the
segments after it.
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Awaitable, Callable, Container, Iterator
from typing import Any, Final

from pybk.errors import BKError, ReadOnlyBookieError
from pybk.stats import BookieStats
from pybk.storage import compaction
from pybk.storage.checkpoint import CHECKPOINT_FILE
from pybk.storage.checkpointer import DELTA_SKIPS_LEDGER_STATE, Checkpointer
from pybk.storage.compaction import CompactionResult
from pybk.storage.completions import StoreCompletions
from pybk.storage.config import (
    INLINE_SYNC_ALWAYS,
    JOURNAL_DIR,
    MAX_MASTER_KEY_SIZE,
    StoreConfig,
)
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, Position
from pybk.storage.journal import Journal
from pybk.storage.reads import StoreReads
from pybk.storage.records import decode_entry_at
from pybk.storage.segments import SegmentTable
from pybk.storage.startup import ReplayReport, replay
from pybk.storage.writes import AddCallback, BatchCallback, ResolveFuture, StoreWrites
from pybk.wire import parse_entry_header

__all__ = [
    "ACK_BEFORE_FSYNC", "DELTA_SKIPS_LEDGER_STATE", "INLINE_SYNC_ALWAYS",
    "INLINE_SYNC_SKIPS_FSYNC", "JOURNAL_DIR", "MAX_MASTER_KEY_SIZE", "OVERLAP_ACK_BEFORE_SYNC",
    "AddCallback",
    "BKError", "BatchCallback", "CompactionResult", "LedgerStore", "ReplayReport",
    "ResolveFuture", "StoreConfig",
]

# Mutation switches consulted by the store (names in ``StoreConfig.mutations``; the registry
# of every switch is ``pybk.testing.mutations``). Each is a deliberately broken build for
# checker tests. DELTA_SKIPS_LEDGER_STATE is the checkpointer's (re-exported here).
#: the bookie acknowledges an add before the journal fsync that covers it
ACK_BEFORE_FSYNC: Final = "ack_before_fsync"
#: a batch small enough to be synced inline (``journal_inline_sync_max``, as ``pybk bookie``
#: runs) is acknowledged without any fsync
INLINE_SYNC_SKIPS_FSYNC: Final = "inline_sync_skips_fsync"
#: an overlapped journal (``journal_overlap_syncs``) acknowledges a batch as soon as its sync
#: has started, not once it returned
OVERLAP_ACK_BEFORE_SYNC: Final = "overlap_ack_before_sync"


class LedgerStore:
    """See the module docstring. The store owns the state (index, segment table, journal,
    checkpointer, config) and three parts, each given what its job needs: a
    :class:`~pybk.storage.reads.StoreReads`, a :class:`~pybk.storage.writes.StoreWrites`
    and the journal's :class:`~pybk.storage.completions.StoreCompletions`. The reads and
    writes are the parts' own methods, bound on the store once (an add costs no extra call):
    ``add``, ``add_entry``, ``add_batch``, ``fence``, ``write_lac``, ``delete_ledger``;
    ``read``, ``read_many``, ``read_range``, ``compare_held``, ``state``, ``find``,
    ``is_deleted``, ``entry_size``, ``lac``, ``ranges``, ``ledger_ids``, ``journal_path``."""

    def __init__(
        self,
        fs: FileSystem,
        data_dir: str,
        instance_id: str,
        config: StoreConfig | None = None,
        *,
        on_fatal: Callable[[BaseException], None] | None = None,
        on_write_error: Callable[[OSError], None] | None = None,
        on_ledger_change: Callable[[int], None] | None = None,
        watched: Container[int] | None = None,
        stats: BookieStats | None = None,
    ) -> None:
        self.fs = fs
        self.data_dir = data_dir
        self.journal_dir = posixpath.join(data_dir, JOURNAL_DIR)
        self.checkpoint_path = posixpath.join(data_dir, CHECKPOINT_FILE)
        self.instance_id = instance_id
        self.config = config or StoreConfig()
        on_change = on_ledger_change or (lambda lid: None)
        self.index = Index()
        self.report = ReplayReport()
        self.segments = SegmentTable()
        self.checkpointer = Checkpointer(fs, data_dir)
        #: ``path@offset`` of each suspect segment the store started over
        self.suspect: list[str] = []
        #: entries the scrubber found damaged: (ledger, entry) -> what (pybk.storage.scrub)
        self.damaged: dict[tuple[int, int], str] = {}
        #: set when the store opened read-only (disk full at start-up)
        self.read_only_reason = ""
        #: (ledger, entry) -> callbacks of identical adds made while the first was pending:
        #: the writes fill it, the completions answer them
        also_waiting: dict[tuple[int, int], list[AddCallback]] = {}
        # ``watched``: the ledgers whose new entries ``on_ledger_change`` must hear of
        # (someone waits on them), read live; None: every ledger. Fences, LAC writes and
        # deletions always call.
        self._completions = StoreCompletions(self.index, self.segments, also_waiting,
                                             watched, on_change)
        done = self._completions
        self.journal = Journal(
            fs,
            self.journal_dir,
            instance_id,
            on_synced=done.on_synced,
            on_failed=done.on_failed,
            on_fatal=on_fatal or (lambda exc: None),
            on_write_error=on_write_error or (lambda exc: None),
            on_rotate=done.on_rotate,
            max_wait=self.config.journal_max_wait,
            max_batch_bytes=self.config.journal_max_batch_bytes,
            max_batch_count=self.config.journal_max_batch_count,
            segment_size=self.config.segment_size,
            initial_segment_size=self.config.segment_initial_size,
            inline_sync_max=self.config.journal_inline_sync_max,
            overlap_syncs=self.config.journal_overlap_syncs,
            overlap_split_min=self.config.journal_overlap_split_min,
            lazy_wait=self.config.journal_lazy_wait,
            preallocate=self.config.journal_preallocate,
            zero_fill_below=self.config.journal_zero_fill_below,
            ack_before_fsync=ACK_BEFORE_FSYNC in self.config.mutations,
            inline_sync_skips_fsync=INLINE_SYNC_SKIPS_FSYNC in self.config.mutations,
            overlap_ack_before_sync=OVERLAP_ACK_BEFORE_SYNC in self.config.mutations,
            stats=stats,
        )
        reads = self._reads = StoreReads(fs, self.journal_dir, self.index, self.suspect)
        writes = self._writes = StoreWrites(self.index, self.journal, reads.compare_held,
                                            also_waiting, on_change)
        # the public surface: the parts' bound methods, set once (no delegating frame)
        self.add = writes.add
        self.add_entry = writes.add_entry
        self.add_batch = writes.add_batch
        self.fence = writes.fence
        self.write_lac = writes.write_lac
        self.delete_ledger = writes.delete_ledger
        self.read = reads.read
        self.read_many = reads.read_many
        self.read_range = reads.read_range
        self.compare_held = reads.compare_held
        self.state = reads.state
        self.find = reads.find
        self.is_deleted = reads.is_deleted
        self.entry_size = reads.entry_size
        self.lac = reads.lac
        self.ranges = reads.ranges
        self.ledger_ids = reads.ledger_ids
        self.journal_path = reads.journal_path

    # ================================================================== start-up / shut-down

    async def open(self) -> None:
        """Load the checkpoint, replay the journal after it, clean up, open a new segment."""
        done = await replay(self.fs, self.journal_dir, self.instance_id, self.config,
                            self.report, self.checkpointer)
        self.index = done.index  # (before any write: each part is told)
        self._reads.adopt(done.index)
        self._writes.adopt(done.index)
        self._completions.adopt(done.index)
        self.segments.opened(done.segments, done.dead)
        self.suspect.extend(done.suspect)
        try:
            await self.journal.open(done.next_seq)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # Everything replayed is readable; writing needs space. Serve reads only (the
            # half-created segment is dropped as a torn one at the next start).
            self.read_only_reason = (f"disk full at start-up ({exc}): serving reads only; "
                                     "restart the bookie once space is freed")
            self.journal.failed = ReadOnlyBookieError(self.read_only_reason)
            return
        self.segments.started(done.next_seq)
        try:
            await self.checkpoint()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise  # (with ENOSPC the journal still holds everything: replay covers it)

    async def close(self) -> None:
        """Drain the journal, write a final checkpoint, close files."""
        await self.journal.drain()
        try:
            if self.journal.failed is None:
                await self.checkpoint()
        except OSError:
            pass  # the journal holds everything; the next start replays more, that is all
        finally:
            await self.journal.close()

    def abandon(self, exc: BaseException) -> None:
        """Crash: no sync, every pending write fails with ``exc``."""
        self.journal.abandon(exc)

    # ================================================================== checkpoints

    async def checkpoint(self) -> Position:
        """Persist the index with the journal position it covers (atomic file replace)."""
        async with self.checkpointer.lock:
            return await self.checkpoint_under_lock()

    async def checkpoint_under_lock(self) -> Position:
        """:meth:`checkpoint` for a caller holding ``checkpointer.lock`` (compaction)."""
        # the position and the index are taken in one synchronous step (see the docstring)
        return await self.checkpointer.write(self.index, self.journal.position,
                                             self.segments.retiring, self.config)

    @property
    def _cp_pos(self) -> Position | None:
        """The journal position the durable checkpoint covers."""
        return self.checkpointer.pos

    @property
    def checkpoint_stats(self) -> dict[str, int]:
        return self.checkpointer.stats

    # ================================================================== compaction

    def segment_usage(self) -> dict[int, tuple[int, int]]:
        """seq -> (live bytes, file bytes) for the sealed segments."""
        return compaction.segment_usage(self)

    async def compact(self, threshold: float | None = None, *,
                      pace: Callable[[int], Awaitable[None]] | None = None,
                      ) -> CompactionResult:
        """Rewrite sealed segments whose live fraction is below ``threshold`` (default: the
        config's), awaiting ``pace(nbytes)`` after each (a throttle); see
        :mod:`pybk.storage.compaction`. Safe against a crash at any step."""
        return await compaction.compact(
            self, self.config.compaction_threshold if threshold is None else threshold, pace)

    # ================================================================== scrubbing

    def scrub_items(self) -> Iterator[tuple[int, int, int, object]]:
        """(ledger, entry, bytes, where) of every entry held now, in index order (the
        scrubber's walk: :class:`pybk.storage.scrub.Scrubber`)."""
        for lid in self.ledger_ids():
            st = self.index.get(lid)
            if st is None:
                continue
            for eid, loc in st.entries.items():
                yield lid, int(eid), loc[2], loc

    def scrub_check(self, ledger_id: int, entry_id: int, where: Any) -> int | None:
        """Verify one entry where :meth:`scrub_items` found it: the bytes read, or None when
        it is gone or moved since (deleted, compacted, repaired). Damage raises
        CorruptRecordError (or OSError: a latent read error)."""
        st = self.index.get(ledger_id)
        if st is None or st.entries.get(entry_id) != where:
            return None
        seg, off, size = where
        path = self.journal_path(seg)
        decode_entry_at(self.fs.pread(path, off, size), path, off, ledger_id, entry_id)
        return int(size)

    # ================================================================== invariants

    def _check(self) -> None:
        """Assert the store's invariants (stateful tests)."""
        self.index._check()
        self.journal._check()
        for lid, st in self.index.ledgers.items():
            for eid, body in st.pending_items():
                assert parse_entry_header(body)[:2] == (lid, eid)
                assert eid not in st.entries, (lid, eid)
        assert self.journal.segment_seq in self.segments or self.journal.failed is not None
        for seq in self.index.seg_live:
            assert seq in self.segments, f"live entries in unknown segment {seq}"
