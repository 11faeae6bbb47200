"""The record envelope: many log records packed into one ledger entry.

Why: a ledger entry costs a request per replica, a journal record and an index slot on each
bookie; a 100-byte record alone in an entry would be dominated by that. The writer therefore
batches records into one *envelope* per entry (DistributedLog's ``EnvelopedEntryWriter``).

Layout (version 1, big-endian header of 32 bytes, then the stored body)::

    offset size field
         0    2 magic b"PE"
         2    1 format version (1); a reader refuses any other with CorruptRecordError
         3    1 flags: bits 0-2 codec (0 none, 1 zstd); bit 3 TXIDS (the body has txids)
         4    4 count: records in the envelope (>= 1)
         8    8 first_index: records before this envelope in its segment
        16    8 max_txid: the largest txid in the log up to this envelope (-1: none yet)
        24    4 raw_size: the body's length before compression
        28    4 CRC32C of bytes 0..27 and of the stored body
        32    . stored body (compressed with the codec, or raw)

The raw body is ``count`` record lengths (uint32, little-endian), then ``count`` txids (int64,
little-endian, -1 for a record without one) when TXIDS is set, then the records' bytes one
after the other. Lengths sit apart from the data so they are written and read as one array
(no per-record packing), which keeps the per-record cost of batching small.

``first_index`` and ``max_txid`` let a new writer complete a crashed writer's segment from its
last entry alone (its record count and the log's highest txid), without reading it through.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any, Final

import crc32c

from pybk.errors import CorruptRecordError

__all__ = [
    "CODECS",
    "CODEC_NONE",
    "CODEC_ZSTD",
    "HEADER_SIZE",
    "MAX_RAW_SIZE",
    "PER_RECORD_OVERHEAD",
    "Envelope",
    "EnvelopeHeader",
    "decode",
    "decode_header",
    "encode",
    "make_compressor",
]

MAGIC: Final = b"PE"
VERSION: Final = 1
CODEC_NONE: Final = 0
CODEC_ZSTD: Final = 1
#: codec name -> codec id
CODECS: Final = {"none": CODEC_NONE, "zstd": CODEC_ZSTD}
_CODEC_MASK: Final = 0x07
FLAG_TXIDS: Final = 0x08
_KNOWN_FLAGS: Final = _CODEC_MASK | FLAG_TXIDS

_HEADER = struct.Struct(">2sBBIQqI")  # magic, version, flags, count, first_index, max_txid, raw
_CRC = struct.Struct(">I")
HEADER_SIZE: Final = _HEADER.size + _CRC.size  # 32
#: raw body bytes per record besides its data: its length (and its txid when TXIDS is set)
PER_RECORD_OVERHEAD: Final = 4
TXID_OVERHEAD: Final = 8
#: no envelope's body is larger than this, whatever its header claims (bounds decompression)
MAX_RAW_SIZE: Final = 64 << 20

_SWAP = sys.byteorder != "little"
assert array("I").itemsize == 4 and array("q").itemsize == 8, "unsupported platform"


@dataclass(frozen=True, slots=True)
class EnvelopeHeader:
    """What the fixed header says (checked by :func:`decode_header`)."""

    codec: int
    has_txids: bool
    count: int
    first_index: int
    max_txid: int
    raw_size: int


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded envelope: its header and its records (with their txids or None)."""

    header: EnvelopeHeader
    records: list[bytes]
    txids: list[int | None] | None  # None when no record of the envelope has a txid

    @property
    def count(self) -> int:
        return self.header.count


def make_compressor(codec: int) -> Any:
    """A compressor for ``codec`` (one per writer: zstd contexts are reused, not shared)."""
    if codec == CODEC_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=1)
    return None


