"""The journal's read side at start-up: verify and scan segments, classify damage.

Because group commit is serial (journal.py), only the last batch of the *active* segment can
ever be unsynced when the process dies. Hence (listed in docs/internals.md,
"pybk/storage/replay.py").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pybk.errors import BookieStateError, CorruptRecordError
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index
from pybk.storage.records import (
    BATCH_HEADER_SIZE,
    LAC_IN_ENTRY_BODY,
    SEGMENT_HEADER_SIZE,
    Record,
    RecordType,
    batch_at,
    batch_items,
    decode_segment_header,
    find_valid_batch_after,
    iter_records,
)
from pybk.wire import ENTRY_HEADER_SIZE

__all__ = [
    "SegmentScan",
    "apply_record",
    "piggyback_lac",
    "scan_segment",
]


@dataclass
class SegmentScan:
    """What scanning one segment found."""

    seq: int
    path: str
    size: int
    end: int  # where valid data ends (== size unless torn or suspect)
    next_batch_seq: int
    batches: int = 0
    records: int = 0  # records applied (every record of every intact batch scanned)
    torn_bytes: int = 0  # bytes of torn tail to cut (last segment only)
    zero_tail: int = 0  # bytes of zeros to cut after the last batch (last segment only)
    torn_header: bool = False  # the segment was cut off while being created
    corruption: CorruptRecordError | None = None  # only when allowed (suspect segment)


def scan_segment(
    fs: FileSystem,
    path: str,
    seq: int,
    instance_id: str,
    *,
    start: int | None,
    batch_seq: int,
    is_last: bool,
    allow_suspect: bool,
    apply: Callable[[Record, int], None],
    put_entry: Callable[[int, int, tuple[int, int, int], int], None] | None = None,
    damage_as_torn_tail: bool = False,
) -> SegmentScan:
    """Verify segment ``seq`` and feed each record of each intact batch to ``apply``.

    ``start`` is the offset to scan from (None: just after the header); ``batch_seq`` the batch
    number expected there. ``put_entry``, when given, takes each ENTRY record instead of
    ``apply``, as ``Index.put_entry``'s arguments (what :func:`apply_record` would pass it),
    with no :class:`Record` made: replay's fast path (:func:`batch_items`); records of a batch
    are applied in their order either way. Raises CorruptRecordError / BookieStateError (see
    module doc).
    ``damage_as_torn_tail`` is a broken build (mutation switch REPLAY_DAMAGE_AS_TORN_TAIL in
    pybk.storage.store): a segment is cut at any bad batch, as if it were a torn tail, whether
    valid batches follow it or not and whichever segment it is."""
    data = fs.read_file(path)
    size = len(data)
    try:
        header = decode_segment_header(data, path)
    except CorruptRecordError:
        # A segment no longer than its header holds no record, so nothing acknowledged can be
        # in it: it was cut off while being created (a crash, or a start-up whose header sync
        # failed and left the file behind). Drop it wherever it is, not only at the end.
        if size <= SEGMENT_HEADER_SIZE:
            return SegmentScan(seq, path, size, 0, 0, torn_bytes=size, torn_header=True)
        raise
    if header.seq != seq:
        raise CorruptRecordError(
            f"{path}: segment header says sequence {header.seq}, file name says {seq}",
            path=path, offset=0)
    if header.instance_id != instance_id:
        raise BookieStateError(
            f"{path}: journal segment belongs to bookie instance {header.instance_id}, but this "
            f"data directory's cookie says {instance_id}: the directory was mixed up with "
            "another bookie's; refusing to start")
    pos = SEGMENT_HEADER_SIZE if start is None else start
    if pos > size:
        raise CorruptRecordError(
            f"{path}: segment is {size} bytes but the index checkpoint covers it up to offset "
            f"{pos}: synced journal data is missing", path=path, offset=size)
    scan = SegmentScan(seq, path, size, pos, batch_seq)
    expect = batch_seq
    while pos < size:
        found = batch_at(data, pos)
        if found is None or found[0] != expect:
            if is_last and data.count(0, pos) == size - pos:
                scan.zero_tail = size - pos
                break
            later = find_valid_batch_after(data, pos, expect)
            stale = _stale_batch(data, pos, found) if later is None and is_last else None
            if (later is None and is_last and stale is None) or damage_as_torn_tail:
                scan.torn_bytes = size - pos
                break
            what = (f"followed by a valid batch at offset {later}" if later is not None
                    else stale if stale is not None
                    else "in a segment that is not the last one")
            err = CorruptRecordError(
                f"{path}: corrupt journal batch at offset {pos} ({what}); this is not a torn "
                "tail: data that was synced is damaged", path=path, offset=pos)
            if not allow_suspect:
                raise err
            scan.corruption = err
            break
        _, length = found
        body_start = pos + BATCH_HEADER_SIZE
        if put_entry is None:
            payload = memoryview(data)[body_start : body_start + length]
            records = list(iter_records(payload, body_start, path))
            for rec in records:
                apply(rec, seq)
            scan.records += len(records)
        else:
            items = batch_items(data, body_start, body_start + length, seq, path)
            for item in items:
                if isinstance(item, Record):
                    apply(item, seq)
                else:
                    put_entry(*item)
            scan.records += len(items)
        pos = body_start + length
        expect += 1
        scan.batches += 1
    scan.end = pos
    scan.next_batch_seq = expect
    return scan


def _stale_batch(data: bytes, pos: int, found: tuple[int, int] | None) -> str | None:
    """What marks the bad end of the last segment as damage, not a torn tail: a complete,
    checksum-valid batch of another sequence number at or after ``pos``. A torn write leaves
    a prefix of the batch being written, never a whole batch numbered otherwise; a write that
    landed over the journal's last batch (misdirected I/O) does. None if there is none."""
    if found is not None:
        return f"a complete batch numbered {found[0]} stands there"
    hit = find_valid_batch_after(data, pos, 0)
    stale = batch_at(data, hit) if hit is not None else None
    if stale is None:
        return None
    return f"a complete batch numbered {stale[0]} follows at offset {hit}"


