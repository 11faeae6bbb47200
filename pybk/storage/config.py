"""The storage engine's knobs (:class:`StoreConfig`) and the constants around them.

``pybk.bookie.BookieConfig`` extends :class:`StoreConfig` with the bookie's own knobs. A value
no store can run with is refused when the config is made, naming the knob.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Final

__all__ = [
    "INLINE_SYNC_ALWAYS", "JOURNAL_DIR", "MAX_MASTER_KEY_SIZE", "STORAGE_ENGINES", "StoreConfig",
]

#: the journal's directory inside a data directory
JOURNAL_DIR: Final = "journal"
#: the storage engines a bookie can run (``StoreConfig.storage``)
STORAGE_ENGINES: Final = ("journal", "db")

#: ``journal_inline_sync_max`` for a bookie alone on its event loop: every batch syncs inline.
INLINE_SYNC_ALWAYS: Final = sys.maxsize
#: the longest ledger master key a bookie records (BookKeeper's is a 20-byte digest of the
#: ledger's password; ``pybk.wire.master_key`` gives 32 bytes). Checkpoints hold a key's
#: length in 16 bits: a longer key taken from the network made every checkpoint fail
MAX_MASTER_KEY_SIZE: Final = 1024


@dataclass
class StoreConfig:
    """Storage knobs (``pybk.bookie.BookieConfig`` extends this with the bookie's own)."""

    #: group commit: keep gathering appends while they arrive, at most this long (seconds)
    journal_max_wait: float = 0.001
    journal_max_batch_bytes: int = 4 << 20
    journal_max_batch_count: int = 8192
    #: batches of at most this many records are synced on the loop's own thread (no thread
    #: hops). Set it only when the bookie is alone on its event loop (``pybk bookie`` sets
    #: :data:`INLINE_SYNC_ALWAYS`); 0, the default, keeps every sync off the loop's thread (on
    #: the helper process or sync thread, ``journal_sync_process``) so bookies sharing a loop
    #: (LocalCluster) overlap their syncs.
    journal_inline_sync_max: int = 0
    #: complete each journal batch (index updates, answers) while the next one syncs, and
    #: split a big buffer in two when there is nothing to complete meanwhile, so the disk and
    #: the loop work at the same time under load. Only pays where a sync can start while the
    #: loop is busy: a bookie that makes its own OS file system then syncs through a helper
    #: process (``pybk.storage.syncer``); ``pybk bookie`` turns it on.
    journal_overlap_syncs: bool = False
    #: run a journal's data syncs (``fdatasync``) in a helper process of its own
    #: (:mod:`pybk.storage.syncer`) rather than on a thread of this process. A sync thread
    #: must win the GIL from the event loop to start its ``fdatasync`` and again to report
    #: back; while the loop is busy, that wait is longer than the sync itself (measured here:
    #: an in-process cluster at 60k appends/s, the hand-offs' p50 0.4 ms, p90 1.3 ms around a
    #: 0.5 ms sync), and the journals' rounds, and so every append's latency, stretch with it.
    #: A helper needs no GIL: the loop sends a few bytes and reads the answer like any other
    #: I/O. On real files only (a memory or simulated file system has no such syncs); if the
    #: helper cannot be started the thread is used (logged). ``journal_overlap_syncs``
    #: implies it. Off: one sync thread per bookie, no extra process.
    journal_sync_process: bool = True
    #: overlapped journal: a buffer of at least twice this many entries is split in two when
    #: nothing is waiting to be completed (two cohorts of writers then take turns), and a
    #: synced batch of fewer is answered before the next write (see pybk.storage.journal;
    #: entries, not records: a batched add is one record of many entries)
    journal_overlap_split_min: int = 100
    #: an explicit LAC's journal record waits for the next batch (it is a hint for readers,
    #: learnt again from the entries after a crash), at most this long (seconds) before it is
    #: written on its own: a lone writer's journal syncs once per entry, not twice
    journal_lazy_wait: float = 0.005
    #: rotate the active journal segment past this size (bytes)
    segment_size: int = 64 << 20
    #: ... but the first segment after a start is only this long and each next one twice
    #: the last, up to ``segment_size`` (preallocated ones too): a bookie that holds a few
    #: records takes a few hundred KB, not ``segment_size``; 0: every segment full size
    segment_initial_size: int = 128 << 10
    #: make each journal segment ahead of use, ``segment_size`` bytes of synced zeros, and
    #: write it in place: each sync then flushes data only (no size or block-map change),
    #: about half the fdatasync time for a batch of tens of KB. Costs ``segment_size`` of disk
    #: per segment from the start and, when zero-filled, writing it twice; the first segment
    #: is made at start-up (~80 ms for 64 MiB here). ``pybk bookie`` turns it on.
    journal_preallocate: bool = False
    #: preallocated segments are zero-filled while the journal writes less than this many
    #: bytes/s, else only their blocks are reserved (posix_fallocate): the zeros would compete
    #: with the data for the disk (see pybk.storage.journal)
    journal_zero_fill_below: float = 96e6
    #: start even if a segment is corrupt mid-log (its data after the bad point is ignored and
    #: the segment is reported as suspect). Operator decision; off by default.
    allow_suspect_segments: bool = False
    #: compaction rewrites sealed segments whose live fraction is below this
    compaction_threshold: float = 0.5
    #: index checkpoints after a base are deltas (what changed) until the deltas add up to
    #: this fraction of the base's size or number ``checkpoint_max_deltas``; then a new base
    checkpoint_delta_ratio: float = 0.5
    checkpoint_max_deltas: int = 64
    #: the storage engine: "journal" (the journal is the entry store: LedgerStore) or "db"
    #: (write cache flushed into entry logs at checkpoints: DbLedgerStore)
    storage: str = "journal"
    #: db engine: flush the write cache (start a checkpoint) once it holds this many bytes
    db_write_cache_bytes: int = 64 << 20
    #: db engine: the read-ahead cache's bound in bytes
    db_read_ahead_bytes: int = 16 << 20
    #: names of deliberately broken behaviours (mutation switches) for checker tests, made
    #: by the outermost layer (``pybk.testing.Mutations``); empty in production
    mutations: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        """Refuse a knob no store can run with, naming it (a caller's mistake should not
        show up later as a journal that rotates for ever or a compaction of live data)."""
        _at_least(self, "journal_max_wait", 0.0)
        _at_least(self, "journal_max_batch_bytes", 1)
        _at_least(self, "journal_max_batch_count", 1)
        _at_least(self, "journal_inline_sync_max", 0)
        _at_least(self, "journal_overlap_split_min", 1)
        _at_least(self, "journal_lazy_wait", 0.0)
        _at_least(self, "segment_size", 1)
        _at_least(self, "segment_initial_size", 0)
        _at_least(self, "journal_zero_fill_below", 0.0)
        _at_least(self, "compaction_threshold", 0.0, 1.0)
        _at_least(self, "checkpoint_delta_ratio", 0.0)
        _at_least(self, "checkpoint_max_deltas", 0)
        _at_least(self, "db_write_cache_bytes", 1)
        _at_least(self, "db_read_ahead_bytes", 0)
        if self.storage not in STORAGE_ENGINES:
            raise ValueError(f"{type(self).__name__}.storage must be one of "
                             f"{', '.join(STORAGE_ENGINES)}, got {self.storage!r}")
        if not (isinstance(self.mutations, frozenset)
                and all(isinstance(m, str) for m in self.mutations)):
            raise TypeError(f"mutations must be a frozenset of switch names, not "
                            f"{self.mutations!r}")


def _at_least(config: object, name: str, low: float, high: float = math.inf) -> None:
    """ValueError unless ``config.<name>`` is a number (not a bool) in ``[low, high]``."""
    value = getattr(config, name)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not low <= value <= high):
        span = f"at least {low}" if high == math.inf else f"between {low} and {high}"
        raise ValueError(f"{type(config).__name__}.{name} must be a number {span}, "
                         f"got {value!r}")


