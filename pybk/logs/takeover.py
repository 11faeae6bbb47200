"""A new writer's takeover of a log: the writer lock, then recovery of what earlier writers left.

Two callers take a log over: a writer opening (:meth:`pybk.logs.LogWriter.open`) and a publish
that fences the writer (:mod:`pybk.logs.publish`). Both take the lock by CAS (the log's
epoch + 1) and then seal the in-progress segment with a recovery open of its ledger (fencing
the old writer), drop the ledgers it made ahead and finish a truncation it left half done.

Design notes: docs/internals.md, "pybk/logs/takeover.py".
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Final

from pybk.errors import (
    LedgerFencedError,
    MetadataVersionError,
    NoSuchLedgerError,
    WriterConflictError,
)
from pybk.logs import envelope
from pybk.logs.meta import COMPLETED, IN_PROGRESS, LogMetadata, SegmentInfo

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["SEGMENT_COMPLETED_AT_STALE_LAC", "take_over"]

#: mutation switch (a name in ``ClientConfig.mutations``; registry: ``pybk.testing.mutations``):
#: a new writer completes the segment it takes over at the LAC its bookies reported before
#: the recovery, not at the recovered last entry (the old writer's last acknowledged
#: records, not yet covered by a LAC, drop out of the log)
SEGMENT_COMPLETED_AT_STALE_LAC: Final = "segment_completed_at_stale_lac"


async def take_over(cat: LogCatalog, label: str, during: str) -> LogMetadata:
    """A new writer's takeover (a writer opening, or a publish that fences the writer): take
    the writer lock, recover what an earlier writer left; losing the log to yet another
    writer meanwhile is a WriterConflictError (``during`` says when, for its message)."""
    md = await _take_lock(cat, label)
    try:
        return await _recover(cat, md)
    except LedgerFencedError as exc:
        raise WriterConflictError(
            f"log {cat.name!r}: another writer took it over {during} ({exc})") from exc


async def _take_lock(cat: LogCatalog, label: str) -> LogMetadata:
    """Take the writer lock: the log's epoch + 1, by CAS. Losing the CAS to another writer
    that opened the log at the same time is WriterConflictError; losing it to any other
    change (a truncation, the old writer's roll) is retried."""
    for _ in range(100):
        md = await cat.read()
        new = md.with_changes(epoch=md.epoch + 1, writer=label)
        try:
            stored = await cat.store.write_value(cat.key, new.to_bytes(), md.version)
        except MetadataVersionError:
            current = await cat.read()
            if current.epoch != md.epoch:
                raise WriterConflictError(
                    f"log {cat.name!r}: writer {current.writer or 'unnamed'} opened it at the "
                    f"same time and holds it (epoch {current.epoch})"
                ) from None
            continue
        return LogMetadata.from_bytes(stored.value, stored.version)
    raise WriterConflictError(f"log {cat.name!r}: could not take the writer lock (contention)")


async def _recover(cat: LogCatalog, md: LogMetadata) -> LogMetadata:
    """Seal what earlier writers left: the in-progress segment (fenced, completed at its
    recovered end or deleted when empty), ledgers made ahead, a half-done truncation."""
    epoch = md.epoch
    for seg in [s for s in md.segments if s.state == IN_PROGRESS]:
        completed = await _recover_segment(cat, seg)
        if completed is None:
            await cat.delete_ledger(seg.ledger_id)
            md = await cat.update(partial(_drop_segment, seg.seq), epoch=epoch)
        else:
            md = await cat.update(partial(_put_segment, completed), epoch=epoch)
    if md.allocated:
        allocated = set(md.allocated)
        for lid in sorted(allocated):
            await cat.delete_ledger(lid)
        md = await cat.update(
            lambda cur: cur.with_changes(allocated=tuple(x for x in cur.allocated
                                                         if x not in allocated)),
            epoch=epoch,
        )
    return await cat.purge_truncated(md, epoch=epoch)


def _drop_segment(seq: int, md: LogMetadata) -> LogMetadata:
    return md.without_segments([seq])


def _put_segment(seg: SegmentInfo, md: LogMetadata) -> LogMetadata:
    return md.replace_segment(seg)


async def _recover_segment(cat: LogCatalog, seg: SegmentInfo) -> SegmentInfo | None:
    """Fence and seal one in-progress segment; its completed info, or None when empty."""
    stale: int | None = None
    try:
        if SEGMENT_COMPLETED_AT_STALE_LAC in cat.client.config.mutations:  # broken build
            stale = (await cat.client.open_ledger(seg.ledger_id, recovery=False)
                     ).last_add_confirmed
        rh = await cat.client.open_ledger(seg.ledger_id, recovery=True)
    except NoSuchLedgerError:
        return None
    last = rh.last_add_confirmed if stale is None else min(stale, rh.last_add_confirmed)
    if last < 0:
        return None
    (entry,) = await rh.read(last, last)
    header = envelope.decode_header(entry.data)
    return seg.with_changes(
        state=COMPLETED, last_entry=last, last_slot=header.count - 1,
        records=header.first_index + header.count, bytes=rh.length,
        max_txid=header.max_txid, mtime_ms=cat.now_ms(),
    )
