"""The record envelope: many log records packed into one ledger entry.

Why: a ledger entry costs a request per replica, a journal record and an index slot on each
bookie; a 100-byte record alone in an entry would be dominated by that. The writer therefore
batches records into one *envelope* per entry (DistributedLog's ``EnvelopedEntryWriter``).

Layout (big-endian header of 32 bytes, then the stored body) (listed in docs/internals.md,
"pybk/logs/envelope.py").
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
    "KEY_OVERHEAD",
    "MAX_RAW_SIZE",
    "PER_RECORD_OVERHEAD",
    "Envelope",
    "EnvelopeHeader",
    "PackedEnvelope",
    "decode",
    "decode_header",
    "decode_packed",
    "encode",
    "encode_packed",
    "make_compressor",
]

MAGIC: Final = b"PE"
VERSION: Final = 1
#: the version of an envelope whose records carry keys (the KEYS flag)
VERSION_KEYS: Final = 2
VERSIONS: Final = (VERSION, VERSION_KEYS)
CODEC_NONE: Final = 0
CODEC_ZSTD: Final = 1
#: codec name -> codec id
CODECS: Final = {"none": CODEC_NONE, "zstd": CODEC_ZSTD}
_CODEC_MASK: Final = 0x07
FLAG_TXIDS: Final = 0x08
FLAG_KEYS: Final = 0x10
_KNOWN_FLAGS: Final = {VERSION: _CODEC_MASK | FLAG_TXIDS,
                       VERSION_KEYS: _CODEC_MASK | FLAG_TXIDS | FLAG_KEYS}

_HEADER = struct.Struct(">2sBBIQqI")  # magic, version, flags, count, first_index, max_txid, raw
_CRC = struct.Struct(">I")
HEADER_SIZE: Final = _HEADER.size + _CRC.size  # 32
#: raw body bytes per record besides its data: its length (and its txid when TXIDS is set)
PER_RECORD_OVERHEAD: Final = 4
TXID_OVERHEAD: Final = 8
#: raw body bytes per record for its key's length when KEYS is set (besides the key)
KEY_OVERHEAD: Final = 4
#: no envelope's body is larger than this, whatever its header claims (bounds decompression)
MAX_RAW_SIZE: Final = 64 << 20

_SWAP = sys.byteorder != "little"
assert array("I").itemsize == 4 and array("q").itemsize == 8, "unsupported platform"
assert array("i").itemsize == 4, "unsupported platform"


@dataclass(frozen=True, slots=True)
class EnvelopeHeader:
    """What the fixed header says (checked by :func:`decode_header`)."""

    codec: int
    has_txids: bool
    count: int
    first_index: int
    max_txid: int
    raw_size: int
    has_keys: bool = False


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded envelope: its header and its records (with their txids and keys or None)."""

    header: EnvelopeHeader
    records: list[bytes]
    txids: list[int | None] | None  # None when no record of the envelope has a txid
    keys: list[bytes | None] | None = None  # None when no record of the envelope has a key

    @property
    def count(self) -> int:
        return self.header.count


@dataclass(frozen=True, slots=True)
class PackedEnvelope:
    """A checked envelope whose body is left packed: offsets into ``body`` of each table, for
    callers that turn the body into columns without a Python object per record (the Spark
    reader builds Arrow arrays from it). ``keys_at``/``key_lengths_at``/``txids_at`` are -1
    when the envelope has no such table; ``records_at`` is where the records' bytes start."""

    header: EnvelopeHeader
    body: bytes
    txids_at: int
    key_lengths_at: int
    keys_at: int
    records_at: int

    def lengths(self) -> array[int]:
        """The records' lengths (uint32)."""
        return _array("I", self.body, 0, self.header.count)

    def key_lengths(self) -> array[int] | None:
        """The keys' lengths (int32, -1 for none), or None without keys."""
        if self.key_lengths_at < 0:
            return None
        return _array("i", self.body, self.key_lengths_at, self.header.count)


def _array(code: str, body: bytes, at: int, count: int) -> array[int]:
    out = array(code)
    out.frombytes(body[at : at + out.itemsize * count])
    if _SWAP:
        out.byteswap()
    return out


def make_compressor(codec: int) -> Any:
    """A compressor for ``codec`` (one per writer: zstd contexts are reused, not shared)."""
    if codec == CODEC_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=1)
    return None


def _le(values: array[int]) -> bytes:
    if _SWAP:
        values.byteswap()
    return values.tobytes()


def encode(
    records: Sequence[bytes],
    txids: Sequence[int] | None,
    first_index: int,
    max_txid: int,
    codec: int = CODEC_NONE,
    compressor: Any = None,
    keys: Sequence[bytes | None] | None = None,
) -> bytes:
    """One envelope holding ``records`` (``txids``: one per record, -1 for none, or None;
    ``keys``: one per record, None for none, or None when no record has a key).

    Compressed only when that makes it smaller. The caller has checked the sizes."""
    lengths = _le(array("I", map(len, records)))
    key_lengths = key_data = None
    if keys is not None and any(k is not None for k in keys):
        if len(keys) != len(records):
            raise ValueError(f"{len(records)} records but {len(keys)} keys")
        key_lengths = _le(array("i", (-1 if k is None else len(k) for k in keys)))
        key_data = b"".join(k for k in keys if k is not None)
    return encode_packed(len(records), lengths, b"".join(records), first_index, max_txid,
                         codec, compressor, txids=txids, key_lengths=key_lengths,
                         key_data=key_data)


