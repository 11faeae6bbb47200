"""On-disk framing of the journal: segment headers, batches and records.

A segment file is::

    segment header   magic "PYBKSEG\0", format version u16, segment seq u64,
                     bookie instance id (16 bytes), CRC32C u32 over the preceding bytes
    batch*           one per group commit (one write + one fdatasync)

A batch is::

    magic u32, batch seq u64 (0, 1, 2... within the segment), payload length u32,
    CRC32C u32 over the first 16 header bytes and the payload; then the payload = records

Design notes: docs/internals.md, "pybk/storage/records.py".
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import crc32c

from pybk.errors import CorruptRecordError
from pybk.wire import ENTRY_HEADER, ENTRY_HEADER_SIZE

__all__ = [
    "BATCH_HEADER",
    "BATCH_HEADER_SIZE",
    "BATCH_MAGIC",
    "FORMAT_VERSION",
    "MAX_RECORD_PAYLOAD",
    "RECORD_HEADER",
    "RECORD_HEADER_SIZE",
    "SEGMENT_HEADER_SIZE",
    "SEGMENT_MAGIC",
    "Record",
    "RecordType",
    "SegmentHeader",
    "batch_at",
    "batch_items",
    "decode_entry_at",
    "decode_record",
    "decode_segment_header",
    "encode_batch",
    "encode_checkpoint_mark",
    "encode_delete",
    "encode_entry",
    "encode_explicit_lac",
    "encode_fence",
    "encode_master_key",
    "encode_record",
    "encode_segment_header",
    "find_valid_batch_after",
    "iter_records",
]

SEGMENT_MAGIC: Final = b"PYBKSEG\x00"
#: The segment format this code writes and the only one it reads. Version 2: an ENTRY record's
#: payload is the framed entry body alone (its header already carries the ledger and entry ids).
FORMAT_VERSION: Final = 2
_SEG_BODY = struct.Struct(">8sHQ16s")
SEGMENT_HEADER_SIZE: Final = _SEG_BODY.size + 4

BATCH_MAGIC: Final = 0x50424B42  # "PBKB"
BATCH_HEADER = struct.Struct(">IQII")  # magic, batch seq, payload length, crc
BATCH_HEADER_SIZE: Final = BATCH_HEADER.size
_BATCH_PREFIX = struct.Struct(">IQI")
_BATCH_MAGIC_BYTES: Final = struct.pack(">I", BATCH_MAGIC)

RECORD_HEADER = struct.Struct(">IIB")  # payload length, crc(type + payload), type
RECORD_HEADER_SIZE: Final = RECORD_HEADER.size
_ENTRY_IDS = struct.Struct(">qq")
_LEDGER = struct.Struct(">q")
_LAC = struct.Struct(">qq")
_CHECKPOINT = struct.Struct(">QQ")

#: Largest record payload accepted (a guard against a corrupt length field).
MAX_RECORD_PAYLOAD: Final = 64 << 20


class RecordType(enum.IntEnum):
    """What a journal record means. Values are on disk: never renumber."""

    ENTRY = 1  # the framed entry body (whose header starts with ledger id, entry id)
    MASTER_KEY = 2  # ledger id, master key (ledger creation on this bookie)
    FENCE = 3  # ledger id
    EXPLICIT_LAC = 4  # ledger id, lac, digested LAC body
    DELETE_LEDGER = 5  # ledger id (tombstone)
    CHECKPOINT = 6  # segment seq, offset the index checkpoint covers (informational)


_TYPE_CRC: Final = {t: crc32c.crc32c(bytes([t])) for t in RecordType}
#: the member of each on-disk type value (a dict lookup: ``RecordType(v)`` goes through the
#: enum machinery, once per record replayed)
_TYPE_OF: Final = {int(t): t for t in RecordType}
ENTRY_CRC: Final = _TYPE_CRC[RecordType.ENTRY]
ENTRY_TYPE: Final = int(RecordType.ENTRY)
_pack_entry_header = RECORD_HEADER.pack
_crc32c = crc32c.crc32c


# --------------------------------------------------------------------------- segment header


def encode_segment_header(seq: int, instance_id: str) -> bytes:
    body = _SEG_BODY.pack(SEGMENT_MAGIC, FORMAT_VERSION, seq, uuid.UUID(instance_id).bytes)
    return body + struct.pack(">I", crc32c.crc32c(body))


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    seq: int
    instance_id: str


def decode_segment_header(data: bytes, path: str) -> SegmentHeader:
    """Parse a segment header. Raises CorruptRecordError (with ``path``) when it is damaged,
    short, or of a format version this code does not know (never guesses)."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise CorruptRecordError(
            f"{path}: segment header is {len(data)} bytes, expected {SEGMENT_HEADER_SIZE}",
            path=path,
            offset=0,
        )
    magic, version, seq, iid = _SEG_BODY.unpack_from(data)
    if magic != SEGMENT_MAGIC:
        raise CorruptRecordError(f"{path}: not a pybk journal segment (bad magic)", path=path,
                                 offset=0)
    if version != FORMAT_VERSION:
        raise CorruptRecordError(
            f"{path}: unknown journal format version {version} (this pybk reads version "
            f"{FORMAT_VERSION}); refusing to guess",
            path=path,
            offset=0,
        )
    (crc,) = struct.unpack_from(">I", data, _SEG_BODY.size)
    if crc != crc32c.crc32c(data[: _SEG_BODY.size]):
        raise CorruptRecordError(f"{path}: segment header checksum mismatch", path=path, offset=0)
    return SegmentHeader(int(seq), str(uuid.UUID(bytes=iid)))


