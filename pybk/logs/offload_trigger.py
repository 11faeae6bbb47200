"""When a log's segments go to its tier by themselves (Pulsar's automatic offload): a log
with ``offload_url`` and ``offload_threshold_bytes`` keeps at most that many bytes of
completed segments on the bookies, offloading the oldest beyond it; with
``offload_threshold_seconds``, segments completed longer ago go too. The writer asks after
each housekeeping round and runs one offload at a time beside its appends (an offload that
fails is tried again at the next round; one interrupted by a crash leaves objects that
``Log.sweep_tier`` removes). A pure decision, as retention's is."""

from __future__ import annotations

from pybk.logs.config import LogConfig
from pybk.logs.meta import BOOKIES, COMPLETED, LogMetadata
from pybk.logs.position import Position
from pybk.logs.truncation import oldest_beyond

__all__ = ["has_offload_trigger", "plan_offload"]


def has_offload_trigger(cfg: LogConfig) -> bool:
    """Whether the log offloads by itself."""
    return cfg.offload_url is not None and (
        cfg.offload_threshold_bytes is not None or cfg.offload_threshold_seconds is not None)


def plan_offload(md: LogMetadata, now_ms: int) -> Position | None:
    """Offload every completed segment before the position returned (None: nothing due)."""
    cfg = md.config
    if not has_offload_trigger(cfg):
        return None
    done = [s for s in md.live_segments
            if s.state == COMPLETED and s.last_entry >= 0 and s.tier == BOOKIES]
    n = oldest_beyond(done, now_ms, cfg.offload_threshold_seconds, cfg.offload_threshold_bytes)
    return None if n == 0 else Position(done[n - 1].seq + 1, 0, 0)