def apply_record(index: Index, rec: Record, seg: int) -> None:
    """What a replayed record of segment ``seg`` does to the index (start-up replay, and the
    offline rebuild of ``pybk.bookie.inspect``). Records of a deleted ledger do nothing: replay
    after a checkpoint can meet records written before the deletion the checkpoint holds."""
    t = rec.rtype
    if t is RecordType.ENTRY:  # (put_entry skips a deleted ledger)
        index.put_entry(rec.ledger_id, rec.entry_id, (seg, rec.offset, rec.size),
                        piggyback_lac(rec.data))
        return
    if t is RecordType.DELETE_LEDGER:
        index.delete_ledger(rec.ledger_id)
        return
    if t not in _LEDGER_META:
        return  # (a CHECKPOINT mark: nothing for the index)
    st = index.get(rec.ledger_id)
    if st is None:
        if index.is_deleted(rec.ledger_id):
            return
        st = index.ledger(rec.ledger_id)
    if t is RecordType.FENCE:
        st.fenced = True
    elif t is RecordType.MASTER_KEY:
        if st.master_key is None:
            st.master_key = rec.data
    elif rec.lac >= st.explicit_lac:  # EXPLICIT_LAC
        st.explicit_lac, st.explicit_lac_body = rec.lac, rec.data


#: the record types that set a held ledger's metadata
_LEDGER_META = frozenset((RecordType.MASTER_KEY, RecordType.FENCE, RecordType.EXPLICIT_LAC))


def piggyback_lac(body: bytes) -> int:
    """The LAC an entry body carries (-1 if its header cannot be read): what
    ``parse_entry_header(body)[2]`` says, with one unpack and no tuple of four ints."""
    if len(body) < ENTRY_HEADER_SIZE:
        return -1
    lac: int = LAC_IN_ENTRY_BODY.unpack_from(body)[0]
    return lac