def encode(
    records: Sequence[bytes],
    txids: Sequence[int] | None,
    first_index: int,
    max_txid: int,
    codec: int = CODEC_NONE,
    compressor: Any = None,
) -> bytes:
    """One envelope holding ``records`` (``txids``: one per record, -1 for none, or None).

    Compressed only when that makes it smaller. The caller has checked the sizes."""
    count = len(records)
    lengths = array("I", map(len, records))
    if _SWAP:
        lengths.byteswap()
    flags = 0
    if txids is not None:
        ids = array("q", txids)
        if _SWAP:
            ids.byteswap()
        body = b"".join((lengths.tobytes(), ids.tobytes(), *records))
        flags |= FLAG_TXIDS
    else:
        body = lengths.tobytes() + b"".join(records)
    raw_size = len(body)
    if codec == CODEC_ZSTD:
        if compressor is None:
            compressor = make_compressor(codec)
        packed = compressor.compress(body)
        if len(packed) < raw_size:
            body = packed
            flags |= CODEC_ZSTD
    head = _HEADER.pack(MAGIC, VERSION, flags, count, first_index, max_txid, raw_size)
    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return b"".join((head, _CRC.pack(crc), body))


def decode_header(data: bytes) -> EnvelopeHeader:
    """Check the fixed header and the CRC; CorruptRecordError naming what is wrong."""
    if len(data) < HEADER_SIZE:
        raise CorruptRecordError(f"log envelope: {len(data)} bytes, shorter than its header")
    magic, version, flags, count, first_index, max_txid, raw_size = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptRecordError(f"log envelope: bad magic {magic!r} (not a log record batch)")
    if version != VERSION:
        raise CorruptRecordError(f"log envelope: unknown format version {version}")
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    view = memoryview(data)
    if crc32c.crc32c(view[HEADER_SIZE:], crc32c.crc32c(view[: _HEADER.size])) != crc:
        raise CorruptRecordError("log envelope: checksum mismatch")
    if flags & ~_KNOWN_FLAGS or (flags & _CODEC_MASK) not in (CODEC_NONE, CODEC_ZSTD):
        raise CorruptRecordError(f"log envelope: unknown flags {flags:#x}")
    if count < 1 or first_index < 0 or max_txid < -1 or raw_size > MAX_RAW_SIZE:
        raise CorruptRecordError(
            f"log envelope: impossible header (count {count}, first index {first_index}, "
            f"max txid {max_txid}, raw size {raw_size})"
        )
    return EnvelopeHeader(flags & _CODEC_MASK, bool(flags & FLAG_TXIDS), count, first_index,
                          max_txid, raw_size)


def decode(data: bytes) -> Envelope:
    """Decode a whole envelope; CorruptRecordError on any damage or inconsistency."""
    h = decode_header(data)
    body: bytes = bytes(memoryview(data)[HEADER_SIZE:])
    if h.codec == CODEC_ZSTD:
        import zstandard

        try:
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=h.raw_size)
        except zstandard.ZstdError as exc:
            raise CorruptRecordError(f"log envelope: zstd: {exc}") from None
    if len(body) != h.raw_size:
        raise CorruptRecordError(
            f"log envelope: body is {len(body)} bytes, header says {h.raw_size}"
        )
    n = h.count
    table = n * (PER_RECORD_OVERHEAD + (TXID_OVERHEAD if h.has_txids else 0))
    if table > len(body):
        raise CorruptRecordError(f"log envelope: {n} records cannot fit {len(body)} bytes")
    lengths = array("I")
    lengths.frombytes(body[: 4 * n])
    txids: list[int | None] | None = None
    start = 4 * n
    if h.has_txids:
        ids = array("q")
        ids.frombytes(body[start : start + 8 * n])
        if _SWAP:
            ids.byteswap()
        txids = [None if t < 0 else t for t in ids]
        start += 8 * n
    if _SWAP:
        lengths.byteswap()
    if start + sum(lengths) != len(body):
        raise CorruptRecordError(
            f"log envelope: record lengths add up to {sum(lengths)}, the body holds "
            f"{len(body) - start}"
        )
    records = [body[a:b] for a, b in pairwise(accumulate(lengths, initial=start))]
    return Envelope(h, records, txids)
