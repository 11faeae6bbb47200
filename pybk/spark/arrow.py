"""Arrow columns to envelopes and back, without a Python object per record.

Why: a Spark task hands its rows over as Arrow record batches, and a binary column there is
already what an envelope body needs: the values' bytes one after the other, with offsets from
which the lengths follow. So an envelope is cut from a batch with a few numpy operations on the
offsets and one slice of the data buffer, whatever the number of rows. Reading goes the other
way: an envelope's body becomes the data buffer of an Arrow binary array, its lengths the
offsets. (pyarrow and numpy come with the ``[spark]`` extra.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pybk.logs import envelope
from pybk.logs.envelope import PackedEnvelope

__all__ = ["READ_SCHEMA", "PackedChunk", "envelope_arrays", "pack_batch", "read_batch"]

#: the columns a read gives (Spark's DDL form is in pybk.spark.source)
READ_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("log", pa.string()),
    ("position", pa.string()), ("segment", pa.int64()), ("entry", pa.int64()),
    ("slot", pa.int64()),
])

_BINARY_LIKE = (pa.types.is_binary, pa.types.is_string, pa.types.is_large_binary,
                pa.types.is_large_string)


@dataclass(frozen=True)
class PackedChunk:
    """One envelope's worth of records, packed (see SegmentBuilder.add_packed)."""

    count: int
    lengths: bytes
    data: memoryview
    key_lengths: bytes | None
    key_data: bytes | memoryview | None


def is_binary_like(arrow_type: Any) -> bool:
    return any(check(arrow_type) for check in _BINARY_LIKE)


def _parts(arr: Any) -> tuple[np.ndarray[Any, Any], memoryview, np.ndarray[Any, Any] | None]:
    """Offsets (int64, n + 1, relative to the data view), the data, and validity (or None)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.large_binary())  # string -> binary is zero-copy; offsets widen
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype="<i8")[arr.offset : arr.offset + n + 1]
    data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
    base = int(offsets[0]) if n else 0
    valid = None
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return offsets - base, data[base:], valid


def pack_batch(
    batch: Any,
    value_column: str,
    key_column: str | None,
    flush_bytes: int,
    flush_records: int = 100_000,
    where: str = "",
) -> Iterator[PackedChunk]:
    """Cut a record batch into envelopes of about ``flush_bytes`` (records, with their keys
    and framing); ValueError when a value is null (``where`` says which partition)."""
    n = batch.num_rows
    if n == 0:
        return
    values = batch.column(batch.schema.get_field_index(value_column))
    voff, vdata, vvalid = _parts(values)
    if vvalid is not None:
        row = int(np.argmin(vvalid))
        raise ValueError(f"column '{value_column}' is null in row {row}{where}: a pybk record "
                         "is bytes; filter out or replace nulls before writing")
    vlen = np.diff(voff)
    sizes = vlen + envelope.PER_RECORD_OVERHEAD
    koff = kdata = klen = None
    if key_column is not None:
        keys = batch.column(batch.schema.get_field_index(key_column))
        if keys.null_count < n:
            koff, kdata, kvalid = _parts(keys)
            klen = np.diff(koff)
            if kvalid is not None:
                if np.any(klen[~kvalid] != 0):  # null slots spanning bytes: drop those bytes
                    keys = pc.if_else(keys.is_valid(), keys, pa.scalar(b"", keys.type))
                    koff, kdata, _ = _parts(keys)
                    klen = np.diff(koff)
                klen = np.where(kvalid, klen, -1)
            sizes = sizes + np.maximum(klen, 0) + envelope.KEY_OVERHEAD
    cum = np.concatenate(([0], np.cumsum(sizes)))
    i = 0
    while i < n:
        j = int(np.searchsorted(cum, cum[i] + flush_bytes, side="right")) - 1
        j = min(max(j, i + 1), i + flush_records, n)
        lengths = vlen[i:j].astype("<u4").tobytes()
        data = vdata[int(voff[i]) : int(voff[j])]
        key_lengths = key_data = None
        if klen is not None and koff is not None and kdata is not None:
            part = klen[i:j]
            if np.any(part >= 0):
                key_lengths = part.astype("<i4").tobytes()
                key_data = kdata[int(koff[i]) : int(koff[j])]
        yield PackedChunk(j - i, lengths, data, key_lengths, key_data)
        i = j


def envelope_arrays(p: PackedEnvelope, lo: int, hi: int) -> tuple[Any, Any]:
    """The (key, value) Arrow arrays of slots ``lo..hi-1`` of a decoded envelope."""
    n = p.header.count
    body = pa.py_buffer(p.body)
    lens = np.frombuffer(p.body, dtype="<u4", count=n)
    voff = np.concatenate(([0], np.cumsum(lens, dtype=np.int64))) + p.records_at
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(voff.astype(np.int32)),
                                                    body])
    klens = p.key_lengths()
    if klens is None:
        keys = pa.nulls(n, pa.binary())
    else:
        kl = np.frombuffer(klens, dtype=np.int32)
        valid = kl >= 0
        koff = np.concatenate(([0], np.cumsum(np.maximum(kl, 0), dtype=np.int64))) + p.keys_at
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
        keys = pa.Array.from_buffers(pa.binary(), n, [bitmap, pa.py_buffer(
            koff.astype(np.int32)), body], null_count=int(n - valid.sum()))
    if lo or hi != n:
        return keys.slice(lo, hi - lo), values.slice(lo, hi - lo)
    return keys, values


def read_batch(log_name: str, seq: int, parts: list[tuple[int, int, Any, Any]]) -> Any:
    """One record batch in READ_SCHEMA from ``(entry, first slot, keys, values)`` pieces of
    segment ``seq``."""
    keys = pa.concat_arrays([k for _, _, k, _ in parts])
    values = pa.concat_arrays([v for _, _, _, v in parts])
    n = len(values)
    entry = np.concatenate([np.full(len(v), e, dtype=np.int64) for e, _, _, v in parts])
    slot = np.concatenate([np.arange(s, s + len(v), dtype=np.int64) for _, s, _, v in parts])
    seg = pa.array(np.full(n, seq, dtype=np.int64))
    entry_a = pa.array(entry)
    slot_a = pa.array(slot)
    position = pc.binary_join_element_wise(
        pc.cast(seg, pa.string()), pc.cast(entry_a, pa.string()), pc.cast(slot_a, pa.string()),
        ":")
    logs = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                          pa.array([log_name])).cast(pa.string())
    return pa.RecordBatch.from_arrays([keys, values, logs, position, seg, entry_a, slot_a],
                                      schema=READ_SCHEMA)
