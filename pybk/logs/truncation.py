"""Truncation and retention as pure decisions on a log's metadata.

Truncating a log before a position is two steps (DistributedLog's, made durable in order):

1. one compare-and-set marks every segment wholly before the position ``truncated`` and
   records the position as the log's ``truncated_before``: from then on no reader returns a
   record before it (a segment holding the position is *partially* truncated: readers skip
   its records before the position);
2. the truncated segments' ledgers are deleted, then a second compare-and-set drops them from
   the list. A crash in between leaves ``truncated`` segments that the next writer (or the
   next truncation) purges; deleting a ledger twice is harmless.

Retention (a log's ``retention_seconds`` / ``retention_bytes``) is a truncation whose
position is the start of the first segment kept, chosen by :func:`plan_retention`.
"""

from __future__ import annotations

from pybk.logs.meta import COMPLETED, TRUNCATED, LogMetadata, SegmentInfo
from pybk.logs.position import Position

__all__ = ["oldest_beyond", "plan_retention", "plan_truncation", "start_after",
           "truncated_segments"]


def plan_truncation(md: LogMetadata, before: Position) -> LogMetadata | None:
    """The metadata after truncating before ``before``; None when nothing changes (the log
    is already truncated at or after it)."""
    if md.truncated_before is not None and before <= md.truncated_before:
        return None
    segments: list[SegmentInfo] = []
    for s in md.segments:
        if s.state == COMPLETED and _wholly_before(s, before):
            s = s.with_changes(state=TRUNCATED)
        segments.append(s)
    return md.with_changes(segments=tuple(segments), truncated_before=before)


def _wholly_before(s: SegmentInfo, before: Position) -> bool:
    if s.seq < before.segment:
        return True
    if s.seq > before.segment:
        return False
    last = s.last_position
    return last is None or last < before


def truncated_segments(md: LogMetadata) -> list[SegmentInfo]:
    """Segments whose ledgers are to be deleted."""
    return [s for s in md.segments if s.state == TRUNCATED]


def plan_retention(
    md: LogMetadata, now_ms: int, consumed_before: Position | None = None
) -> Position | None:
    """Where retention truncates now: the start of the first segment kept, or None.

    Only completed segments go, oldest first. Without ``retention_after_consumed``: those
    completed more than ``retention_seconds`` ago, then as many more as needed to bring the
    completed segments' bytes under ``retention_bytes``. With it, only segments wholly before
    ``consumed_before`` (every durable cursor is past them; None: nothing is consumed) are
    candidates, and of those the ones the age or size allows; with neither set, every
    consumed segment goes. The in-progress segment always stays."""
    cfg = md.config
    done = [s for s in md.live_segments if s.state == COMPLETED]
    if cfg.retention_after_consumed:
        n = 0
        while n < len(done) and consumed_before is not None and (
            done[n].last_position is None or done[n].last_position < consumed_before  # type: ignore[operator]
        ):
            n += 1
        if cfg.retention_seconds is None and cfg.retention_bytes is None:
            drop = n
        else:
            drop = oldest_beyond(done, now_ms, cfg.retention_seconds, cfg.retention_bytes,
                                 limit=n)
    elif cfg.retention_seconds is None and cfg.retention_bytes is None:
        return None
    else:
        drop = oldest_beyond(done, now_ms, cfg.retention_seconds, cfg.retention_bytes)
    return start_after(md, done[:drop])


def oldest_beyond(done: list[SegmentInfo], now_ms: int, seconds: float | None,
                  size: int | None, *, limit: int | None = None) -> int:
    """How many of the oldest ``done`` segments (at most ``limit``) are older than
    ``seconds`` (completed before it) or, after those, keep the rest over ``size`` bytes."""
    limit = len(done) if limit is None else limit
    drop = 0
    if seconds is not None:
        cutoff = now_ms - int(seconds * 1000)
        while drop < limit and done[drop].mtime_ms < cutoff:
            drop += 1
    if size is not None:
        total = sum(s.bytes for s in done[drop:])
        while drop < limit and total > size:
            total -= done[drop].bytes
            drop += 1
    return drop


def start_after(md: LogMetadata, dropped: list[SegmentInfo]) -> Position | None:
    """The start of the segment after the last of ``dropped`` (a truncation point), or None
    when nothing is dropped or the log is truncated there already."""
    if not dropped:
        return None
    before = Position(dropped[-1].seq + 1, 0, 0)
    if md.truncated_before is not None and before <= md.truncated_before:
        return None
    return before
