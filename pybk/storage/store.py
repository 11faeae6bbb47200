"""LedgerStore: the bookie's storage engine (journal = entry store, plus an index).

Writes go through the journal (group commit); an entry enters the index only after the fsync
that covers it, so the index never promises what the disk may not have. Ledger metadata
(master key, fence, explicit LAC, deletion) takes effect in memory at once (a fence must stop
later adds immediately) and its caller is answered after the covering fsync.

Reads look the entry up in the index, ``pread`` the framed record and verify its CRC and ids:
"absent" (NoSuchEntry / NoSuchLedger) is answered only when the index proves it; an I/O or
checksum error is raised as such (rule R2).

Checkpoints: the index plus the journal position it covers, written atomically. The pair is
consistent because the journal moves its position and updates the index in one synchronous
step. Start-up loads the checkpoint and replays the segments after it (or everything when
the checkpoint is missing or damaged).

Compaction: segments wholly behind the durable checkpoint whose live fraction is below a
threshold are scanned (every record verified), their live entries and their ledgers' metadata
are appended again through the journal, a checkpoint that no longer references them is
written, and only then are the old files deleted. The checkpoint names the segments it
retired, so a crash between the checkpoint and the deletion is finished at the next start.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import posixpath
import struct
import sys
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from pybk.errors import (
    BadRequestError,
    BKError,
    CorruptRecordError,
    EntryExistsError,
    IOBookieError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    ReadOnlyBookieError,
    UnauthorizedError,
    UnknownLedgerStateError,
    fresh_copy,
)
from pybk.protocol import ENTRY_HEADER_SIZE, parse_entry_header
from pybk.storage.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointEncoder,
    delta_checkpoint_name,
    delta_checkpoints,
    ledger_metas,
    load_checkpoint_chain,
    stale_checkpoint_files,
)
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, LedgerState, Position
from pybk.storage.journal import Journal, parse_segment_name, segment_name
from pybk.storage.records import (
    SEGMENT_HEADER_SIZE,
    Record,
    RecordType,
    decode_entry_at,
    decode_segment_header,
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
)
from pybk.storage.replay import SegmentScan, apply_record, piggyback_lac, scan_segment

log = logging.getLogger(__name__)

#: the journal's directory inside a data directory
JOURNAL_DIR: Final = "journal"

#: ``journal_inline_sync_max`` for a bookie alone on its event loop: every batch syncs inline.
INLINE_SYNC_ALWAYS: Final = sys.maxsize
#: the longest ledger master key a bookie records (BookKeeper's is a 20-byte digest of the
#: ledger's password; ``pybk.protocol.master_key`` gives 32 bytes). Checkpoints hold a key's
#: length in 16 bits: a longer key taken from the network made every checkpoint fail
MAX_MASTER_KEY_SIZE: Final = 1024

# Mutation switches consulted here (names in ``StoreConfig.mutations``; the registry of every
# switch is ``pybk.testing.mutations``). Each is a deliberately broken build for checker tests.
#: the bookie acknowledges an add before the journal fsync that covers it
ACK_BEFORE_FSYNC: Final = "ack_before_fsync"
#: a delta index checkpoint leaves out the ledgers whose state changed without new entries
#: (a fence, an explicit LAC): the chain then forgets them once the journal moves past
DELTA_SKIPS_LEDGER_STATE: Final = "delta_skips_ledger_state"
#: a batch small enough to be synced inline (``journal_inline_sync_max``, as ``pybk bookie``
#: runs) is acknowledged without any fsync
INLINE_SYNC_SKIPS_FSYNC: Final = "inline_sync_skips_fsync"
#: an overlapped journal (``journal_overlap_syncs``) acknowledges a batch as soon as its sync
#: has started, not once it returned
OVERLAP_ACK_BEFORE_SYNC: Final = "overlap_ack_before_sync"
#: replay takes damage in the middle of a segment (followed by valid batches) for a torn
#: tail and cuts the segment there, dropping the synced records after it
REPLAY_DAMAGE_AS_TORN_TAIL: Final = "replay_damage_as_torn_tail"


@dataclass
class StoreConfig:
    """Storage knobs (``pybk.bookie.BookieConfig`` extends this with the bookie's own)."""

    #: group commit: keep gathering appends while they arrive, at most this long (seconds)
    journal_max_wait: float = 0.001
    journal_max_batch_bytes: int = 4 << 20
    journal_max_batch_count: int = 8192
    #: batches of at most this many records are synced on the loop's own thread (no thread
    #: hops). Set it only when the bookie is alone on its event loop (``pybk bookie`` sets
    #: :data:`INLINE_SYNC_ALWAYS`); 0, the default, keeps every sync on the sync thread so
    #: bookies sharing a loop (LocalCluster) overlap their syncs.
    journal_inline_sync_max: int = 0
    #: complete each journal batch (index updates, answers) while the next one syncs, and
    #: split a big buffer in two when there is nothing to complete meanwhile, so the disk and
    #: the loop work at the same time under load. Only pays where a sync can start while the
    #: loop is busy: a bookie that makes its own OS file system then syncs through a helper
    #: process (``pybk.storage.syncer``); ``pybk bookie`` turns it on.
    journal_overlap_syncs: bool = False
    #: overlapped journal: a buffer of at least twice this many records is split in two when
    #: nothing is waiting to be completed (two cohorts of writers then take turns), and a
    #: synced batch of fewer is answered before the next write (see pybk.storage.journal)
    journal_overlap_split_min: int = 100
    #: rotate the active journal segment past this size (bytes)
    segment_size: int = 64 << 20
    #: make each journal segment ahead of use, ``segment_size`` bytes of synced zeros, and
    #: write it in place: each sync then flushes data only (no size or block-map change),
    #: about half the fdatasync time for a batch of tens of KB. Costs ``segment_size`` of disk
    #: per segment from the start and, when zero-filled, writing it twice; the first segment
    #: is made at start-up (~80 ms for 64 MiB here). ``pybk bookie`` turns it on.
    journal_preallocate: bool = False
    #: preallocated segments are zero-filled while the journal writes less than this many
    #: bytes/s, else only their blocks are reserved (posix_fallocate): the zeros would compete
    #: with the data for the disk (see pybk.storage.journal)
    journal_zero_fill_below: float = 96e6
    #: start even if a segment is corrupt mid-log (its data after the bad point is ignored and
    #: the segment is reported as suspect). Operator decision; off by default.
    allow_suspect_segments: bool = False
    #: compaction rewrites sealed segments whose live fraction is below this
    compaction_threshold: float = 0.5
    #: index checkpoints after a base are deltas (what changed) until the deltas add up to
    #: this fraction of the base's size or number ``checkpoint_max_deltas``; then a new base
    checkpoint_delta_ratio: float = 0.5
    checkpoint_max_deltas: int = 64
    #: names of deliberately broken behaviours (mutation switches) for checker tests, made
    #: by the outermost layer (``pybk.testing.Mutations``); empty in production
    mutations: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        """Refuse a knob no store can run with, naming it (a caller's mistake should not
        show up later as a journal that rotates for ever or a compaction of live data)."""
        _at_least(self, "journal_max_wait", 0.0)
        _at_least(self, "journal_max_batch_bytes", 1)
        _at_least(self, "journal_max_batch_count", 1)
        _at_least(self, "journal_inline_sync_max", 0)
        _at_least(self, "journal_overlap_split_min", 1)
        _at_least(self, "segment_size", 1)
        _at_least(self, "journal_zero_fill_below", 0.0)
        _at_least(self, "compaction_threshold", 0.0, 1.0)
        _at_least(self, "checkpoint_delta_ratio", 0.0)
        _at_least(self, "checkpoint_max_deltas", 0)
        if not (isinstance(self.mutations, frozenset)
                and all(isinstance(m, str) for m in self.mutations)):
            raise TypeError(f"mutations must be a frozenset of switch names, not "
                            f"{self.mutations!r}")


def _at_least(config: object, name: str, low: float, high: float = math.inf) -> None:
    """ValueError unless ``config.<name>`` is a number (not a bool) in ``[low, high]``."""
    value = getattr(config, name)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not low <= value <= high):
        span = f"at least {low}" if high == math.inf else f"between {low} and {high}"
        raise ValueError(f"{type(config).__name__}.{name} must be a number {span}, "
                         f"got {value!r}")


