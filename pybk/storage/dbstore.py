"""DbLedgerStore: a storage engine in the manner of BookKeeper's DbLedgerStorage.

The journal stays the durability log (an add is answered after the fsync that covers it),
but it is not where entries live: a durable entry goes to a *write cache* (per ledger, per
entry), and each checkpoint flushes the cache, sorted by (ledger, entry), into a new entry
log (:mod:`pybk.storage.entrylogs`) with its on-disk location index, then writes the
checkpoint file (ledger metadata, the logs' summaries, the journal position it covers) and
deletes the journal segments before that position. Start-up loads the checkpoint and replays
the journal from its mark, so nothing acknowledged is lost at a crash.

Two write caches, as BookKeeper's: a flush takes the cache (still read from while flushed)
and adds fill a new one; the flush's file work runs off the event loop
(:meth:`FileSystem.offload`), adds are held when the new cache fills too
(:mod:`pybk.storage.dbwrites`), and the checkpoint names only the journal position the
flushed cache covers. Deleting a ledger drops it from every log's summary;
:meth:`DbLedgerStore.compact` rewrites logs whose live fraction is low (docs/internals.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import posixpath
from collections.abc import Awaitable, Callable, Container, Iterator
from itertools import groupby
from typing import Any, Final

from pybk.errors import BookieStateError, CorruptRecordError
from pybk.stats import BookieStats
from pybk.storage.compaction import CompactionResult
from pybk.storage.config import JOURNAL_DIR, StoreConfig
from pybk.storage.dbledgers import DbLedgers
from pybk.storage.dbreads import DbReads
from pybk.storage.dbwrites import DbCompletions, DbWrites
from pybk.storage.entrylogs import (
    LOG_FORMAT,
    EntryLogs,
    Run,
    summary_from_json,
    summary_to_json,
)
from pybk.storage.fs import FileSystem
from pybk.storage.index import Position
from pybk.storage.journal import Journal, parse_segment_name, segment_name
from pybk.storage.records import Record
from pybk.storage.replay import scan_segment
from pybk.storage.startup import ReplayReport, check_header

__all__ = ["DB_CHECKPOINT", "DB_COMPACTION_COVERS_CACHE", "DB_LOG_UNSYNCED",
           "DB_READS_UNCHECKED", "ENTRY_LOG_DIR", "DbLedgerStore"]

log = logging.getLogger(__name__)

DB_CHECKPOINT = "db-checkpoint"
ENTRY_LOG_DIR = "entrylogs"
#: mutation switch (a name in ``StoreConfig.mutations``): a flush names its entry log in the
#: checkpoint (and trims the journal) without having synced the log
DB_LOG_UNSYNCED: Final = "db_log_unsynced"
#: mutation switch: a compaction's checkpoint names the journal's end, as if the write cache
#: were in the entry logs (the journal before it is trimmed at the next start: lost at a crash)
DB_COMPACTION_COVERS_CACHE: Final = "db_compaction_covers_cache"
#: mutation switch: reads trust the entry logs' rows and bodies without their checksums
DB_READS_UNCHECKED: Final = "db_reads_unchecked"


def _sorted_run(item: tuple[int, dict[int, bytes]]) -> Run:
    """One ledger's cached entries as an entry log run, ids ascending (they were cached in
    that order unless a writer sent them out of it)."""
    lid, entries = item
    eids = list(entries)
    ordered = sorted(eids)  # (linear on ids already in order)
    if ordered != eids:
        return lid, ordered, list(map(entries.__getitem__, ordered))
    return lid, eids, list(entries.values())


class DbLedgerStore:
    """See the module docstring. The store owns the journal, the entry logs, the checkpoint
    state and the ledger table (:class:`~pybk.storage.dbledgers.DbLedgers`: per-ledger state
    and the write cache), and three parts given that table: a
    :class:`~pybk.storage.dbreads.DbReads`, a :class:`~pybk.storage.dbwrites.DbWrites` and the
    journal's :class:`~pybk.storage.dbwrites.DbCompletions`. The reads and writes are the
    parts' own methods, bound on the store once (as :class:`~pybk.storage.store.LedgerStore`
    does)."""

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
        self._on_write_error = on_write_error or (lambda exc: None)
        self.data_dir = data_dir
        self.journal_dir = posixpath.join(data_dir, JOURNAL_DIR)
        self.instance_id = instance_id
        self.config = config or StoreConfig()
        on_change = on_ledger_change or (lambda lid: None)
        self.logs = EntryLogs(fs, posixpath.join(data_dir, ENTRY_LOG_DIR),
                              self.config.db_read_ahead_bytes,
                              skip_sync=DB_LOG_UNSYNCED in self.config.mutations,
                              unchecked=DB_READS_UNCHECKED in self.config.mutations)
        table = self._table = DbLedgers(self.logs)
        done = DbCompletions(table, on_change, self.config.db_write_cache_bytes,
                             self._cache_full)
        self.report = ReplayReport()
        self.suspect: list[str] = []
        self.damaged: dict[tuple[int, int], str] = {}
        self.read_only_reason = ""
        self._cp_lock = asyncio.Lock()
        self._next_log = 0
        self._cp_stats = {"bases": 0, "deltas": 0, "flushes": 0, "entries_flushed": 0,
                          "compaction_damage": 0}
        self._flush_task: asyncio.Task[object] | None = None
        self._in_flush = False
        #: the journal position the entry logs cover (the last checkpoint's): what is after
        #: it may be only in the write cache, so a checkpoint that flushes nothing names it
        self._covered = Position(0, 0, 0)
        c = self.config
        self.journal = Journal(
            fs, self.journal_dir, instance_id,
            on_synced=done.on_synced, on_failed=done.on_failed,
            on_fatal=on_fatal or (lambda exc: None),
            on_write_error=self._on_write_error,
            max_wait=c.journal_max_wait, max_batch_bytes=c.journal_max_batch_bytes,
            max_batch_count=c.journal_max_batch_count, segment_size=c.segment_size,
            initial_segment_size=c.segment_initial_size,
            inline_sync_max=c.journal_inline_sync_max, overlap_syncs=c.journal_overlap_syncs,
            overlap_split_min=c.journal_overlap_split_min, preallocate=c.journal_preallocate,
            zero_fill_below=c.journal_zero_fill_below, lazy_wait=c.journal_lazy_wait,
            stats=stats,
        )
        reads = DbReads(table, self.suspect)
        writes = self._writes = DbWrites(table, self.journal, on_change, self._both_full)
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
        self.state = reads.state
        self.find = reads.find
        self.is_deleted = reads.is_deleted
        self.entry_size = reads.entry_size
        self.lac = reads.lac
        self.ranges = reads.ranges
        self.ledger_ids = reads.ledger_ids

    @property
    def cache_bytes(self) -> int:
        """The memory the write cache holds."""
        return self._table.cache_bytes

    @property
    def flushing_now(self) -> bool:
        """A flush of the write cache is in flight (its checkpoint not yet written): a
        background one (the cache passed its bound) or a checkpoint's."""
        return self._in_flush

    @property
    def adds_held(self) -> int:
        """Adds ever held because both write caches were full."""
        return self._writes.held_count

    def _both_full(self) -> bool:
        return self.flushing_now and self._table.cache_bytes > self.config.db_write_cache_bytes

    @property
    def checkpoint_path(self) -> str:
        return posixpath.join(self.data_dir, DB_CHECKPOINT)

    # ================================================================== start-up / shut-down

    async def open(self) -> None:
        """Load the checkpoint, drop unnamed entry logs, replay the journal from the mark."""
        fs = self.fs
        fs.makedirs(self.journal_dir)
        pos = self._load_checkpoint()
        self.report.leftovers_removed.extend(self.logs.remove_unnamed())
        seqs = sorted(s for s in (parse_segment_name(n) for n in fs.listdir(self.journal_dir))
                      if s is not None)
        for seq in seqs:
            path = posixpath.join(self.journal_dir, segment_name(seq))
            if pos is not None and seq < pos.seg:
                fs.delete(path)  # covered by the checkpoint; the crash came before the delete
                self.report.leftovers_removed.append(path)
                continue
            start = pos.offset if pos is not None and seq == pos.seg else None
            if fs.file_size(path) == 0 and seq == seqs[-1]:
                fs.delete(path)
                continue
            if start is None:
                check_header(fs, path, seq, self.instance_id)
            scan = scan_segment(
                fs, path, seq, self.instance_id, start=start,
                batch_seq=pos.batch_seq if start is not None and pos is not None else 0,
                is_last=seq == seqs[-1], allow_suspect=self.config.allow_suspect_segments,
                apply=self._replayed)
            self.report.segments_scanned += 1
            self.report.records_replayed += scan.records
            if scan.corruption is not None:
                self.suspect.append(f"{path}@{scan.corruption.offset}")
            if scan.torn_bytes or scan.zero_tail:
                self.report.torn_tails += bool(scan.torn_bytes)
                self.report.torn_bytes += scan.torn_bytes
                fs.truncate(path, scan.end)
                fh = fs.open_append(path)
                try:
                    await fh.sync()
                finally:
                    fh.close()
        await self.journal.open(max([*seqs, -1]) + 1)
        await self.checkpoint()

    def _load_checkpoint(self) -> Position | None:
        if not self.fs.exists(self.checkpoint_path):
            return None
        try:
            doc = json.loads(self.fs.read_file(self.checkpoint_path))
        except ValueError as exc:
            raise CorruptRecordError(f"{self.checkpoint_path}: unreadable ({exc})",
                                     path=self.checkpoint_path, offset=0) from None
        if doc.get("format", 1) != LOG_FORMAT:
            raise BookieStateError(
                f"{self.checkpoint_path}: entry logs of format {doc.get('format', 1)}, this "
                f"version reads format {LOG_FORMAT} (rows with checksums): start the bookie "
                "with an empty data directory and let auto-recovery copy its ledgers back")
        self.report.checkpoint_loaded = True
        self._next_log = doc["next_log"]
        for log_id, summary in doc["logs"].items():
            self.logs.add(summary_from_json(int(log_id), summary))
        self._table.load(doc)
        if doc["pos"] is None:
            return None
        self._covered = Position(*doc["pos"])
        return self._covered

    def _replayed(self, rec: Record, seg: int) -> None:
        self._table.apply(rec)

    async def close(self) -> None:
        """Let a background flush end, drain the journal, flush and checkpoint, close files."""
        while self._flush_task is not None and not self._flush_task.done():
            await asyncio.wait([self._flush_task])
        await self.journal.drain()
        try:
            if self.journal.failed is None:
                await self.checkpoint()
        except OSError:
            pass  # the journal holds everything; the next start replays it
        finally:
            await self.journal.close()

    def abandon(self, exc: BaseException) -> None:
        """Crash: no sync, every pending write fails with ``exc``."""
        if self._flush_task is not None:
            self._flush_task.cancel()
        self._writes.fail_held(exc)
        self.journal.abandon(exc)

    # ================================================================== checkpoints

    def _cache_full(self) -> None:
        """The write cache passed its bound: flush it (one flush at a time)."""
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """A flush of a full cache. A disk error keeps the cache (the next flush retries it;
        the journal still holds it) and goes to the bookie (ENOSPC: read-only)."""
        try:
            await self.checkpoint()
        except OSError as exc:
            self._on_write_error(exc)

    async def checkpoint(self) -> Position:
        """Flush the write cache into a new entry log, write the checkpoint file naming it
        and the journal position it covers, then delete the journal segments before it.
        Adds held meanwhile (both caches full) run once it ends, also when it fails."""
        async with self._cp_lock:
            self._in_flush = settled = True
            try:
                return await self._flush_cache()
            except asyncio.CancelledError:  # (a crash: the adds held have failed already)
                settled = False
                raise
            finally:
                self._in_flush = False
                if settled:
                    self._writes.release()

    async def _flush_cache(self) -> Position:
        pos = self.journal.position
        flushing = self._table.take_cache()
        meta = self._table.dump()
        if flushing:
            log_id = self._next_log
            self._next_log += 1
            # (the ledgers listed here, on the loop: a deletion meanwhile drops one from
            # ``flushing``, never changes one's entries, which the write reads off it)
            runs = [(lid, flushing[lid]) for lid in sorted(flushing)]
            info = await self.logs.write(log_id, map(_sorted_run, runs))
            for lid in list(info.ledgers):
                if self.is_deleted(lid):  # deleted while it was being flushed
                    del info.ledgers[lid]
            self.logs.add(info)
            self._cp_stats["flushes"] += 1
            self._cp_stats["entries_flushed"] += sum(map(len, flushing.values()))
        await self._write_checkpoint(pos, meta)
        self.logs.remove_unnamed()  # (logs of deleted ledgers, once no longer named)
        self._table.flushed(flushing)
        self._cp_stats["bases"] += 1
        self._drop_segments(pos.seg)
        return pos

    async def _write_checkpoint(self, pos: Position, meta: dict[str, Any]) -> None:
        doc = {"format": LOG_FORMAT, "pos": list(pos), "next_log": self._next_log,
               "logs": {str(i): summary_to_json(info) for i, info in self.logs.logs.items()},
               **meta}
        await self.fs.write_file_atomic(self.checkpoint_path, json.dumps(doc).encode())
        self._covered = pos

    def _drop_segments(self, before: int) -> None:
        for name in self.fs.listdir(self.journal_dir):
            seq = parse_segment_name(name)
            if seq is not None and seq < before and seq != self.journal.segment_seq:
                self.fs.delete(posixpath.join(self.journal_dir, name))

    @property
    def checkpoint_stats(self) -> dict[str, int]:
        return self._cp_stats

    # ================================================================== garbage collection

    def segment_usage(self) -> dict[int, tuple[int, int]]:
        """log id -> (live bytes, file bytes) of the entry logs."""
        return {i: (info.live, info.size) for i, info in self.logs.logs.items()}

    async def compact(self, threshold: float | None = None, *,
                      pace: Callable[[int], Awaitable[None]] | None = None,
                      ) -> CompactionResult:
        """Rewrite entry logs whose live fraction is below ``threshold`` into one new log,
        checkpoint (naming the new log, not the old ones), then delete the old ones."""
        limit = self.config.compaction_threshold if threshold is None else threshold
        result = CompactionResult()
        async with self._cp_lock:
            victims = [i for i, info in sorted(self.logs.logs.items())
                       if info.size and info.live < limit * info.size]
            live: dict[tuple[int, int], bytes] = {}  # (a newer log's copy replaces an older)
            for i in list(victims):
                try:
                    live.update(((lid, eid), body) for lid, eid, body in self.logs.live_items(i))
                except CorruptRecordError as exc:  # never copied under a fresh checksum:
                    victims.remove(i)  # the log stays until the entry is repaired
                    self._cp_stats["compaction_damage"] += 1
                    log.warning("compaction leaves entry log %d: %s", i, exc)
            if not victims:
                return result
            items = sorted(live.items())
            log_id = self._next_log
            self._next_log += 1
            if items:
                info = await self.logs.write(log_id, [
                    (lid, [key[1] for key, _ in run], [body for _, body in run])
                    for lid, run in ((lid, list(group)) for lid, group in
                                     groupby(items, key=lambda item: item[0][0]))])
                self.logs.add(info)
                result.entries_moved = len(items)
                result.bytes_moved = info.size
                if pace is not None:
                    await pace(info.size)
            old = {i: self.logs.logs.pop(i) for i in victims}
            covered = (self.journal.position if DB_COMPACTION_COVERS_CACHE in self.config.mutations
                       else self._covered)  # (not the journal's end: after it, the cache)
            try:
                await self._write_checkpoint(covered, self._table.dump())
            except BaseException:
                self.logs.logs.update(old)
                raise
            for i, info in old.items():
                self.logs.delete(i)
                result.segments_compacted.append(i)
                result.bytes_freed += info.size
            self.logs.cache.drop_all()
            return result

    # ================================================================== scrubbing

    def scrub_items(self) -> Iterator[tuple[int, int, int, object]]:
        """(ledger, entry, bytes, where) of every flushed entry, log by log (the scrubber's
        walk: :class:`pybk.storage.scrub.Scrubber`; the write cache has no disk of its own)."""
        for log_id in sorted(self.logs.logs):
            for lid, eid, size, row in self.logs.scrub_rows(log_id):
                yield lid, eid, size, (log_id, row)

    def scrub_check(self, ledger_id: int, entry_id: int, where: Any) -> int | None:
        """Verify one entry where :meth:`scrub_items` found it: the bytes read, or None when
        it is gone since (deleted, compacted). Damage raises CorruptRecordError."""
        if self.is_deleted(ledger_id):
            return None
        got = self.logs.check_entry(*where)
        return None if got is None else got[2]

    # ================================================================== invariants

    def _check(self) -> None:
        """Assert the engine's invariants (stateful tests)."""
        self.journal._check()
        for info in self.logs.logs.values():
            for lid, run in info.ledgers.items():
                assert not self.is_deleted(lid), (info.log_id, lid)
                assert run.lo < run.hi and run.first <= run.last, (info.log_id, lid, run)
        self._table.check()
