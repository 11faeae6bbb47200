"""A log's backlog quota: how far its slowest durable cursor is behind, and what happens
past the quota (``LogConfig.backlog_quota_bytes`` / ``backlog_quota_seconds``).

The backlog is what the slowest cursor has not consumed, at segment granularity as Pulsar
measures it by default: the bytes of every segment not wholly consumed (completed ones from
the metadata, plus the writer's current segment when the writer asks) and the age of the
oldest of them (seconds since it was completed). A log without cursors has no backlog.

Past the quota, policy "refuse" makes the log's writer refuse appends
(BacklogQuotaExceededError) until a check finds the backlog under again; the writer checks
after each roll, on its housekeeping interval, and every ``backlog_check_interval`` while it
refuses, so a drained backlog lets it write again (Pulsar's time-based quota did not:
apache/pulsar#15609). Policy "evict" truncates the oldest backlog segments until the rest
fits; a cursor behind the truncation point skips ahead to it, as after retention.
"""

from __future__ import annotations

from dataclasses import dataclass

from pybk.logs.config import LogConfig
from pybk.logs.meta import COMPLETED, LogMetadata, SegmentInfo
from pybk.logs.position import Position
from pybk.logs.truncation import start_after

__all__ = ["Backlog", "BacklogStats", "evicted_segments", "has_backlog_quota", "measure_backlog",
           "plan_eviction"]


@dataclass(frozen=True)
class Backlog:
    """A log's backlog now: ``bytes`` and ``seconds`` behind the newest record,
    ``consumed_before`` (every record before it is consumed by every cursor; None: the
    log has no cursor, so no backlog) and ``over`` (why it is over the quota, or None)."""

    bytes: int = 0
    seconds: float = 0.0
    consumed_before: Position | None = None
    over: str | None = None


def has_backlog_quota(cfg: LogConfig) -> bool:
    """Whether the log has a backlog quota (in bytes, in age, or both)."""
    return cfg.backlog_quota_bytes is not None or cfg.backlog_quota_seconds is not None


@dataclass
class BacklogStats:
    """A writer's view of its log's backlog quota (``LogWriter.backlog``; the metrics of
    :class:`pybk.ops.backlog.BacklogCollector`): the last check's bytes and seconds behind,
    why appends are refused now (None: they are not), and counts since the writer opened."""

    bytes: int = 0
    seconds: float = 0.0
    refusing: str | None = None
    checks: int = 0
    refused_appends: int = 0
    evicted_segments: int = 0
    evicted_bytes: int = 0


def _unconsumed(md: LogMetadata, consumed_before: Position) -> list[SegmentInfo]:
    """The live segments a cursor still has to read (the in-progress one always)."""
    return [s for s in md.live_segments
            if s.state != COMPLETED or s.last_position is None
            or s.last_position >= consumed_before]


def _completed(segments: list[SegmentInfo]) -> list[SegmentInfo]:
    return [s for s in segments if s.state == COMPLETED and s.last_position is not None]


def measure_backlog(md: LogMetadata, consumed_before: Position | None, now_ms: int,
                    current_bytes: int = 0) -> Backlog:
    """The backlog of ``md`` for cursors consumed up to ``consumed_before`` (see the module
    doc); ``current_bytes``: what the writer has put in its current segment."""
    if consumed_before is None:
        return Backlog()
    left = _unconsumed(md, consumed_before)
    done = _completed(left)
    nbytes = sum(s.bytes for s in done) + current_bytes
    seconds = max(0.0, (now_ms - done[0].mtime_ms) / 1000) if done else 0.0
    cfg = md.config
    over = None
    if cfg.backlog_quota_bytes is not None and nbytes > cfg.backlog_quota_bytes:
        over = f"{nbytes} bytes behind, over the quota of {cfg.backlog_quota_bytes}"
    elif cfg.backlog_quota_seconds is not None and seconds > cfg.backlog_quota_seconds:
        over = (f"{seconds:.1f} s behind, over the quota of "
                f"{cfg.backlog_quota_seconds:g} s")
    return Backlog(nbytes, seconds, consumed_before, over)


def plan_eviction(md: LogMetadata, consumed_before: Position | None, now_ms: int,
                  current_bytes: int = 0) -> Position | None:
    """Where policy "evict" truncates now (the start of the first backlog segment kept), or
    None: within the quota, or nothing completed left to drop (the current segment stays)."""
    cfg = md.config
    if consumed_before is None or cfg.backlog_policy != "evict":
        return None
    done = _completed(_unconsumed(md, consumed_before))
    total = sum(s.bytes for s in done) + current_bytes
    drop = 0
    while drop < len(done) and (
        (cfg.backlog_quota_bytes is not None and total > cfg.backlog_quota_bytes)
        or (cfg.backlog_quota_seconds is not None
            and now_ms - done[drop].mtime_ms > cfg.backlog_quota_seconds * 1000)
    ):
        total -= done[drop].bytes
        drop += 1
    return start_after(md, done[:drop])


def evicted_segments(md: LogMetadata, consumed_before: Position,
                     before: Position) -> list[SegmentInfo]:
    """The backlog segments an eviction before ``before`` drops (for its counts)."""
    return [s for s in _completed(_unconsumed(md, consumed_before)) if s.seq < before.segment]