@dataclass
class ReplayReport:
    """What start-up found (exposed for tests, info and logs)."""

    checkpoint_loaded: bool = False
    #: delta checkpoints applied on top of the base
    checkpoint_deltas: int = 0
    checkpoint_error: str = ""
    segments_scanned: int = 0
    records_replayed: int = 0
    torn_tails: int = 0
    torn_bytes: int = 0
    #: zeros cut from the end of the last segment (its unused preallocated space, or the room
    #: of a lost unsynced batch whose blocks were allocated but never written): not damage
    zero_tail_bytes: int = 0
    suspect_segments: list[str] = field(default_factory=list)
    leftovers_removed: list[str] = field(default_factory=list)


@dataclass
class CompactionResult:
    segments_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_freed: int = 0
    skipped_corrupt: list[int] = field(default_factory=list)


class LedgerStore:
    """See the module docstring."""

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
    ) -> None:
        self.fs = fs
        self.data_dir = data_dir
        self.journal_dir = posixpath.join(data_dir, JOURNAL_DIR)
        self.checkpoint_path = posixpath.join(data_dir, CHECKPOINT_FILE)
        self.instance_id = instance_id
        self.config = config or StoreConfig()
        self._on_fatal = on_fatal or (lambda exc: None)
        self._on_write_error = on_write_error or (lambda exc: None)
        self._on_ledger_change = on_ledger_change or (lambda lid: None)
        #: the ledgers whose new entries ``on_ledger_change`` must hear of (someone waits on
        #: them), read live; None: every ledger. Fences, LAC writes and deletions always call.
        self._watched = watched
        self.index = Index()
        self.report = ReplayReport()
        #: (ledger, entry) -> callbacks of identical adds made while the first was pending
        self._also_waiting: dict[tuple[int, int], list[AddCallback]] = {}
        self._fence_futs: dict[int, asyncio.Future[None]] = {}
        self._segments: dict[int, int] = {}  # seq -> size when sealed (active: -1)
        self._dead: list[int] = []  # segments retired by compaction, not yet known deleted
        self._cp_lock = asyncio.Lock()
        self._cp_pos: Position | None = None  # covered by the durable checkpoint
        #: the base checkpoint new deltas extend: its generation, the deltas written on it,
        #: its size and theirs, the ledger metas last written (see pybk.storage.checkpoint)
        self._cp_gen = 0
        self._cp_seq = 0
        self._cp_base_bytes = 0
        self._cp_delta_bytes = 0
        self._cp_metas: dict[int, bytes] = {}
        #: the next checkpoint must be a base (none yet, or the last one was not written)
        self._cp_base_next = True
        #: the highest generation of any checkpoint file seen (a new base goes above it)
        self._cp_gen_seen = 0
        self.checkpoint_stats = {"bases": 0, "deltas": 0, "base_bytes": 0, "delta_bytes": 0}
        self.suspect: list[str] = []
        #: set when the store opened read-only (disk full at start-up)
        self.read_only_reason = ""
        self.journal = Journal(
            fs,
            self.journal_dir,
            instance_id,
            on_synced=self._on_synced,
            on_failed=self._on_batch_failed,
            on_fatal=self._on_fatal,
            on_write_error=self._on_write_error,
            on_rotate=self._on_rotate,
            max_wait=self.config.journal_max_wait,
            max_batch_bytes=self.config.journal_max_batch_bytes,
            max_batch_count=self.config.journal_max_batch_count,
            segment_size=self.config.segment_size,
            inline_sync_max=self.config.journal_inline_sync_max,
            overlap_syncs=self.config.journal_overlap_syncs,
            overlap_split_min=self.config.journal_overlap_split_min,
            preallocate=self.config.journal_preallocate,
            zero_fill_below=self.config.journal_zero_fill_below,
            ack_before_fsync=ACK_BEFORE_FSYNC in self.config.mutations,
            inline_sync_skips_fsync=INLINE_SYNC_SKIPS_FSYNC in self.config.mutations,
            overlap_ack_before_sync=OVERLAP_ACK_BEFORE_SYNC in self.config.mutations,
        )

    # ================================================================== start-up / shut-down

    async def open(self) -> None:
        """Load the checkpoint, replay the journal after it, clean up, open a new segment."""
        fs = self.fs
        fs.makedirs(self.journal_dir)
        report = self.report
        names = fs.listdir(self.journal_dir)
        seqs = sorted(s for s in (parse_segment_name(n) for n in names) if s is not None)
        index: Index = Index()
        pos: Position | None = None
        dead: list[int] = []
        self._cp_gen_seen = max([gen for gen, _seq in delta_checkpoints(fs, self.data_dir)],
                                default=0)
        if fs.exists(self.checkpoint_path):
            try:
                index, pos, dead = self._load_checkpoint()
                report.checkpoint_loaded = True
            except (CorruptRecordError, OSError) as exc:
                report.checkpoint_error = str(exc)
                index, pos, dead = Index(), None, []
        if pos is not None and pos.seg not in seqs:
            if any(s > pos.seg for s in seqs) or index.seg_live:
                raise CorruptRecordError(
                    f"{self.journal_dir}: segment {segment_name(pos.seg)} named by the index "
                    "checkpoint is missing: synced journal data is gone; refusing to start",
                    path=self.journal_path(pos.seg), offset=pos.offset)
            pos = None  # an empty journal that was never written to after the checkpoint
        self.index = index
        for seq in seqs:
            if pos is not None and seq < pos.seg:
                path = self.journal_path(seq)
                if seq in dead and seq not in index.seg_live:
                    fs.delete(path)  # compaction retired it; the crash came before the delete
                    report.leftovers_removed.append(path)
                    continue
                if fs.file_size(path) <= SEGMENT_HEADER_SIZE and seq not in index.seg_live:
                    # no room for a record: a segment cut off while being created (see
                    # replay.scan_segment); nothing the index knows lives there
                    fs.delete(path)
                    report.leftovers_removed.append(path)
                    report.torn_tails += 1
                    continue
                self._check_header(seq)
                self._segments[seq] = fs.file_size(path)
                continue
            scan = self._scan(seq, pos, is_last=seq == seqs[-1])
            report.segments_scanned += 1
            if scan.torn_header:
                fs.delete(scan.path)
                report.leftovers_removed.append(scan.path)
                report.torn_tails += 1
                continue
            if scan.torn_bytes or scan.zero_tail:
                if scan.torn_bytes:
                    report.torn_tails += 1
                    report.torn_bytes += scan.torn_bytes
                report.zero_tail_bytes += scan.zero_tail
                fs.truncate(scan.path, scan.end)
            if seq == seqs[-1]:
                # The cut must be durable before later segments exist: this start's cut, or an
                # earlier start's whose sync failed (that start refused to run, but the cut
                # file is what this one reads). Otherwise a crash could bring the tail back
                # behind a newer segment, where it reads as corruption.
                fh = fs.open_append(scan.path)
                try:
                    await fh.sync()
                finally:
                    fh.close()
            if scan.corruption is not None:
                self.suspect.append(f"{scan.path}@{scan.corruption.offset}")
                report.suspect_segments.append(str(scan.corruption))
            self._segments[seq] = scan.end if scan.corruption is None else scan.size
        if report.leftovers_removed:
            await fs.fsync_dir(self.journal_dir)
        for seq in list(index.seg_live):
            if seq not in self._segments:
                raise CorruptRecordError(
                    f"{self.journal_path(seq)}: segment holding live entries is missing",
                    path=self.journal_path(seq), offset=0)
        self._dead = [s for s in dead if s in self._segments]
        new_seq = max([*seqs, -1]) + 1
        try:
            await self.journal.open(new_seq)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # Everything replayed is readable; writing needs space. Serve reads only (the
            # half-created segment is dropped as a torn one at the next start).
            self.read_only_reason = (f"disk full at start-up ({exc}): serving reads only; "
                                     "restart the bookie once space is freed")
            self.journal.failed = ReadOnlyBookieError(self.read_only_reason)
            return
        self._segments[new_seq] = -1
        try:
            await self.checkpoint()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise  # (with ENOSPC the journal still holds everything: replay covers it)

    def journal_path(self, seq: int) -> str:
        return posixpath.join(self.journal_dir, segment_name(seq))

    def _check_header(self, seq: int) -> None:
        path = self.journal_path(seq)
        header = decode_segment_header(self.fs.pread(path, 0, SEGMENT_HEADER_SIZE), path)
        if header.seq != seq or header.instance_id != self.instance_id:
            raise CorruptRecordError(
                f"{path}: segment header (seq {header.seq}, instance {header.instance_id}) does "
                f"not match (seq {seq}, instance {self.instance_id})", path=path, offset=0)

    def _scan(self, seq: int, pos: Position | None, *, is_last: bool) -> SegmentScan:
        start = pos.offset if pos is not None and seq == pos.seg else None
        batch_seq = pos.batch_seq if start is not None and pos is not None else 0

        def apply(rec: Record, seg: int) -> None:
            self.report.records_replayed += 1
            apply_record(self.index, rec, seg)

        return scan_segment(
            self.fs, self.journal_path(seq), seq, self.instance_id,
            start=start, batch_seq=batch_seq, is_last=is_last,
            allow_suspect=self.config.allow_suspect_segments, apply=apply,
            damage_as_torn_tail=REPLAY_DAMAGE_AS_TORN_TAIL in self.config.mutations,
        )

    def _load_checkpoint(self) -> tuple[Index, Position, list[int]]:
        """The index, position and dead segments of the base checkpoint and its chain of
        deltas (see ``load_checkpoint_chain``: damage raises, the caller rebuilds). Once
        loaded, the next checkpoint extends this chain (a delta of what replay adds)."""
        chain = load_checkpoint_chain(self.fs, self.data_dir)
        self.report.checkpoint_deltas = chain.deltas
        gen = chain.base.generation
        self._cp_gen_seen = max(self._cp_gen_seen, gen)
        self._cp_gen, self._cp_seq = gen, chain.last.seq
        self._cp_base_bytes, self._cp_delta_bytes = chain.base_bytes, chain.delta_bytes
        self._cp_metas = ledger_metas(chain.index)
        self._cp_base_next = False
        self._drop_old_deltas(gen)  # older bases' and half-written ones
        return chain.index, chain.last.position, chain.last.dead

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

    # ================================================================== journal callbacks

    def _on_synced(self, seg: int, tags: list[Any], offsets: list[int]) -> None:
        # The hot path: once per entry, so the common case (the next entry of a held ledger)
        # is appended to the ledger's EntryIndex columns right here (what EntryIndex.put does
        # for it) rather than through put_entry, and the ledger's state comes with the tag
        # (see _Tag) rather than from a lookup.
        index = self.index
        watched = self._watched
        live = 0
        last = None
        done: list[AddCallback] = []
        changed: list[int] = []
        for tag, offset in zip(tags, offsets, strict=False):  # (offsets: one more, the end)
            if tag is None:
                continue
            lid, eid, lac, size, on_done, st = tag
            if not size:
                continue
            if on_done is not None:
                done.append(on_done)
            if lid != last:
                last = lid
                if watched is None or lid in watched:  # wake long polls once per run
                    changed.append(lid)
            st.pending.pop(eid, None)
            entries = st.entries
            if eid != entries.end or entries.sparse is not None or st.deleted:
                # rare paths (not the next id, re-added/compacted entry, deleted ledger): the
                # general code
                index.put_entry(lid, eid, (seg, offset, size), lac)
                continue
            entries.segs.append(seg)  # EntryIndex.put's append at the end, inlined
            entries.offs.append(offset)
            entries.sizes.append(size)
            entries.end = eid + 1
            live += size
            if lac > st.max_piggyback_lac:
                st.max_piggyback_lac = lac
        if live:
            index.seg_live[seg] = index.seg_live.get(seg, 0) + live
        for lid in changed:
            self._on_ledger_change(lid)
        if self._also_waiting:
            done.extend(self._waiters_of(tags))
        # Answer only once the whole batch is in the index (a reader told "done" finds it).
        for on_done in done:
            try:
                on_done(None)
            except Exception:  # a listener's bug must not break the journal's completion
                log.exception("add callback failed")

    def _waiters_of(self, tags: list[Any]) -> list[AddCallback]:
        """The callbacks of duplicate adds that waited for entries of this batch."""
        also = self._also_waiting
        out: list[AddCallback] = []
        for tag in tags:
            if tag is not None and tag[3]:
                out.extend(also.pop((tag[0], tag[1]), ()))
        return out

    def _on_rotate(self, old_seq: int, old_size: int, new_seq: int) -> None:
        self._segments[old_seq] = old_size
        self._segments[new_seq] = -1

    def _on_batch_failed(self, tags: list[Any], exc: BaseException) -> None:
        for tag in tags:
            if tag is None:
                continue
            lid, eid, _lac, size, on_done, st = tag
            if size:
                st.pending.pop(eid, None)
                for waiter in [on_done, *self._also_waiting.pop((lid, eid), ())]:
                    if waiter is not None:
                        _notify(waiter, fresh_copy(exc), lid, eid)
            else:  # a master-key record was lost: journal it again with the next write
                st.master_key = None

    # ================================================================== writes

    def _check_key(self, lid: int, st: LedgerState | None, key: bytes) -> None:
        """A write's ledger id and key: a negative id or a key too long to record is a bad
        request, a key that differs from the recorded one is unauthorized."""
        if st is not None and st.master_key is not None:
            if st.master_key != key:
                raise UnauthorizedError(f"ledger {lid}: master key does not match")
            return
        if lid < 0:
            raise BadRequestError(f"ledger id {lid}: ledger ids are never negative")
        if len(key) > MAX_MASTER_KEY_SIZE:
            raise BadRequestError(f"ledger {lid}: a master key of {len(key)} bytes (at most "
                                  f"{MAX_MASTER_KEY_SIZE})")

    def _key_record(self, lid: int, st: LedgerState, key: bytes) -> bytes:
        """The MASTER_KEY record to journal with this write, if the ledger has none yet."""
        if st.master_key is not None:
            return b""
        st.master_key = key
        return encode_master_key(lid, key)

    def add(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
            recovery: bool = False) -> asyncio.Future[None]:
        """Store one framed entry; the future resolves once it is durable (and indexed).

        Raises at once like :meth:`add_entry`. The awaitable form, for callers off the hot
        path; it costs one future per add."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_entry(ledger_id, entry_id, body, master_key, recovery, ResolveFuture(fut))
        return fut

    def add_entry(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
                  recovery: bool, on_done: AddCallback) -> None:
        """Store one framed entry; ``on_done(error)`` tells the outcome. The hot path.

        Raises at once (and then never calls ``on_done``): LedgerFencedError (fenced and not
        a recovery add, or deleted), UnauthorizedError, EntryExistsError (different bytes),
        BadRequestError (the body's embedded ids disagree with the request),
        JournalFailedError (the journal takes no more writes).

        Otherwise ``on_done`` is called exactly once: ``None`` once the entry is durable *and*
        in the index, else the error. It runs synchronously inside the journal's batch
        completion (no future, no loop callback per entry), so it must be quick and must not
        raise; it may already have run when ``add_entry`` returns."""
        try:
            blid, beid, lac = _unpack_entry_ids_lac(body)
        except struct.error:  # shorter than the header (the length test, paid only here)
            raise BadRequestError(
                f"ledger {ledger_id} entry {entry_id}: entry of {len(body)} bytes is shorter "
                f"than the {ENTRY_HEADER_SIZE}-byte header") from None
        if entry_id < 0 or ledger_id < 0:
            raise BadRequestError(f"add of ({ledger_id}, {entry_id}): ledger and entry ids are "
                                  "never negative")
        if blid != ledger_id or beid != entry_id:
            raise BadRequestError(
                f"add of ({ledger_id}, {entry_id}) carries an entry framed as ({blid}, {beid})")
        st = self.index.ledgers.get(ledger_id)
        # The common case in one test: a held, unfenced ledger whose key matches. Anything
        # else (new or deleted ledger, no key yet, fenced, wrong key) takes the general checks.
        if st is None or st.fenced or st.master_key != master_key:
            st = self._add_checks(ledger_id, st, master_key, recovery)
        pending = st.pending.get(entry_id)
        if pending is not None:
            if pending != body:
                raise EntryExistsError(
                    f"ledger {ledger_id} entry {entry_id} is being written with different bytes")
            # identical: answered with the original, after the fsync that covers it
            self._also_waiting.setdefault((ledger_id, entry_id), []).append(on_done)
            return
        entries = st.entries
        # (an id from the dense run's end on is not held unless sparse ids exist: one test)
        if (entry_id < entries.end or entries.sparse is not None) and entry_id in entries:
            self._add_existing(st, ledger_id, entry_id, body, lac, on_done)
            return
        journal = self.journal
        if st.master_key is None:
            journal.append_nowait(self._key_record(ledger_id, st, master_key),
                                  (ledger_id, -1, -1, 0, None, st))
        rec = encode_entry(body)
        journal.append_nowait(rec, (ledger_id, entry_id, lac, len(rec), on_done, st))
        st.pending[entry_id] = body

    def _add_checks(self, ledger_id: int, st: LedgerState | None, master_key: bytes,
                    recovery: bool) -> LedgerState:
        """The refusals of :meth:`add_entry` (deleted, wrong key, fenced), in their order; the
        ledger's state, created if unknown."""
        if st is not None:
            self._check_key(ledger_id, st, master_key)
            if st.fenced and not recovery:
                raise LedgerFencedError(f"ledger {ledger_id} is fenced")
            return st
        if self.index.is_deleted(ledger_id):
            raise LedgerFencedError(f"ledger {ledger_id} was deleted on this bookie")
        self._check_key(ledger_id, None, master_key)
        return self.index.ledger(ledger_id)

    def _add_existing(self, st: LedgerState, ledger_id: int, entry_id: int, body: bytes,
                      lac: int, on_done: AddCallback) -> None:
        """An add of an entry the index already holds: identical bytes are a durable no-op,
        different bytes an error; a damaged local copy is replaced (repair)."""
        try:
            stored = self.read(ledger_id, entry_id)
        except (CorruptRecordError, IOBookieError):
            stored = None  # the local copy is damaged: store the new copy (repair)
        if stored is None:
            rec = encode_entry(body)
            self.journal.append_nowait(rec, (ledger_id, entry_id, lac, len(rec), on_done, st))
            st.pending[entry_id] = body
            return
        if stored != body:
            raise EntryExistsError(
                f"ledger {ledger_id} entry {entry_id} exists with different bytes")
        _notify(on_done, None, ledger_id, entry_id)

    def fence(self, ledger_id: int, master_key: bytes) -> Awaitable[None]:
        """Fence durably (creating the ledger, fenced, if unknown). Takes effect at once; the
        returned awaitable completes once the fence is synced."""
        if self.index.is_deleted(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
        st = self.index.get(ledger_id)
        self._check_key(ledger_id, st, master_key)
        if st is None:
            st = self.index.ledger(ledger_id)
        prior = self._fence_futs.get(ledger_id)
        if st.fenced:
            if prior is None:  # the fence is durable
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return done
            if not prior.done():
                return prior  # answer when the pending fence record is synced
            # the earlier fence record was never written (e.g. ENOSPC): journal it again
        key_rec = self._key_record(ledger_id, st, master_key)
        st.fenced = True
        if key_rec:
            self.journal.append(key_rec, (ledger_id, -1, -1, 0, None, st))
        fut = self.journal.append(encode_fence(ledger_id))
        self._fence_futs[ledger_id] = fut
        fut.add_done_callback(lambda _f: self._fence_settled(ledger_id, fut))
        self._on_ledger_change(ledger_id)
        return fut

    def _fence_settled(self, ledger_id: int, fut: asyncio.Future[None]) -> None:
        """Forget a fence once durable; keep a failed one so the next fence writes it again."""
        if self._fence_futs.get(ledger_id) is fut and not fut.cancelled() and (
            fut.exception() is None
        ):
            del self._fence_futs[ledger_id]

    def write_lac(self, ledger_id: int, lac: int, body: bytes,
                  master_key: bytes) -> Awaitable[None]:
        """Record an explicit LAC (and its digested body) durably; the awaitable completes
        once it is synced."""
        if lac < -1:
            raise BadRequestError(f"ledger {ledger_id}: explicit LAC {lac} (at least -1)")
        if self.index.is_deleted(ledger_id):
            raise LedgerFencedError(f"ledger {ledger_id} was deleted on this bookie")
        st = self.index.get(ledger_id)
        self._check_key(ledger_id, st, master_key)
        if st is None:
            st = self.index.ledger(ledger_id)
        key_rec = self._key_record(ledger_id, st, master_key)
        if key_rec:
            self.journal.append(key_rec, (ledger_id, -1, -1, 0, None, st))
        fut = self.journal.append(encode_explicit_lac(ledger_id, lac, body))
        if lac >= st.explicit_lac:
            st.explicit_lac, st.explicit_lac_body = lac, body
            self._on_ledger_change(ledger_id)
        return fut

    def delete_ledger(self, ledger_id: int) -> Awaitable[None]:
        """Journal a tombstone; the ledger's bytes become garbage; later adds are rejected.
        Deleting a ledger this bookie never held records the deletion all the same."""
        if ledger_id < 0:
            raise BadRequestError(f"ledger id {ledger_id}: ledger ids are never negative")
        self.index.delete_ledger(ledger_id)
        fut = self.journal.append(encode_delete(ledger_id))
        self._on_ledger_change(ledger_id)
        return fut

    # ================================================================== reads

    def state(self, ledger_id: int) -> LedgerState:
        """The ledger's state; NoSuchLedgerError when unknown or deleted."""
        st = self.index.get(ledger_id)
        if st is None:
            if self.index.is_deleted(ledger_id):
                raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
            self._absent(f"ledger {ledger_id} is not on this bookie", NoSuchLedgerError)
        return st

    def _absent(self, what: str, cls: type[BKError]) -> NoReturn:
        """Raise "absent", or "unknown" while data may have been lost (rule R4: a bookie that
        started without part of a suspect segment cannot prove absence; it is in limbo)."""
        if self.suspect:
            raise UnknownLedgerStateError(
                f"{what}, but this bookie started with suspect journal segments "
                f"({', '.join(self.suspect)}) and may have lost it: unknown, not absent")
        raise cls(what)

    def read(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored framed entry; ``entry_id == -1`` reads the last one held."""
        st = self.state(ledger_id)
        if entry_id == -1:
            entry_id = st.entries.last
            if entry_id < 0:
                self._absent(f"ledger {ledger_id} holds no entries on this bookie",
                             NoSuchEntryError)
        loc = st.entries.get(entry_id)
        if loc is None:
            self._absent(f"ledger {ledger_id} entry {entry_id} is not on this bookie",
                         NoSuchEntryError)
        seg, offset, size = loc
        path = self.journal_path(seg)
        try:
            data = self.fs.pread(path, offset, size)
        except OSError as exc:
            raise IOBookieError(
                f"reading ledger {ledger_id} entry {entry_id} from {path}@{offset}: {exc}"
            ) from None
        return decode_entry_at(data, path, offset, ledger_id, entry_id)

    def read_range(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        """(entry id, body) for the entries held in [first, last], ascending; each verified
        like :meth:`read` (a damaged one raises, it is never skipped)."""
        st = self.state(ledger_id)
        return [(int(eid), self.read(ledger_id, int(eid)))
                for eid in st.entries.irange(first, last)]

    def lac(self, ledger_id: int) -> int:
        st = self.index.get(ledger_id)
        return -1 if st is None else st.lac

    def ranges(self, ledger_id: int) -> tuple[tuple[int, int], ...]:
        st = self.state(ledger_id)
        out: list[tuple[int, int]] = []
        first = prev = None
        for eid in st.entries:
            if prev is not None and eid == prev + 1:
                prev = eid
                continue
            if first is not None and prev is not None:
                out.append((first, prev))
            first = prev = eid
        if first is not None and prev is not None:
            out.append((first, prev))
        return tuple(out)

    def ledger_ids(self) -> list[int]:
        """Ledgers held (not deleted), ascending."""
        return sorted(self.index.ledgers)

    # ================================================================== checkpoint

    async def checkpoint(self) -> Position:
        """Persist the index with the journal position it covers (atomic file replace)."""
        async with self._cp_lock:
            return await self._checkpoint_locked()

    async def _checkpoint_locked(self) -> Position:
        pos = self.journal.position
        base = (self._cp_base_next or self._cp_seq >= self.config.checkpoint_max_deltas
                or self._cp_delta_bytes > self.config.checkpoint_delta_ratio
                * self._cp_base_bytes)
        gen = self._cp_gen_seen + 1 if base else self._cp_gen
        seq = 0 if base else self._cp_seq + 1
        # the snapshot is taken here, synchronously: the file is the index at ``pos``; from
        # here on the index counts as checkpointed, so if the file is not written the next
        # checkpoint must be a base
        encoder = CheckpointEncoder(self.index, pos, generation=gen, seq=seq, dead=self._dead,
                                    written=None if base else self._cp_metas,
                                    skip_state_only=DELTA_SKIPS_LEDGER_STATE
                                    in self.config.mutations)
        self._cp_base_next = True
        for _ in encoder.steps():
            await asyncio.sleep(0)  # a big index is encoded in steps: keep serving between
        data = encoder.result()
        if base:
            self._cp_gen_seen = gen
            await self.fs.write_file_atomic(self.checkpoint_path, data)
            self._cp_gen, self._cp_seq = gen, 0
            self._cp_base_bytes, self._cp_delta_bytes = len(data), 0
            self._drop_old_deltas(gen)
        else:
            await self.fs.write_file_atomic(
                posixpath.join(self.data_dir, delta_checkpoint_name(gen, seq)), data)
            self._cp_seq = seq
            self._cp_delta_bytes += len(data)
        kind = "base" if base else "delta"
        self.checkpoint_stats[kind + "s"] += 1
        self.checkpoint_stats[kind + "_bytes"] += len(data)
        self._cp_metas = encoder.metas
        self._cp_base_next = False
        self._cp_pos = pos
        return pos

    def _drop_old_deltas(self, generation: int) -> None:
        """Delete the delta files of older bases and half-written ones. Best effort: a
        leftover delta names an older generation, so it is never applied, and the next base
        tries again."""
        for name in stale_checkpoint_files(self.fs, self.data_dir, generation):
            try:
                self.fs.delete(posixpath.join(self.data_dir, name))
            except OSError as exc:
                log.warning("could not delete old index checkpoint %s: %s", name, exc)

    # ================================================================== compaction

    def segment_usage(self) -> dict[int, tuple[int, int]]:
        """seq -> (live bytes, file bytes) for the sealed segments."""
        out = {}
        for seq, size in sorted(self._segments.items()):
            if size >= 0:
                out[seq] = (self.index.seg_live.get(seq, 0), size)
        return out

    async def compact(self, threshold: float | None = None) -> CompactionResult:
        """Rewrite sealed segments whose live fraction is below ``threshold`` (see module doc).
        Safe against a crash at any step."""
        threshold = self.config.compaction_threshold if threshold is None else threshold
        result = CompactionResult()
        async with self._cp_lock:
            cp = await self._checkpoint_locked()
            candidates = []
            for seq, (live, size) in self.segment_usage().items():
                if seq < cp.seg and seq not in self._dead and live < threshold * max(size, 1):
                    candidates.append((live / max(size, 1), seq))
            futs: list[Awaitable[None]] = []
            chosen: list[int] = []
            for _, seq in sorted(candidates):
                try:
                    moved = self._rewrite_segment(seq, futs)
                except (CorruptRecordError, OSError):
                    result.skipped_corrupt.append(seq)
                    continue
                chosen.append(seq)
                result.entries_moved += moved
            if not chosen:
                return result
            await asyncio.gather(*futs)
            for seq in chosen:
                if self.index.seg_live.get(seq, 0):
                    raise AssertionError(f"segment {seq} still referenced after compaction")
            self._dead.extend(chosen)
            await self._checkpoint_locked()  # durable index no longer points into them
            for seq in chosen:
                result.bytes_freed += self._segments.pop(seq)
                self.fs.delete(self.journal_path(seq))
            await self.fs.fsync_dir(self.journal_dir)
            self._dead = [s for s in self._dead if s not in chosen]
            result.segments_compacted = chosen
        return result

    def _rewrite_segment(self, seq: int, futs: list[Awaitable[None]]) -> int:
        """Verify every record of segment ``seq``; re-append its live entries and the current
        metadata of every ledger it mentions. Raises before appending anything if damaged."""
        records: list[Record] = []
        scan_segment(
            self.fs, self.journal_path(seq), seq, self.instance_id, start=None, batch_seq=0,
            is_last=False, allow_suspect=False, apply=lambda rec, _seg: records.append(rec),
        )
        out: list[tuple[bytes, _Tag | None]] = []
        meta: dict[int, None] = {}  # the ledgers mentioned, in order
        index = self.index
        for rec in records:
            if rec.rtype is RecordType.CHECKPOINT:
                continue  # (the only record of no ledger; a ledger id's sign means nothing)
            st = index.get(rec.ledger_id)
            if st is None:
                if index.is_deleted(rec.ledger_id):
                    meta[rec.ledger_id] = None  # its tombstone goes on (see below)
                continue
            if rec.rtype is RecordType.ENTRY:
                loc = st.entries.get(rec.entry_id)
                if loc is not None and loc[0] == seq and loc[1] == rec.offset:
                    data = encode_entry(rec.data)
                    out.append((data, (rec.ledger_id, rec.entry_id,
                                       piggyback_lac(rec.data), len(data), None, st)))
            else:
                meta[rec.ledger_id] = None
        for lid in meta:
            # a deleted ledger's DELETE record is carried forward whenever a segment that
            # mentions the ledger goes: older segments may still hold its entries, which a
            # rebuild from the segments must not bring back
            if index.is_deleted(lid):
                out.append((encode_delete(lid), None))
                continue
            st = index.ledgers[lid]
            if st.master_key is not None:
                out.append((encode_master_key(lid, st.master_key), None))
            if st.fenced:
                out.append((encode_fence(lid), None))
            if st.explicit_lac_body is not None:
                out.append((encode_explicit_lac(lid, st.explicit_lac, st.explicit_lac_body),
                            None))
        for data, tag in out:
            futs.append(self.journal.append(data, tag))
        return sum(1 for _, tag in out if tag is not None)

    def _check(self) -> None:
        """Assert the store's invariants (stateful tests)."""
        self.index._check()
        self.journal._check()
        for lid, st in self.index.ledgers.items():
            for eid, body in st.pending.items():
                assert parse_entry_header(body)[:2] == (lid, eid)
                assert eid not in st.entries, (lid, eid)
        assert self.journal.segment_seq in self._segments or self.journal.failed is not None
        for seq in self.index.seg_live:
            assert seq in self._segments, f"live entries in unknown segment {seq}"


#: ``on_done(error)`` of :meth:`LedgerStore.add`: None once durable, else the error
AddCallback = Callable[[BaseException | None], None]
#: The journal tag of a record the store writes: (ledger id, entry id, piggybacked LAC,
#: record size, add callback, the ledger's state). A MASTER_KEY record's has entry id -1 and
#: size 0 (it is not an entry). The state is the ledger's one LedgerState object, which
#: ``Index`` keeps for the ledger's whole life (a deletion marks it, never replaces it; only
#: ``open`` replaces the index, before any write), so batch completion needs no lookup.
_Tag = tuple[int, int, int, int, "AddCallback | None", LedgerState]
#: the ids and piggybacked LAC of a framed entry's header (its length field skipped, not
#: converted), needing the whole header like ENTRY_HEADER
_ENTRY_IDS_LAC = struct.Struct(">qqq8x")
assert _ENTRY_IDS_LAC.size == ENTRY_HEADER_SIZE
_unpack_entry_ids_lac = _ENTRY_IDS_LAC.unpack_from


def _notify(on_done: AddCallback, error: BaseException | None, lid: int, eid: int) -> None:
    """Run one add callback; its bug must not break the journal's batch completion."""
    try:
        on_done(error)
    except Exception:
        log.exception("add callback for ledger %s entry %s failed", lid, eid)


class ResolveFuture:
    """An :data:`AddCallback` that resolves a future (the awaitable forms of the add paths)."""

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut

    def __call__(self, error: BaseException | None) -> None:
        fut = self.fut
        if fut.done():
            return
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)
            fut.exception()  # the caller may never look; do not warn


__all__ = [
    "ACK_BEFORE_FSYNC", "DELTA_SKIPS_LEDGER_STATE", "INLINE_SYNC_ALWAYS",
    "INLINE_SYNC_SKIPS_FSYNC", "OVERLAP_ACK_BEFORE_SYNC", "REPLAY_DAMAGE_AS_TORN_TAIL",
    "AddCallback",
    "BKError", "CompactionResult", "LedgerStore", "ReplayReport", "ResolveFuture", "StoreConfig",
]
