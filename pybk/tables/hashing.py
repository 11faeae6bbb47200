"""Which range of a table a key belongs to, as BookKeeper's table service decides it.

BookKeeper hashes a key with MurmurHash3 x64/128 (seed 383242705) and takes the first 64-bit
half as a signed value; a table's key space (all int64 values) is split into equal ranges
whose ids start at 1024, and a key goes to the range with the largest start at or below its
hash. The hash is written here (pure Python, no dependency) so embedded tables need nothing
from the ``tables`` extra.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

__all__ = [
    "FIRST_RANGE_ID",
    "KEY_HASH_SEED",
    "RangeSpec",
    "key_hash",
    "murmur3_x64_128",
    "range_for",
    "split_ranges",
]

KEY_HASH_SEED = 383242705
FIRST_RANGE_ID = 1024
_M64 = (1 << 64) - 1
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    k ^= k >> 33
    return k


def murmur3_x64_128(data: bytes, seed: int = 0) -> tuple[int, int]:
    """MurmurHash3 x64/128 of ``data``: its two 64-bit halves, unsigned."""
    n = len(data)
    h1 = h2 = seed & _M64
    nblocks = n // 16
    for i in range(nblocks):
        k1 = int.from_bytes(data[i * 16:i * 16 + 8], "little")
        k2 = int.from_bytes(data[i * 16 + 8:i * 16 + 16], "little")
        k1 = (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
        h1 ^= k1
        h1 = (_rotl(h1, 27) + h2) & _M64
        h1 = (h1 * 5 + 0x52DCE729) & _M64
        k2 = (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
        h2 ^= k2
        h2 = (_rotl(h2, 31) + h1) & _M64
        h2 = (h2 * 5 + 0x38495AB5) & _M64
    tail = data[nblocks * 16:]
    if len(tail) > 8:
        k2 = int.from_bytes(tail[8:], "little")
        k2 = (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64
        h2 ^= k2
    if tail:
        k1 = int.from_bytes(tail[:8], "little")
        k1 = (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64
        h1 ^= k1
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    return h1, h2


def key_hash(key: bytes) -> int:
    """The signed 64-bit routing hash of ``key`` (BookKeeper's)."""
    h = murmur3_x64_128(key, KEY_HASH_SEED)[0]
    return h - (1 << 64) if h >= 1 << 63 else h


@dataclass(frozen=True)
class RangeSpec:
    """One range of a table: its id and the hashes ``[start, end)`` it holds."""

    range_id: int
    start: int
    end: int


def split_ranges(count: int) -> list[RangeSpec]:
    """``count`` equal ranges covering every signed 64-bit hash, ids from 1024."""
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1024:
        raise ValueError(f"a table has 1-1024 ranges, not {count!r}")
    lo, span = -(1 << 63), 1 << 64
    bounds = [lo + span * i // count for i in range(count)] + [1 << 63]
    return [RangeSpec(FIRST_RANGE_ID + i, bounds[i], bounds[i + 1]) for i in range(count)]


def range_for(ranges: list[RangeSpec], key: bytes) -> RangeSpec:
    """The range holding ``key`` (``ranges`` sorted by start, as split_ranges makes them)."""
    starts = [r.start for r in ranges]
    return ranges[bisect.bisect_right(starts, key_hash(key)) - 1]
