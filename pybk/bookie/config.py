"""The bookie's knobs: the storage engine's (inherited) plus the bookie's own.

Kept apart from :mod:`pybk.bookie.bookie` so the outermost layers (the CLI, the simulator,
LocalCluster) can build a configuration without pulling in the request handling.
"""

from __future__ import annotations

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

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.disk_usage_low_water <= self.disk_usage_threshold <= 1.0:
            raise ValueError(
                "BookieConfig needs 0 <= disk_usage_low_water <= disk_usage_threshold <= 1, got "
                f"{self.disk_usage_low_water!r} and {self.disk_usage_threshold!r}")


