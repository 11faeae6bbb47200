"""Applying a log's retention (time, size and consumption by its durable cursors) and its
backlog quota's eviction (pybk.logs.backlog).

Run by the log's writer after each roll and every ``housekeeping_interval`` seconds of loop
time, by a cursor whose mark-delete position moved to a later segment, and by hand
(``Log.apply_retention``). The decision is :func:`pybk.logs.truncation.plan_retention`; the
consumption point is the smallest resume point of the log's cursors (read from their ledgers'
last confirmed entries, a lower bound of what they acknowledged), so a segment goes only
when every cursor is past it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pybk.logs.backlog import (
    Backlog,
    evicted_segments,
    has_backlog_quota,
    measure_backlog,
    plan_eviction,
)
from pybk.logs.cursor_meta import read_cursor_states
from pybk.logs.meta import LogMetadata
from pybk.logs.offload import delete_bookie_copies
from pybk.logs.position import Position
from pybk.logs.truncation import plan_retention, plan_truncation

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["Eviction", "apply_retention", "consumed_before", "housekeep", "retain"]

log = logging.getLogger(__name__)

_FIRST = Position(1, 0, 0)


@dataclass(frozen=True)
class Eviction:
    """What one backlog eviction dropped: segments, their bytes, and the new start."""

    segments: int
    bytes: int
    before: Position


async def consumed_before(cat: LogCatalog, md: LogMetadata) -> Position | None:
    """Every record before it is consumed by every durable cursor (None: the log has no
    cursor, so nothing counts as consumed)."""
    states = await read_cursor_states(cat)
    if not states:
        return None
    floor = md.truncated_before if md.truncated_before is not None else _FIRST
    points = [s.resume_point() for s in states.values()]
    return min(floor if p is None else max(p, floor) for p in points)


async def retain(cat: LogCatalog, *, epoch: int | None = None,
                 current_bytes: int = 0) -> tuple[LogMetadata, Backlog, Eviction | None]:
    """Retention, then the backlog quota's eviction (policy "evict"), as one truncation; the
    metadata after it, the backlog left (pybk.logs.backlog; ``current_bytes``: what the
    writer holds in its current segment) and what eviction dropped (None: nothing)."""
    md = await cat.read()
    cfg = md.config
    quota = has_backlog_quota(cfg)
    if not (cfg.retention_after_consumed or quota) and (
        cfg.retention_seconds is None and cfg.retention_bytes is None
    ):
        return md, Backlog(), None
    consumed = await consumed_before(cat, md) if cfg.retention_after_consumed or quota else None
    now = cat.now_ms()
    before = plan_retention(md, now, consumed if cfg.retention_after_consumed else None)
    evict = plan_eviction(md, consumed, now, current_bytes) if quota else None
    evicted = None
    if evict is not None and (before is None or evict > before):
        assert consumed is not None  # (an eviction needs cursors)
        gone = evicted_segments(md, consumed, evict)
        evicted = Eviction(len(gone), sum(s.bytes for s in gone), evict)
        before = evict
        log.warning("log %s: backlog over its quota: %d segments (%d bytes) evicted, "
                    "cursors behind skip to %s", cat.name, evicted.segments, evicted.bytes,
                    evict)
    if before is not None:
        cut = before
        md = await cat.update(lambda cur: plan_truncation(cur, cut), epoch=epoch)
        md = await cat.purge_truncated(md, epoch=epoch)
    backlog = measure_backlog(md, consumed, now, current_bytes) if quota else Backlog()
    return md, backlog, evicted


async def apply_retention(cat: LogCatalog, *, epoch: int | None = None) -> LogMetadata:
    """Truncate what the log's retention (and backlog eviction) lets go now; the metadata
    after it."""
    return (await retain(cat, epoch=epoch))[0]


async def housekeep(cat: LogCatalog, *, epoch: int | None = None, current_bytes: int = 0,
                    ) -> tuple[LogMetadata, Backlog, Eviction | None]:
    """One round of what runs on its own: retention and the backlog quota (see
    :func:`retain`), then deleting the bookies' copies of segments offloaded longer ago than
    the deletion lag."""
    md, backlog, evicted = await retain(cat, epoch=epoch, current_bytes=current_bytes)
    if md.config.offload_url is not None:
        md = await delete_bookie_copies(cat, epoch=epoch)
    return md, backlog, evicted
