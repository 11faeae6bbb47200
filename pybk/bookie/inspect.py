"""Offline inspection of a bookie's data directory: what is there, and is it sound.

For an operator with a stopped bookie (or a copy of its directory): the cookie, every journal
segment verified record by record, the index checkpoint chain, and a check that the chain
plus the journal after it gives the same index as a rebuild from every segment; on a db
bookie its checkpoint, every entry log's rows and bodies, and the journal after the
checkpoint's mark (:mod:`pybk.bookie.inspect_db`). It only
reads: a bookie's start-up cuts torn tails and rewrites checkpoints, this does not, so it is
safe on a directory a bookie may still need to recover (BookKeeper's shell has the same kind
of tools: ``readjournal``, ``bookiesanity``, ``ledger``).

Damage is reported, never raised: :attr:`DataDirReport.problems` lists what a start-up would
refuse or repair. A torn or zeroed tail of the last segment is expected after a crash and is
not a problem (start-up cuts it).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from pybk.bookie import COOKIE_FILE, decode_cookie
from pybk.errors import BKError, CorruptRecordError
from pybk.storage.checkpoint import CHECKPOINT_FILE, CheckpointChain, load_checkpoint_chain
from pybk.storage.dbstore import DB_CHECKPOINT, ENTRY_LOG_DIR
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, LedgerState, Position
from pybk.storage.journal import parse_segment_name, segment_name
from pybk.storage.records import (
    SEGMENT_HEADER_SIZE,
    Record,
    RecordType,
    decode_segment_header,
)
from pybk.storage.replay import apply_record, scan_segment
from pybk.storage.store import JOURNAL_DIR

__all__ = [
    "CheckpointReport",
    "DataDirReport",
    "EntryLogReport",
    "SegmentReport",
    "inspect_data_dir",
]


@dataclass
class SegmentReport:
    """One journal segment, verified."""

    seq: int
    size: int
    batches: int = 0
    #: record type name -> count (a plain dict: ``dataclasses.asdict`` mangles a Counter)
    records: dict[str, int] = field(default_factory=dict)
    #: ok | torn tail | zero tail | torn header | corrupt | foreign | unreadable
    state: str = "ok"
    detail: str = ""
    #: bytes of the entries this segment holds that are still live (not deleted, not
    #: superseded); the rest of ``size`` is what compaction would give back
    live_bytes: int = 0

    @property
    def dead_bytes(self) -> int:
        return max(0, self.size - self.live_bytes)


@dataclass
class CheckpointReport:
    """The index checkpoint chain."""

    #: ok | missing | damaged
    state: str = "missing"
    detail: str = ""
    generation: int = 0
    deltas: int = 0
    position: Position | None = None
    ledgers: int = 0
    entries: int = 0


@dataclass
class EntryLogReport:
    """One entry log of a db bookie, verified row by row and body by body."""

    log_id: int
    #: bytes of its .log file
    size: int = 0
    rows: int = 0
    ledgers: int = 0
    live_bytes: int = 0
    #: rows or bodies that fail their checksums (a newer log's repair excepted)
    damaged: int = 0
    #: ok | damaged | unnamed (no checkpoint names it: a start-up deletes it) | missing
    state: str = "ok"
    detail: str = ""


@dataclass
class DataDirReport:
    """Everything :func:`inspect_data_dir` found."""

    data_dir: str
    bookie_id: str = ""
    instance_id: str = ""
    #: the storage engine the directory is laid out for: journal | db
    storage: str = "journal"
    segments: list[SegmentReport] = field(default_factory=list)
    entry_logs: list[EntryLogReport] = field(default_factory=list)
    checkpoint: CheckpointReport = field(default_factory=CheckpointReport)
    #: from the rebuild out of every segment
    ledgers: int = 0
    fenced: int = 0
    deleted: int = 0
    entries: int = 0
    #: what a start-up would refuse or repair (empty: sound)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def inspect_data_dir(fs: FileSystem, data_dir: str) -> DataDirReport:
    """Read ``data_dir`` (a bookie's ``--data``) and report; writes nothing."""
    report = DataDirReport(data_dir)
    _read_cookie(fs, data_dir, report)
    if fs.exists(posixpath.join(data_dir, DB_CHECKPOINT)) or fs.exists(
            posixpath.join(data_dir, ENTRY_LOG_DIR)):
        from pybk.bookie.inspect_db import inspect_db_dir

        inspect_db_dir(fs, data_dir, report)
        return report
    journal_dir = posixpath.join(data_dir, JOURNAL_DIR)
    seqs = sorted(s for s in map(parse_segment_name, listdir_reported(fs, journal_dir, report))
                  if s is not None)
    chain = _load_chain(fs, data_dir, report)
    # one pass over the journal feeds both indexes: the rebuild from every record, and the
    # checkpoint chain's replay of the records after its position
    rebuilt = Index()
    replay = None if chain is None else (chain.index, chain.last.position)
    for seq in seqs:
        report.segments.append(scan_report(fs, journal_dir, seq, seq == seqs[-1], report, rebuilt,
                                     replay))
    for seg in report.segments:
        seg.live_bytes = rebuilt.seg_live.get(seg.seq, 0)
    report.ledgers = len(rebuilt.ledgers)
    report.deleted = len(rebuilt.deleted)
    report.fenced = sum(1 for st in rebuilt.ledgers.values() if st.fenced)
    report.entries = sum(len(st.entries) for st in rebuilt.ledgers.values())
    if chain is not None:
        _compare(chain.index, chain.last.position, seqs, report, rebuilt)
    return report


def listdir_reported(fs: FileSystem, path: str, report: DataDirReport) -> list[str]:
    try:
        return fs.listdir(path)
    except OSError as exc:
        report.problems.append(f"{path}: cannot list ({exc})")
        return []


def _read_cookie(fs: FileSystem, data_dir: str, report: DataDirReport) -> None:
    path = posixpath.join(data_dir, COOKIE_FILE)
    if not fs.exists(path):
        report.problems.append(f"{path}: no cookie (not a bookie's data directory, or one "
                               "that was emptied)")
        return
    try:
        cookie = decode_cookie(fs.read_file(path), path)
    except (BKError, OSError) as exc:
        report.problems.append(str(exc))
        return
    report.bookie_id, report.instance_id = cookie["bookie_id"], cookie["instance_id"]


def scan_report(fs: FileSystem, journal_dir: str, seq: int, is_last: bool, report: DataDirReport,
          rebuilt: Index, replay: tuple[Index, Position] | None,
          start: Position | None = None) -> SegmentReport:
    """Verify one segment and apply its records to ``rebuilt`` (as a start-up that lost its
    checkpoint would) and, past the chain's position, to the chain's index (``replay``: as a
    start-up that loaded it would). From ``start`` on only, in its segment (a db bookie's
    checkpoint mark: what is before it, its start-up never reads)."""
    path = posixpath.join(journal_dir, segment_name(seq))
    seg = SegmentReport(seq, 0)
    by_type: dict[RecordType, int] = {}  # (named in the report once the scan is over)
    try:
        seg.size = fs.file_size(path)
        instance_id = report.instance_id
        if seg.size > SEGMENT_HEADER_SIZE:
            header = decode_segment_header(fs.pread(path, 0, SEGMENT_HEADER_SIZE), path)
            if instance_id and header.instance_id != instance_id:
                seg.state, seg.detail = "foreign", f"instance {header.instance_id}"
                report.problems.append(
                    f"{path}: belongs to bookie instance {header.instance_id}, the cookie "
                    f"says {instance_id}")
                return seg
            instance_id = header.instance_id

        # records past the chain's position also go to the chain's index
        chain_index = None if replay is None else replay[0]
        after = (0, 0) if replay is None else (replay[1].seg, replay[1].offset)

        def apply(rec: Record, at: int) -> None:
            by_type[rec.rtype] = by_type.get(rec.rtype, 0) + 1
            apply_record(rebuilt, rec, at)
            if chain_index is not None and (at, rec.offset) >= after:
                apply_record(chain_index, rec, at)

        # ENTRY records (nearly all) take the fast path: ``Index.put_entry``'s arguments
        entries = [0]
        put_rebuilt = rebuilt.put_entry

        def put_entry(ledger_id: int, entry_id: int, loc: tuple[int, int, int],
                      lac: int) -> None:
            entries[0] += 1
            put_rebuilt(ledger_id, entry_id, loc, lac)
            if chain_index is not None and loc[:2] >= after:
                chain_index.put_entry(ledger_id, entry_id, loc, lac)

        try:
            at = start is not None and start.seg == seq
            scan = scan_segment(fs, path, seq, instance_id,
                                start=start.offset if at and start else None,
                                batch_seq=start.batch_seq if at and start else 0,
                                is_last=is_last, allow_suspect=True, apply=apply,
                                put_entry=put_entry)
        finally:
            if entries[0]:
                by_type[RecordType.ENTRY] = by_type.get(RecordType.ENTRY, 0) + entries[0]
            seg.records.update((t.name, n) for t, n in by_type.items())
    except (BKError, OSError) as exc:
        seg.state, seg.detail = ("corrupt" if isinstance(exc, CorruptRecordError)
                                 else "unreadable"), str(exc)
        report.problems.append(str(exc))
        return seg
    seg.batches = scan.batches
    if scan.torn_header:
        seg.state, seg.detail = "torn header", "cut off while being created; dropped at start"
        if not is_last:
            report.problems.append(f"{path}: torn header in a segment that is not the last")
    elif scan.corruption is not None:
        seg.state, seg.detail = "corrupt", str(scan.corruption)
        report.problems.append(str(scan.corruption))
    elif scan.torn_bytes:
        seg.state, seg.detail = "torn tail", f"{scan.torn_bytes} bytes, cut at start"
    elif scan.zero_tail:
        seg.state, seg.detail = "zero tail", f"{scan.zero_tail} bytes unused"
    return seg


def _load_chain(fs: FileSystem, data_dir: str, report: DataDirReport,
                ) -> CheckpointChain | None:
    """The checkpoint chain, described in ``report.checkpoint``; None if missing or damaged."""
    cp = report.checkpoint
    if not fs.exists(posixpath.join(data_dir, CHECKPOINT_FILE)):
        cp.detail = "no checkpoint: a start-up rebuilds the index from every segment"
        return None
    try:
        chain = load_checkpoint_chain(fs, data_dir)
    except (BKError, OSError) as exc:
        cp.state, cp.detail = "damaged", str(exc)
        report.problems.append(f"index checkpoint: {exc} (a start-up rebuilds the index from "
                               "the segments)")
        return None
    cp.state, cp.generation, cp.deltas = "ok", chain.base.generation, chain.deltas
    cp.position = chain.last.position
    cp.ledgers = len(chain.index.ledgers)
    cp.entries = sum(len(st.entries) for st in chain.index.ledgers.values())
    return chain


def _compare(index: Index, pos: Position, seqs: list[int], report: DataDirReport,
             rebuilt: Index) -> None:
    """The chain plus the journal after it (``index``) must be the index the segments hold
    (``rebuilt``): what a start-up that loaded the chain would serve."""
    cp = report.checkpoint
    missing = sorted(seg for seg in index.seg_live if seg not in seqs)
    if missing:
        cp.detail = f"its entries live in missing segments {missing}"
        report.problems.append(f"index checkpoint: {cp.detail}: synced journal data is gone")
        return
    if any(s.state in ("corrupt", "foreign", "unreadable") for s in report.segments):
        cp.detail = "not compared with the segments (they are damaged)"
        return
    covered = next((s for s in report.segments if s.seq == pos.seg), None)
    if covered is not None and pos.offset > covered.size:
        cp.detail = (f"replay after the checkpoint failed: segment {pos.seg} is "
                     f"{covered.size} bytes but the checkpoint covers it up to {pos.offset}")
        report.problems.append(f"index checkpoint: {cp.detail}")
        return
    differ = _first_difference(index, rebuilt)
    if differ:
        cp.detail = f"disagrees with the segments: {differ}"
        report.problems.append(f"index checkpoint {cp.detail}")


def _first_difference(checkpointed: Index, rebuilt: Index) -> str:
    """The first ledger where the checkpoint chain (plus replay) says less than, or other
    than, the rebuild from the segments; "" if none.

    The chain may say *more* about a ledger's metadata: a fence, a master key, an explicit
    LAC and a deletion take effect in memory when their record is appended, so a checkpoint
    taken before that record's write failed (ENOSPC, EIO) keeps them without the record. Each
    is true (the writer's key, the writer's LAC, a fence or deletion that was asked for) and
    more conservative. Entries are indexed only once durable, so for a ledger both hold they
    must match exactly; a deletion the segments hold must be in the chain (compaction carries
    deletions forward)."""
    lid = rebuilt.deleted.first_missing_from(checkpointed.deleted)
    if lid is not None:
        return f"ledger {lid}: not deleted, but the segments hold its deletion"
    for lid in sorted(set(checkpointed.ledgers) | set(rebuilt.ledgers)):
        if checkpointed.is_deleted(lid):
            continue  # deleted in memory, its record lost (see above): more, not less
        mine = checkpointed.ledgers.get(lid) or LedgerState()
        theirs = rebuilt.ledgers.get(lid) or LedgerState()
        if theirs.fenced and not mine.fenced:
            return f"ledger {lid}: not fenced, but the segments hold a fence"
        if theirs.master_key is not None and mine.master_key != theirs.master_key:
            return f"ledger {lid}: master key differs from the segments'"
        if mine.explicit_lac < theirs.explicit_lac:
            return f"ledger {lid}: explicit LAC {mine.explicit_lac} < {theirs.explicit_lac}"
        if mine.max_piggyback_lac != theirs.max_piggyback_lac:
            return (f"ledger {lid}: piggybacked LAC {mine.max_piggyback_lac} vs "
                    f"{theirs.max_piggyback_lac}")
        if mine.entries.items() != theirs.entries.items():
            return f"ledger {lid}: entries differ"
    # the live bytes per segment travel in the checkpoint (compaction trusts them): they
    # must be what the chain's own entries add up to
    live = checkpointed.live_from_entries()
    if checkpointed.seg_live != live:
        seg = min(s for s in set(live) | set(checkpointed.seg_live)
                  if live.get(s) != checkpointed.seg_live.get(s))
        return (f"live bytes of segment {seg}: {checkpointed.seg_live.get(seg, 0)}, but its "
                f"entries add up to {live.get(seg, 0)}")
    return ""
