"""Applying a log's retention: time, size and consumption by its durable cursors.

Run by the log's writer after each roll and every ``housekeeping_interval`` seconds of loop
time, by a cursor whose mark-delete position moved to a later segment, and by hand
(``Log.apply_retention``). The decision is :func:`pybk.logs.truncation.plan_retention`; the
consumption point is the smallest resume point of the log's cursors (read from their ledgers'
last confirmed entries, a lower bound of what they acknowledged), so a segment goes only
when every cursor is past it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybk.logs.cursor_meta import read_cursor_states
from pybk.logs.meta import LogMetadata
from pybk.logs.offload import delete_bookie_copies
from pybk.logs.position import Position
from pybk.logs.truncation import plan_retention, plan_truncation

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["apply_retention", "consumed_before", "housekeep"]

_FIRST = Position(1, 0, 0)


async def consumed_before(cat: LogCatalog, md: LogMetadata) -> Position | None:
    """Every record before it is consumed by every durable cursor (None: the log has no
    cursor, so nothing counts as consumed)."""
    states = await read_cursor_states(cat)
    if not states:
        return None
    floor = md.truncated_before if md.truncated_before is not None else _FIRST
    points = [s.resume_point() for s in states.values()]
    return min(floor if p is None else max(p, floor) for p in points)


async def apply_retention(cat: LogCatalog, *, epoch: int | None = None) -> LogMetadata:
    """Truncate what the log's retention lets go now; the metadata after it."""
    md = await cat.read()
    cfg = md.config
    if not cfg.retention_after_consumed and (
        cfg.retention_seconds is None and cfg.retention_bytes is None
    ):
        return md
    consumed = await consumed_before(cat, md) if cfg.retention_after_consumed else None
    before = plan_retention(md, cat.now_ms(), consumed)
    if before is None:
        return md
    md = await cat.update(lambda cur: plan_truncation(cur, before), epoch=epoch)
    return await cat.purge_truncated(md, epoch=epoch)


async def housekeep(cat: LogCatalog, *, epoch: int | None = None) -> LogMetadata:
    """One round of what runs on its own: retention, then deleting the bookies' copies of
    segments offloaded longer ago than the deletion lag."""
    md = await apply_retention(cat, epoch=epoch)
    if md.config.offload_url is not None:
        md = await delete_bookie_copies(cat, epoch=epoch)
    return md
