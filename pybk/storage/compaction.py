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

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pybk.errors import CorruptRecordError
from pybk.runtime.eventloop import gather
from pybk.storage.records import (
    Record,
    RecordType,
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
)
from pybk.storage.replay import piggyback_lac, scan_segment

if TYPE_CHECKING:
    from pybk.storage.store import LedgerStore

__all__ = ["CompactionResult", "compact", "segment_usage"]


@dataclass
class CompactionResult:
    segments_compacted: list[int] = field(default_factory=list)
    entries_moved: int = 0
    bytes_freed: int = 0
    skipped_corrupt: list[int] = field(default_factory=list)


def segment_usage(store: LedgerStore) -> dict[int, tuple[int, int]]:
    """seq -> (live bytes, file bytes) for the sealed segments."""
    out = {}
    for seq, size in sorted(store._segments.items()):
        if size >= 0:
            out[seq] = (store.index.seg_live.get(seq, 0), size)
    return out


async def compact(store: LedgerStore, threshold: float) -> CompactionResult:
    """Rewrite ``store``'s sealed segments whose live fraction is below ``threshold`` (see
    the module docstring). Safe against a crash at any step."""
    result = CompactionResult()
    async with store.checkpointer.lock:
        cp = await store._checkpoint_locked()
        candidates = []
        for seq, (live, size) in segment_usage(store).items():
            if seq < cp.seg and seq not in store._dead and live < threshold * max(size, 1):
                candidates.append((live / max(size, 1), seq))
        futs: list[Awaitable[None]] = []
        chosen: list[int] = []
        for _, seq in sorted(candidates):
            try:
                moved = _rewrite_segment(store, seq, futs)
            except (CorruptRecordError, OSError):
                result.skipped_corrupt.append(seq)
                continue
            chosen.append(seq)
            result.entries_moved += moved
        if not chosen:
            return result
        await gather(*futs)
        for seq in chosen:
            if store.index.seg_live.get(seq, 0):
                raise AssertionError(f"segment {seq} still referenced after compaction")
        store._dead.extend(chosen)
        await store._checkpoint_locked()  # durable index no longer points into them
        for seq in chosen:
            result.bytes_freed += store._segments.pop(seq)
            store.fs.delete(store.journal_path(seq))
        await store.fs.fsync_dir(store.journal_dir)
        store._dead = [s for s in store._dead if s not in chosen]
        result.segments_compacted = chosen
    return result


def _rewrite_segment(store: LedgerStore, seq: int, futs: list[Awaitable[None]]) -> int:
    """Verify every record of segment ``seq``; re-append its live entries and the current
    metadata of every ledger it mentions. Raises before appending anything if damaged."""
    records: list[Record] = []
    scan_segment(
        store.fs, store.journal_path(seq), seq, store.instance_id, start=None, batch_seq=0,
        is_last=False, allow_suspect=False, apply=lambda rec, _seg: records.append(rec),
    )
    out: list[tuple[bytes, Any]] = []
    meta: dict[int, None] = {}  # the ledgers mentioned, in order
    index = store.index
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
        futs.append(store.journal.append(data, tag))
    return sum(1 for _, tag in out if tag is not None)
