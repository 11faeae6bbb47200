"""Compaction: rewrite journal segments whose ledgers are mostly deleted, then drop them.

Segments wholly behind the durable checkpoint whose live fraction is below a threshold are
scanned (every record verified), their live entries and their ledgers' metadata are appended
again through the journal, a checkpoint that no longer references them is written, and only
then are the old files deleted. The checkpoint names the segments it retired, so a crash
between the checkpoint and the deletion is finished at the next start. A deleted ledger's
DELETE record is carried forward whenever a segment that mentions the ledger goes: older
segments may still hold its entries, which a rebuild from the segments must not bring back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pybk.errors import CorruptRecordError
from pybk.runtime.eventloop import gather
from pybk.storage.records import (
    BATCH_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    RecordType,
    batch_at,
    decode_segment_header,
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
    iter_records,
)
from pybk.storage.replay import piggyback_lac

if TYPE_CHECKING:
    from pybk.storage.store import LedgerStore

__all__ = ["CompactionResult", "compact", "segment_usage"]


@dataclass
class CompactionResult:
    segments_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_freed: int = 0
    bytes_moved: int = 0  # bytes re-appended (live entries and ledger metadata)
    skipped_corrupt: list[int] = field(default_factory=list)


def segment_usage(store: LedgerStore) -> dict[int, tuple[int, int]]:
    """seq -> (live bytes, file bytes) for the sealed segments."""
    live = store.index.seg_live
    return {seq: (live.get(seq, 0), size) for seq, size in store.segments.sealed()}


async def compact(store: LedgerStore, threshold: float,
                  pace: Callable[[int], Awaitable[None]] | None = None) -> CompactionResult:
    """Rewrite ``store``'s sealed segments whose live fraction is below ``threshold`` (see
    the module docstring). Safe against a crash at any step. ``pace(nbytes)`` is awaited
    after each :data:`PACE_CHUNK` of live entries re-appended (the garbage collector's
    throttle); a wholly dead segment re-appends next to nothing."""
    result = CompactionResult()
    async with store.checkpointer.lock:
        cp = await store.checkpoint_under_lock()
        candidates = []
        retiring = store.segments.retiring
        for seq, (live, size) in segment_usage(store).items():
            if seq < cp.seg and seq not in retiring and live < threshold * max(size, 1):
                candidates.append((live / max(size, 1), seq))
        futs: list[Awaitable[None]] = []
        chosen: list[int] = []
        for _, seq in sorted(candidates):
            try:
                entries, mentioned = await _scan_live(store, seq)
            except (CorruptRecordError, OSError):
                result.skipped_corrupt.append(seq)
                continue
            chosen.append(seq)
            for chunk in _chunks(entries, PACE_CHUNK):
                nbytes = 0
                for data, tag in chunk:
                    if tag[5].deleted:  # (deleted while an earlier chunk was paced)
                        continue
                    futs.append(store.journal.append(data, tag))
                    nbytes += len(data)
                    result.entries_moved += 1
                result.bytes_moved += nbytes
                if pace is not None and nbytes:
                    await pace(nbytes)
            # the ledgers' metadata as it is now, after their last moved entry
            for data in _metadata_records(store, mentioned):
                futs.append(store.journal.append(data, None))
                result.bytes_moved += len(data)
        if not chosen:
            return result
        await gather(*futs)
        for seq in chosen:
            if store.index.seg_live.get(seq, 0):
                raise AssertionError(f"segment {seq} still referenced after compaction")
        store.segments.retire(chosen)
        await store.checkpoint_under_lock()  # durable index no longer points into them
        for seq in chosen:
            result.bytes_freed += store.segments.drop(seq)
            store.fs.delete(store.journal_path(seq))
        await store.fs.fsync_dir(store.journal_dir)
        store.segments.deleted(chosen)
        result.segments_compacted = chosen
    return result


#: a paced compaction re-appends at most this many bytes between two pauses (the journal's
#: batches stay small beside the writers' entries)
PACE_CHUNK = 256 << 10


def _chunks(items: list[tuple[bytes, Any]], limit: int) -> list[list[tuple[bytes, Any]]]:
    out: list[list[tuple[bytes, Any]]] = [[]]
    size = 0
    for item in items:
        if size >= limit:
            out.append([])
            size = 0
        out[-1].append(item)
        size += len(item[0])
    return out if out[0] else []


async def _scan_live(store: LedgerStore, seq: int
                     ) -> tuple[list[tuple[bytes, Any]], list[int]]:
    """Verify every batch of sealed segment ``seq`` (CorruptRecordError before anything is
    appended if one is damaged: a sealed segment ends with its last batch); its live entries
    as (record, journal tag) and the ledgers it mentions. The loop is given back every
    :data:`PACE_CHUNK` verified (a segment's checksums take tens of ms: writers go on)."""
    path = store.journal_path(seq)
    data = store.fs.read_file(path)
    header = decode_segment_header(data, path)
    if header.seq != seq or header.instance_id != store.instance_id:
        raise CorruptRecordError(f"{path}: segment header names segment {header.seq} of "
                                 f"instance {header.instance_id}", path=path, offset=0)
    view = memoryview(data)
    out: list[tuple[bytes, Any]] = []
    meta: dict[int, None] = {}  # the ledgers mentioned, in order
    index = store.index
    pos, expect, since = SEGMENT_HEADER_SIZE, 0, 0
    while pos < len(data):
        found = batch_at(data, pos)
        if found is None or found[0] != expect:
            raise CorruptRecordError(f"{path}: no valid batch {expect} at offset {pos} of a "
                                     "sealed segment", path=path, offset=pos)
        body = pos + BATCH_HEADER_SIZE
        for rec in iter_records(view[body : body + found[1]], body, path):
            if rec.rtype is RecordType.CHECKPOINT:
                continue  # (the only record of no ledger; a ledger id's sign means nothing)
            st = index.get(rec.ledger_id)
            if st is None:
                if index.is_deleted(rec.ledger_id):
                    meta[rec.ledger_id] = None  # its tombstone goes on
                continue
            if rec.rtype is RecordType.ENTRY:
                loc = st.entries.get(rec.entry_id)
                if loc is not None and loc[0] == seq and loc[1] == rec.offset:
                    entry = encode_entry(rec.data)
                    out.append((entry, (rec.ledger_id, rec.entry_id,
                                        piggyback_lac(rec.data), len(entry), None, st)))
            else:
                meta[rec.ledger_id] = None
        pos = body + found[1]
        expect += 1
        since += found[1]
        if since >= PACE_CHUNK:
            since = 0
            await asyncio.sleep(0)
    return out, list(meta)


def _metadata_records(store: LedgerStore, ledgers: list[int]) -> list[bytes]:
    """The records that carry ``ledgers``' state forward (a deleted one's tombstone; a held
    one's master key, fence and explicit LAC), from the index as it is now."""
    index = store.index
    out: list[bytes] = []
    for lid in ledgers:
        if index.is_deleted(lid):
            out.append(encode_delete(lid))
            continue
        st = index.ledgers[lid]
        if st.master_key is not None:
            out.append(encode_master_key(lid, st.master_key))
        if st.fenced:
            out.append(encode_fence(lid))
        if st.explicit_lac_body is not None:
            out.append(encode_explicit_lac(lid, st.explicit_lac, st.explicit_lac_body))
    return out
