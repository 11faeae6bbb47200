"""The bookie's knobs: the storage engine's (inherited) plus the bookie's own.

Kept apart from :mod:`pybk.bookie.bookie` so the outermost layers (the CLI, the simulator,
LocalCluster) can build a configuration without pulling in the request handling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pybk.storage.store import StoreConfig

__all__ = ["BookieConfig"]


@dataclass
class BookieConfig(StoreConfig):
    """Bookie knobs: the storage engine's (inherited from StoreConfig, passed to it as they
    are) plus the bookie's own below."""

    #: disk usage fraction above which the bookie turns read-only ...
    disk_usage_threshold: float = 0.95
    #: ... and below which it becomes writable again
    disk_usage_low_water: float = 0.90
    #: how often the disk usage is checked (seconds, loop time); <= 0 disables the timer
    disk_check_interval: float = 10.0
    #: how often the index is checkpointed when the journal moved (seconds); <= 0: only on stop
    checkpoint_interval: float = 60.0
    #: a fence of a ledger this bookie does not hold is served only if the metadata holds the
    #: ledger (and its master key, when kept, matches): pybk.bookie.unknown. Needs the
    #: bookie's metadata store; off, any peer may fence (and so squat) ids not handed out yet
    check_unknown_ledgers: bool = True
    #: garbage collection (pybk.bookie.gc; docs/operations.md gives the reasoning): every this
    #: many seconds (loop time) a bookie with a metadata store deletes the ledgers the
    #: metadata no longer has, then compacts what is due; <= 0: only when asked
    gc_interval: float = 30.0
    #: a ledger this bookie first saw less than this many seconds ago is never collected
    gc_min_ledger_age: float = 10.0
    #: minor compaction: segments less than this fraction live, at most this often (s; 0: off)
    gc_minor_threshold: float = 0.2
    gc_minor_interval: float = 60.0
    #: major compaction: segments less than this fraction live, at most this often (s; 0: off)
    gc_major_threshold: float = 0.8
    gc_major_interval: float = 3600.0
    #: disk usage fraction from which collection and major compaction run at once, unpaced
    gc_disk_pressure: float = 0.85
    #: compaction re-appends live data at most this many bytes/s (0: unpaced)
    gc_compaction_rate: float = 16 << 20
    #: the local scrubber (pybk.bookie.scrubbing) verifies every stored entry at most this
    #: many bytes a second, damage marking its ledger under-replicated; 0: no scrubber
    scrub_rate: float = 8 << 20
    #: seconds between the scrubber's passes (the first one runs at start)
    scrub_interval: float = 3600.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("gc_interval", "gc_min_ledger_age", "gc_minor_interval",
                     "gc_major_interval", "gc_compaction_rate", "scrub_rate"):
            _number(self, name, 0.0 if name != "gc_interval" else -math.inf, math.inf)
        _number(self, "scrub_interval", 1e-3, math.inf)
        for name in ("gc_minor_threshold", "gc_major_threshold", "gc_disk_pressure"):
            _number(self, name, 0.0, 1.0)
        if not 0.0 <= self.disk_usage_low_water <= self.disk_usage_threshold <= 1.0:
            raise ValueError(
                "BookieConfig needs 0 <= disk_usage_low_water <= disk_usage_threshold <= 1, got "
                f"{self.disk_usage_low_water!r} and {self.disk_usage_threshold!r}")




def _number(config: object, name: str, low: float, high: float) -> None:
    value = getattr(config, name)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not low <= value <= high):
        raise ValueError(f"BookieConfig.{name} must be a number between {low} and {high}, "
                         f"got {value!r}")