# --------------------------------------------------------------------------- records


def encode_record(rtype: RecordType, payload: bytes) -> bytes:
    crc = crc32c.crc32c(payload, _TYPE_CRC[rtype])
    return RECORD_HEADER.pack(len(payload), crc, rtype) + payload


def encode_entry(body: bytes) -> bytes:
    """An ENTRY record: the framed body as it came from the client, whose header holds the
    ledger and entry ids (the caller has checked them). The hot path: one crc, one pack, one
    concatenation."""
    return _pack_entry_header(len(body), _crc32c(body, ENTRY_CRC), ENTRY_TYPE) + body


def encode_master_key(ledger_id: int, key: bytes) -> bytes:
    return encode_record(RecordType.MASTER_KEY, _LEDGER.pack(ledger_id) + key)


def encode_fence(ledger_id: int) -> bytes:
    return encode_record(RecordType.FENCE, _LEDGER.pack(ledger_id))


def encode_explicit_lac(ledger_id: int, lac: int, body: bytes) -> bytes:
    return encode_record(RecordType.EXPLICIT_LAC, _LAC.pack(ledger_id, lac) + body)


def encode_delete(ledger_id: int) -> bytes:
    return encode_record(RecordType.DELETE_LEDGER, _LEDGER.pack(ledger_id))


