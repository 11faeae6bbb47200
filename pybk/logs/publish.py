"""Publishing built segments: ledgers written elsewhere (:mod:`pybk.logs.builder`) become
completed segments at the end of a log, all of them in one compare-and-set of its metadata.

Why one CAS: a bulk writer (a Spark job of many tasks) must make everything it wrote visible
at once or not at all. Readers see a segment only once the log's metadata names it, so ledgers
that are not yet segments are invisible; the publish is the one moment they all appear.

The rules (docs/logs.md, "Publishing segments built elsewhere") (listed in docs/internals.md,
"pybk/logs/publish.py").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pybk.errors import (
    BKError,
    EndOfStreamError,
    LedgerFencedError,
    NoSuchLedgerError,
    UnexpectedConditionError,
    WriterConflictError,
)
from pybk.logs import envelope
from pybk.logs.builder import BuiltSegment
from pybk.logs.meta import COMPLETED, LogMetadata, SegmentInfo
from pybk.logs.position import Position
from pybk.logs.takeover import take_over
from pybk.logs.truncation import plan_retention, plan_truncation
from pybk.metadata.base import CLOSED
from pybk.runtime.eventloop import gather

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["MAX_SINKS", "PublishResult", "check_no_live_writer", "publish_segments"]

log = logging.getLogger(__name__)

#: sinks remembered per log (the least recently committed one is forgotten beyond this)
MAX_SINKS = 1000
#: ledgers checked at once before a publish
_CHECK_CONCURRENCY = 16


@dataclass(frozen=True)
class PublishResult:
    """What a publish did: ``segments`` are the log's segments holding the published records
    (for a replay of an ``origin``, the ones published the first time; for a replayed sink
    batch, none); ``published`` is False when nothing was added (a replay)."""

    segments: tuple[SegmentInfo, ...]
    published: bool

    @property
    def records(self) -> int:
        return sum(s.records for s in self.segments)

    @property
    def first_position(self) -> Position | None:
        for s in self.segments:
            if s.records:
                return Position(s.seq, 0, 0)
        return None

    @property
    def last_position(self) -> Position | None:
        for s in reversed(self.segments):
            pos = s.last_position
            if pos is not None:
                return pos
        return None


def check_no_live_writer(md: LogMetadata) -> None:
    """WriterConflictError when the log's tail is a writer's in-progress segment, or
    EndOfStreamError when it is ended: what a publish without ``fence_writer`` refuses (bulk
    writers check it before writing anything, too)."""
    if md.end_of_stream:
        raise EndOfStreamError(f"log {md.name!r} is marked ended; it takes no more records")
    tail = md.segments[-1] if md.segments else None
    if tail is not None and tail.in_progress:
        raise WriterConflictError(
            f"log {md.name!r} has an in-progress segment (ledger {tail.ledger_id}) of writer "
            f"{md.writer or 'unnamed'} (epoch {md.epoch}): a writer is live or died without "
            "closing, and segments are only published after its records. Close that writer, "
            "or publish with fence_writer=True to fence it and complete its segment first"
        )


async def publish_segments(
    cat: LogCatalog,
    built: Sequence[BuiltSegment],
    *,
    origin: str = "",
    sink: tuple[str, int] | None = None,
    fence_writer: bool = False,
    label: str = "publisher",
) -> PublishResult:
    """Add ``built`` (in order) as completed segments at the end of the log, in one CAS.

    ``origin``: a name for this publish kept on its segments (e.g. ``spark:<job id>``); a
    second publish with the same origin is a replay. ``sink``: ``(sink id, batch id)`` of a
    publisher of numbered batches; a batch id at or below the sink's last one is a replay.
    See the module doc for the rules."""
    items = list(built)
    for i, b in enumerate(items):
        if not isinstance(b, BuiltSegment):
            raise TypeError(f"publish takes BuiltSegments, item {i} is {type(b).__name__}")
    ids = [b.ledger_id for b in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"a ledger is named twice in {ids}")
    if not isinstance(origin, str):
        raise TypeError(f"origin must be a str, not {type(origin).__name__}")
    if sink is not None:
        sink_id, batch = sink
        if not isinstance(sink_id, str) or not sink_id:
            raise ValueError(f"sink id must be a non-empty str, got {sink_id!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
            raise ValueError(f"sink batch id must be an int >= 0, got {batch!r}")
    empty = [b for b in items if b.records == 0 or b.last_entry < 0]
    items = [b for b in items if b not in empty]
    await _check_ledgers(cat, items)

    epoch: int | None = None
    if fence_writer:
        epoch = (await take_over(cat, label, "while publishing")).epoch

    outcome: list[PublishResult] = []
    now = cat.now_ms()

    def transform(md: LogMetadata) -> LogMetadata | None:
        outcome.clear()
        known = {s.ledger_id: s for s in md.segments}
        present = [i for i in (b.ledger_id for b in items) if i in known]
        if items and present:
            if len(present) != len(items):
                raise UnexpectedConditionError(
                    f"log {md.name!r}: ledgers {present} of this publish are segments already "
                    "and the others are not"
                )
            outcome.append(PublishResult(tuple(known[i] for i in present), False))
            return None  # a CAS of ours that was applied, its reply lost
        if origin:
            mine = tuple(s for s in md.segments if s.origin == origin)
            if mine:
                outcome.append(PublishResult(mine, False))
                return None
        if sink is not None and sink[0] in md.sinks and md.sinks[sink[0]][0] >= sink[1]:
            outcome.append(PublishResult((), False))
            return None
        check_no_live_writer(md)
        max_txid = md.max_txid
        segs = tuple(
            SegmentInfo(seq=md.next_seq + i, ledger_id=b.ledger_id, state=COMPLETED,
                        last_entry=b.last_entry, last_slot=b.last_slot, records=b.records,
                        bytes=b.bytes, max_txid=max_txid, ctime_ms=now, mtime_ms=now,
                        origin=origin)
            for i, b in enumerate(items)
        )
        sinks = md.sinks
        if sink is not None:
            sinks = {**sinks, sink[0]: (sink[1], now)}
            if len(sinks) > MAX_SINKS:
                oldest = sorted(sinks, key=lambda k: sinks[k][1])[: len(sinks) - MAX_SINKS]
                sinks = {k: v for k, v in sinks.items() if k not in oldest}
        outcome.append(PublishResult(segs, True))
        if not segs and sinks == md.sinks:
            return None
        return md.with_changes(segments=(*md.segments, *segs),
                               next_seq=md.next_seq + len(segs), sinks=sinks)

    try:
        md = await cat.update(transform, epoch=epoch)
    except LedgerFencedError as exc:
        raise WriterConflictError(
            f"log {cat.name!r}: another writer took it over while publishing ({exc})"
        ) from exc
    result = outcome[0]
    if not result.published and items and not any(
            s.ledger_id == items[0].ledger_id for s in result.segments):
        await _delete_all(cat, [b.ledger_id for b in items])  # a replay's copies
    await _delete_all(cat, [b.ledger_id for b in empty])
    if result.published and result.segments:
        await _apply_retention(cat, md)
    return result


async def _check_ledgers(cat: LogCatalog, items: Sequence[BuiltSegment]) -> None:
    sem = asyncio.Semaphore(_CHECK_CONCURRENCY)

    async def one(b: BuiltSegment) -> None:
        async with sem:
            await _check_ledger(cat, b)

    await gather(*(one(b) for b in items))


async def _check_ledger(cat: LogCatalog, b: BuiltSegment) -> None:
    client = cat.client
    try:
        lmd = await client.ledger_metadata(b.ledger_id)
    except NoSuchLedgerError:
        raise ValueError(f"cannot publish ledger {b.ledger_id}: it does not exist") from None
    tag = lmd.custom_metadata.get("pybk.log")
    if tag != cat.key.encode():
        raise ValueError(f"cannot publish ledger {b.ledger_id} to log {cat.name!r}: it is "
                         f"tagged for {tag!r}, not {cat.key!r}")
    if lmd.state != CLOSED or lmd.last_entry_id != b.last_entry or lmd.length != b.bytes:
        raise ValueError(
            f"cannot publish ledger {b.ledger_id}: it is {lmd.state} with last entry "
            f"{lmd.last_entry_id} and {lmd.length} bytes, the description says closed at "
            f"{b.last_entry} with {b.bytes} bytes"
        )
    rh = await client.open_ledger(b.ledger_id, recovery=False)
    try:
        (entry,) = await rh.read(b.last_entry, b.last_entry)
    finally:
        await rh.close()
    h = envelope.decode_header(entry.data)
    if h.first_index + h.count != b.records or h.count - 1 != b.last_slot:
        raise ValueError(
            f"cannot publish ledger {b.ledger_id}: its last envelope ends at record "
            f"{h.first_index + h.count} (slot {h.count - 1}), the description says "
            f"{b.records} records (slot {b.last_slot})"
        )


async def _delete_all(cat: LogCatalog, ids: Sequence[int]) -> None:
    for lid in ids:
        try:
            await cat.delete_ledger(lid)
        except BKError as exc:
            log.warning("log %s: could not delete unpublished ledger %d: %s", cat.name, lid, exc)


async def _apply_retention(cat: LogCatalog, md: LogMetadata) -> None:
    before = plan_retention(md, cat.now_ms())
    if before is None:
        return
    md = await cat.update(lambda cur: plan_truncation(cur, before))
    await cat.purge_truncated(md)