def encode_packed(
    count: int,
    lengths: bytes | memoryview,
    data: bytes | memoryview,
    first_index: int,
    max_txid: int,
    codec: int = CODEC_NONE,
    compressor: Any = None,
    *,
    txids: Sequence[int] | None = None,
    key_lengths: bytes | memoryview | None = None,
    key_data: bytes | memoryview | None = None,
) -> bytes:
    """One envelope from records already packed: ``lengths`` is ``count`` uint32 little-endian
    lengths and ``data`` the records' bytes one after the other (``key_lengths``: ``count``
    int32 little-endian, -1 for none, and ``key_data`` the keys' bytes). Used by bulk writers
    that hold their records as columns (Arrow buffers); the caller has checked that the
    parts agree (:func:`encode` does it for lists of records)."""
    parts: list[bytes | memoryview] = [lengths]
    flags = 0
    version = VERSION
    if txids is not None:
        parts.append(_le(array("q", txids)))
        flags |= FLAG_TXIDS
    if key_lengths is not None:
        parts.append(key_lengths)
        parts.append(key_data if key_data is not None else b"")
        flags |= FLAG_KEYS
        version = VERSION_KEYS
    parts.append(data)
    raw_size = sum(map(len, parts))
    if codec == CODEC_ZSTD:
        if compressor is None:
            compressor = make_compressor(codec)
        raw = b"".join(parts)
        packed = compressor.compress(raw)
        if len(packed) < raw_size:
            parts = [packed]
            flags |= CODEC_ZSTD
        else:
            parts = [raw]
    head = _HEADER.pack(MAGIC, version, flags, count, first_index, max_txid, raw_size)
    crc = crc32c.crc32c(head)
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    return b"".join((head, _CRC.pack(crc), *parts))


def decode_header(data: bytes) -> EnvelopeHeader:
    """Check the fixed header and the CRC; CorruptRecordError naming what is wrong."""
    if len(data) < HEADER_SIZE:
        raise CorruptRecordError(f"log envelope: {len(data)} bytes, shorter than its header")
    magic, version, flags, count, first_index, max_txid, raw_size = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptRecordError(f"log envelope: bad magic {magic!r} (not a log record batch)")
    if version not in VERSIONS:
        raise CorruptRecordError(f"log envelope: unknown format version {version}")
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    view = memoryview(data)
    if crc32c.crc32c(view[HEADER_SIZE:], crc32c.crc32c(view[: _HEADER.size])) != crc:
        raise CorruptRecordError("log envelope: checksum mismatch")
    if flags & ~_KNOWN_FLAGS[version] or (flags & _CODEC_MASK) not in (CODEC_NONE, CODEC_ZSTD):
        raise CorruptRecordError(f"log envelope: unknown flags {flags:#x} (version {version})")
    if count < 1 or first_index < 0 or max_txid < -1 or raw_size > MAX_RAW_SIZE:
        raise CorruptRecordError(
            f"log envelope: impossible header (count {count}, first index {first_index}, "
            f"max txid {max_txid}, raw size {raw_size})"
        )
    return EnvelopeHeader(flags & _CODEC_MASK, bool(flags & FLAG_TXIDS), count, first_index,
                          max_txid, raw_size, bool(flags & FLAG_KEYS))


def decode_packed(data: bytes) -> PackedEnvelope:
    """Check a whole envelope (header, CRC, sizes, the tables adding up to the body) and
    return its raw body with the tables' offsets; CorruptRecordError on any damage."""
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
    table = n * (PER_RECORD_OVERHEAD + (TXID_OVERHEAD if h.has_txids else 0)
                 + (KEY_OVERHEAD if h.has_keys else 0))
    if table > len(body):
        raise CorruptRecordError(f"log envelope: {n} records cannot fit {len(body)} bytes")
    at = 4 * n
    txids_at = key_lengths_at = keys_at = -1
    if h.has_txids:
        txids_at = at
        at += 8 * n
    key_bytes = 0
    if h.has_keys:
        key_lengths_at = at
        klens = _array("i", body, at, n)
        if min(klens) < -1:
            raise CorruptRecordError("log envelope: a key length below -1")
        key_bytes = sum(k for k in klens if k > 0)
        at += 4 * n
        keys_at = at
        at += key_bytes
    total = sum(_array("I", body, 0, n))
    if at + total != len(body):
        raise CorruptRecordError(
            f"log envelope: record lengths add up to {total} and keys to {key_bytes}, the "
            f"body holds {len(body) - at + key_bytes} after its tables"
        )
    return PackedEnvelope(h, body, txids_at, key_lengths_at, keys_at, at)


def decode(data: bytes) -> Envelope:
    """Decode a whole envelope; CorruptRecordError on any damage or inconsistency."""
    p = decode_packed(data)
    body, n = p.body, p.header.count
    txids: list[int | None] | None = None
    if p.txids_at >= 0:
        ids = _array("q", body, p.txids_at, n)
        txids = [None if t < 0 else t for t in ids]
    keys: list[bytes | None] | None = None
    klens = p.key_lengths()
    if klens is not None:
        keys = []
        at = p.keys_at
        for k in klens:
            if k < 0:
                keys.append(None)
            else:
                keys.append(body[at : at + k])
                at += k
    records = [body[a:b] for a, b in pairwise(accumulate(p.lengths(), initial=p.records_at))]
    return Envelope(p.header, records, txids, keys)