def encode_checkpoint_mark(seq: int, offset: int) -> bytes:
    return encode_record(RecordType.CHECKPOINT, _CHECKPOINT.pack(seq, offset))


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record; ``offset``/``size`` locate the whole framed record in its segment."""

    rtype: RecordType
    ledger_id: int
    entry_id: int  # ENTRY only (else -1)
    lac: int  # EXPLICIT_LAC only (else -1)
    data: bytes  # ENTRY: body; MASTER_KEY: key; EXPLICIT_LAC: body; else b""
    offset: int
    size: int


def decode_record(buf: bytes | memoryview, pos: int, end: int, path: str, base: int) -> Record:
    """Decode the record at ``buf[pos:]`` (which must end before ``end``). ``base`` is the file
    offset of ``buf[0]``. Raises CorruptRecordError naming the file offset."""
    where = base + pos
    if end - pos < RECORD_HEADER_SIZE:
        raise CorruptRecordError(f"{path}: truncated record header at offset {where}",
                                 path=path, offset=where)
    length, crc, rtype = RECORD_HEADER.unpack_from(buf, pos)
    start = pos + RECORD_HEADER_SIZE
    if length > end - start:
        raise CorruptRecordError(f"{path}: record at offset {where} overruns its batch",
                                 path=path, offset=where)
    payload = bytes(buf[start : start + length])
    kind = _TYPE_OF.get(rtype)
    if kind is None or crc32c.crc32c(payload, _TYPE_CRC[kind]) != crc:
        raise CorruptRecordError(f"{path}: record checksum mismatch at offset {where}",
                                 path=path, offset=where)
    return _parse_payload(kind, payload, where, RECORD_HEADER_SIZE + length, path)


_new = object.__new__
_record_slots: Any = vars(Record)  # (frozen: a replayed record's fields set through its slots)
_set_r_fields = tuple(_record_slots[name].__set__ for name in (
    "rtype", "ledger_id", "entry_id", "lac", "data", "offset", "size"))


def _record(rtype: RecordType, ledger_id: int, entry_id: int, lac: int, data: bytes,
            offset: int, size: int) -> Record:
    """``Record(...)`` without the frozen dataclass's ``__init__`` (an ``object.__setattr__``
    per field): made once per record replayed, at every start-up and inspection."""
    rec: Record = _new(Record)
    s_rtype, s_ledger, s_entry, s_lac, s_data, s_offset, s_size = _set_r_fields
    s_rtype(rec, rtype)
    s_ledger(rec, ledger_id)
    s_entry(rec, entry_id)
    s_lac(rec, lac)
    s_data(rec, data)
    s_offset(rec, offset)
    s_size(rec, size)
    return rec


def _parse_payload(rtype: RecordType, payload: bytes, where: int, size: int, path: str) -> Record:
    try:
        if rtype is RecordType.ENTRY:
            lid, eid = _ENTRY_IDS.unpack_from(payload)
            return _record(rtype, lid, eid, -1, payload, where, size)
        if rtype is RecordType.EXPLICIT_LAC:
            lid, lac = _LAC.unpack_from(payload)
            return _record(rtype, lid, -1, lac, payload[_LAC.size :], where, size)
        if rtype is RecordType.CHECKPOINT:
            seq, off = _CHECKPOINT.unpack_from(payload)
            return _record(rtype, -1, seq, off, b"", where, size)
        (lid,) = _LEDGER.unpack_from(payload)
        data = payload[_LEDGER.size :] if rtype is RecordType.MASTER_KEY else b""
        return _record(rtype, lid, -1, -1, data, where, size)
    except struct.error:
        raise CorruptRecordError(f"{path}: malformed {rtype.name} record at offset {where}",
                                 path=path, offset=where) from None


ENTRY_RECORD_IDS = struct.Struct(">IIBqq")  # record header, then the body's ledger, entry ids


#: the piggybacked LAC in an entry body's header (ledger id, entry id, lac, length: ``>qqqq``);
#: what replay.piggyback_lac reads too
LAC_IN_ENTRY_BODY = struct.Struct(">16xq")
assert ENTRY_HEADER.format == ">qqqq" and LAC_IN_ENTRY_BODY.size == 24


def batch_items(data: bytes, pos: int, end: int, seg: int, path: str,
                ) -> list[tuple[int, int, tuple[int, int, int], int] | Record]:
    """The records of the batch payload ``data[pos:end]`` (``data``: a whole segment file, so
    positions are file offsets), all decoded before the caller applies any (a corrupt
    record refuses its batch whole, as :func:`iter_records` into a list does).

    Replay's fast path: an ENTRY record comes back as the arguments of
    ``Index.put_entry`` (ledger id, entry id, location ``(seg, offset, size)``, the LAC its
    body piggybacks) with no :class:`Record` made; any other record, or an ENTRY record
    the one-unpack check does not pass, goes through :func:`decode_record` (which raises
    what it raises for any record)."""
    items: list[tuple[int, int, tuple[int, int, int], int] | Record] = []
    append = items.append
    view = memoryview(data)
    unpack = ENTRY_RECORD_IDS.unpack_from
    lac_of = LAC_IN_ENTRY_BODY.unpack_from
    ids_end = ENTRY_RECORD_IDS.size
    while pos < end:
        if end - pos >= ids_end:
            length, crc, rtype, lid, eid = unpack(data, pos)
            start = pos + RECORD_HEADER_SIZE
            stop = start + length
            if (rtype == ENTRY_TYPE and _ENTRY_IDS.size <= length and stop <= end
                    and _crc32c(view[start:stop], ENTRY_CRC) == crc):
                lac = lac_of(data, start)[0] if length >= ENTRY_HEADER_SIZE else -1
                append((lid, eid, (seg, pos, stop - pos), lac))
                pos = stop
                continue
        rec = decode_record(data, pos, end, path, 0)
        append(rec)
        pos += rec.size
    return items


def decode_entry_in(data: bytes, pos: int, size: int, path: str, offset: int, ledger_id: int,
                    entry_id: int) -> bytes:
    """:func:`decode_entry_at` of the record at ``data[pos:pos + size]`` (read from file
    offset ``offset``), without slicing it out first: the body is the one copy made."""
    if size >= ENTRY_RECORD_IDS.size and pos + size <= len(data):
        length, crc, rtype, lid, eid = ENTRY_RECORD_IDS.unpack_from(data, pos)
        if (rtype == ENTRY_TYPE and length == size - RECORD_HEADER_SIZE and lid == ledger_id
                and eid == entry_id):
            body = data[pos + RECORD_HEADER_SIZE:pos + size]
            if _crc32c(body, ENTRY_CRC) == crc:
                return body
    return decode_entry_at(data[pos:pos + size], path, offset, ledger_id, entry_id)


def decode_entry_at(data: bytes | memoryview, path: str, offset: int, ledger_id: int,
                    entry_id: int) -> bytes:
    """Verify the ENTRY record read from ``offset`` and return its body.

    Any mismatch (length, CRC, type, ids) raises CorruptRecordError: the index said the entry is
    there, so a bad record is corruption, never absence (rule R2). The read path: the common
    case (a well-formed ENTRY record of the right ids) is checked with one unpack and one
    CRC, no record object; anything else goes through :func:`decode_record` for its error."""
    n = len(data)
    if n >= ENTRY_RECORD_IDS.size:
        length, crc, rtype, lid, eid = ENTRY_RECORD_IDS.unpack_from(data)
        if (rtype == ENTRY_TYPE and length == n - RECORD_HEADER_SIZE and lid == ledger_id
                and eid == entry_id):
            body = bytes(data[RECORD_HEADER_SIZE:])
            if _crc32c(body, ENTRY_CRC) == crc:
                return body
    if len(data) < RECORD_HEADER_SIZE:
        raise CorruptRecordError(f"{path}: short read of entry at offset {offset}",
                                 path=path, offset=offset)
    rec = decode_record(data, 0, len(data), path, offset)
    if rec.rtype is not RecordType.ENTRY or rec.ledger_id != ledger_id or (
        rec.entry_id != entry_id
    ):
        raise CorruptRecordError(
            f"{path}: record at offset {offset} is not entry ({ledger_id}, {entry_id})",
            path=path, offset=offset,
        )
    if rec.size != len(data):
        raise CorruptRecordError(f"{path}: entry at offset {offset} has the wrong length",
                                 path=path, offset=offset)
    return rec.data


# --------------------------------------------------------------------------- batches


def encode_batch(seq: int, payload: bytes) -> bytes:
    crc = crc32c.crc32c(payload, crc32c.crc32c(_BATCH_PREFIX.pack(BATCH_MAGIC, seq, len(payload))))
    return b"".join((BATCH_HEADER.pack(BATCH_MAGIC, seq, len(payload), crc), payload))


def batch_at(data: bytes | memoryview, pos: int) -> tuple[int, int] | None:
    """If a complete, checksum-valid batch starts at ``pos``: (batch seq, payload length).
    Otherwise None (torn, garbage, zeros or corrupt: the caller decides which)."""
    if len(data) - pos < BATCH_HEADER_SIZE:
        return None
    magic, seq, length, crc = BATCH_HEADER.unpack_from(data, pos)
    if magic != BATCH_MAGIC:
        return None
    start = pos + BATCH_HEADER_SIZE
    if length > len(data) - start:
        return None
    prefix = _BATCH_PREFIX.pack(magic, seq, length)
    if crc32c.crc32c(data[start : start + length], crc32c.crc32c(prefix)) != crc:
        return None
    return int(seq), int(length)


def find_valid_batch_after(data: bytes, pos: int, min_seq: int) -> int | None:
    """Offset of the first valid batch with seq >= ``min_seq`` strictly after ``pos``, or None.

    Replay uses this to tell a torn tail (nothing valid follows) from mid-log corruption (a
    good batch follows a bad one)."""
    start = pos + 1
    while True:
        hit = data.find(_BATCH_MAGIC_BYTES, start)
        if hit < 0:
            return None
        found = batch_at(data, hit)
        if found is not None and found[0] >= min_seq:
            return hit
        start = hit + 1


def iter_records(payload: bytes | memoryview, base: int, path: str) -> Iterator[Record]:
    """Records of a batch payload that starts at file offset ``base``."""
    pos = 0
    end = len(payload)
    while pos < end:
        rec = decode_record(payload, pos, end, path, base)
        yield rec
        pos += rec.size
