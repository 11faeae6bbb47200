"""Start-up: rebuild the index from the last checkpoint and the journal after it.

:func:`replay` loads the checkpoint chain (or starts from nothing when it is missing or
damaged: the segments are the truth), then walks the journal's segments: those wholly before
the checkpoint's position only have their headers checked, the others are scanned record by
record (every CRC verified) and applied to the index. Along the way it removes what a crash
left behind (a segment compaction retired, a segment cut off while being created), cuts torn
or zero tails (durably, before later segments exist), and reports corruption before the tail
as a suspect segment (or refuses to start: see ``allow_suspect_segments``). The store then
opens a fresh segment after the last one.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Final

from pybk.errors import CorruptRecordError
from pybk.runtime import sometimes
from pybk.storage.checkpointer import Checkpointer
from pybk.storage.config import StoreConfig
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, Position
from pybk.storage.journal import parse_segment_name, segment_name
from pybk.storage.records import SEGMENT_HEADER_SIZE, Record, decode_segment_header
from pybk.storage.replay import SegmentScan, apply_record, scan_segment

__all__ = ["REPLAY_DAMAGE_AS_TORN_TAIL", "ReplayReport", "Replayed", "replay"]

_TORN_TAIL = sometimes.point(
    "storage.torn_tail_truncated", "start-up cut a journal segment's torn tail after a crash")

#: mutation switch (a name in ``StoreConfig.mutations``; registry: ``pybk.testing.mutations``):
#: replay takes damage in the middle of a segment (followed by valid batches) for a torn tail
#: and cuts the segment there, dropping the synced records after it
REPLAY_DAMAGE_AS_TORN_TAIL: Final = "replay_damage_as_torn_tail"


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
class Replayed:
    """The state start-up rebuilt."""

    index: Index
    #: segment seq -> its size (the sealed segments found)
    segments: dict[int, int]
    #: segments compaction retired that are still on disk
    dead: list[int]
    #: ``path@offset`` of each segment corrupt before its tail (started with
    #: ``allow_suspect_segments``)
    suspect: list[str]
    #: the sequence number of the segment to write next
    next_seq: int


async def replay(fs: FileSystem, journal_dir: str, instance_id: str, config: StoreConfig,
                 report: ReplayReport, checkpointer: Checkpointer) -> Replayed:
    """Rebuild the index (see the module docstring); raises CorruptRecordError when synced
    data is missing or damaged and the config does not allow starting over it."""
    fs.makedirs(journal_dir)
    names = fs.listdir(journal_dir)
    seqs = sorted(s for s in (parse_segment_name(n) for n in names) if s is not None)
    index: Index = Index()
    pos: Position | None = None
    dead: list[int] = []
    if checkpointer.scan():
        try:
            index, pos, dead, report.checkpoint_deltas = checkpointer.load()
            report.checkpoint_loaded = True
        except (CorruptRecordError, OSError) as exc:
            report.checkpoint_error = str(exc)
            index, pos, dead = Index(), None, []
    if pos is not None and pos.seg not in seqs:
        if any(s > pos.seg for s in seqs) or index.seg_live:
            raise CorruptRecordError(
                f"{journal_dir}: segment {segment_name(pos.seg)} named by the index "
                "checkpoint is missing: synced journal data is gone; refusing to start",
                path=_path(journal_dir, pos.seg), offset=pos.offset)
        pos = None  # an empty journal that was never written to after the checkpoint
    segments: dict[int, int] = {}
    suspect: list[str] = []
    for seq in seqs:
        path = _path(journal_dir, seq)
        if pos is not None and seq < pos.seg:
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
            check_header(fs, path, seq, instance_id)
            segments[seq] = fs.file_size(path)
            continue
        scan = _scan(fs, index, report, path, seq, pos, instance_id, config,
                     is_last=seq == seqs[-1])
        report.segments_scanned += 1
        if scan.torn_header:
            fs.delete(scan.path)
            report.leftovers_removed.append(scan.path)
            report.torn_tails += 1
            continue
        if scan.torn_bytes or scan.zero_tail:
            if scan.torn_bytes:
                _TORN_TAIL()
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
            suspect.append(f"{scan.path}@{scan.corruption.offset}")
            report.suspect_segments.append(str(scan.corruption))
        segments[seq] = scan.end if scan.corruption is None else scan.size
    if report.leftovers_removed:
        await fs.fsync_dir(journal_dir)
    for seq in list(index.seg_live):
        if seq not in segments:
            raise CorruptRecordError(
                f"{_path(journal_dir, seq)}: segment holding live entries is missing",
                path=_path(journal_dir, seq), offset=0)
    return Replayed(index, segments, [s for s in dead if s in segments], suspect,
                    max([*seqs, -1]) + 1)


def _path(journal_dir: str, seq: int) -> str:
    return posixpath.join(journal_dir, segment_name(seq))


def check_header(fs: FileSystem, path: str, seq: int, instance_id: str) -> None:
    """Refuse a segment whose header is not this bookie's segment ``seq``."""
    header = decode_segment_header(fs.pread(path, 0, SEGMENT_HEADER_SIZE), path)
    if header.seq != seq or header.instance_id != instance_id:
        raise CorruptRecordError(
            f"{path}: segment header (seq {header.seq}, instance {header.instance_id}) does "
            f"not match (seq {seq}, instance {instance_id})", path=path, offset=0)


def _scan(fs: FileSystem, index: Index, report: ReplayReport, path: str, seq: int,
          pos: Position | None, instance_id: str, config: StoreConfig, *,
          is_last: bool) -> SegmentScan:
    start = pos.offset if pos is not None and seq == pos.seg else None
    batch_seq = pos.batch_seq if start is not None and pos is not None else 0

    def apply(rec: Record, seg: int) -> None:
        apply_record(index, rec, seg)

    scan = scan_segment(
        fs, path, seq, instance_id, start=start, batch_seq=batch_seq, is_last=is_last,
        allow_suspect=config.allow_suspect_segments, apply=apply, put_entry=index.put_entry,
        damage_as_torn_tail=REPLAY_DAMAGE_AS_TORN_TAIL in config.mutations,
    )
    report.records_replayed += scan.records
    return scan
