"""The configuration swarm: each seed draws how its bookies and writers run.

A harness proves only the paths it runs, so every mode a production deployment can run is drawn
per seed (each knob from a stream of its own, so adding a knob does not move the others):

* the journal's sync mode: ``serial`` (a sync thread per batch), ``overlapped`` (a batch
  answered while the next syncs), ``inline`` (small batches synced on the loop's thread) and
  ``bookie`` (inline and overlapped: what ``pybk bookie`` runs);
* preallocated journal segments, frequent index checkpoints (mostly deltas), sync latency;
* the client's add path (``append`` or ``append_many``) and long polls (one bookie at a time
  or the whole ensemble), and the writer's LAC (immediate, or only piggybacked/at intervals);
* the bookies' storage engine: the journal's own or the db engine (``storage="db"``);
* the auditor's periodic bookie check: every 5 s, or every hour as in production (then a
  bookie loss the auditor's registry watch misses goes unnoticed for the rest of the run).

``SimConfig.describe()`` is the trace's header; ``coverage()`` names the markers the sweep's
coverage table counts, so a sweep shows that each configuration ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pybk.sim.cluster import derive_rng

__all__ = ["JOURNAL_MODES", "SimConfig"]

#: the journal's sync modes (see the module docstring)
JOURNAL_MODES = ("serial", "overlapped", "inline", "bookie")


@dataclass(frozen=True)
class SimConfig:
    """How one seed's bookies and writers run."""

    journal: str = "serial"
    #: journal segments made ahead as synced zeros and written in place (8 KiB: they rotate)
    preallocate: bool = False
    #: index checkpoints every 2 virtual seconds, mostly deltas
    checkpoints: bool = False
    #: how long an fsync takes (virtual seconds)
    sync_delay: float = 0.002
    #: overlapped journal: buffers of twice this many entries are split in two, and a synced
    #: batch of fewer is answered before the next write (production's 100 makes both rare
    #: at the simulator's loads: small values run the overlapping paths often)
    split_min: int = 2
    #: writers add entries in batches (``LedgerHandle.append_many``)
    batched_adds: bool = False
    #: long polls go to every bookie of the ensemble at once (``ClientConfig.
    #: long_poll_parallel``), else to one at a time (production's default). True here, so
    #: a scenario saved before the knob existed runs as it did
    parallel_long_polls: bool = True
    #: the bookies' storage engine ("journal" or "db", with a small write cache so flushes
    #: run often): db in one seed of four
    storage: str = "journal"
    #: the writer sends its LAC as soon as it moves and nothing follows (``ClientConfig.
    #: immediate_lac``, production's default), else only piggybacked and every explicit
    #: interval; drawn off in one seed of four
    immediate_lac: bool = True
    #: seconds that immediate LAC waits for an add to carry it (``ClientConfig.
    #: immediate_lac_delay``, as ``pybk.WAL`` sets it): 0, production's, in three seeds of four
    lac_delay: float = 0.0
    #: seconds between the simulated auditor's periodic bookie checks (it also checks on every
    #: registry change its watch reports): 5, or production's hour in half the seeds
    auditor_bookie_check: float = 5.0

    def __post_init__(self) -> None:
        if self.journal not in JOURNAL_MODES:
            raise ValueError(f"journal mode must be one of {JOURNAL_MODES}, not {self.journal!r}")
        if self.storage not in ("journal", "db"):
            raise ValueError(f"storage must be journal or db, not {self.storage!r}")
        if not 0 < self.auditor_bookie_check < float("inf"):
            raise ValueError(f"auditor_bookie_check must be a positive number of seconds, "
                             f"not {self.auditor_bookie_check!r}")

    @classmethod
    def draw(cls, seed: int) -> SimConfig:
        """The configuration of ``seed``: each knob from its own stream."""
        return cls(
            journal=derive_rng(seed, "journal").choices(JOURNAL_MODES, (2, 1, 1, 2))[0],
            preallocate=derive_rng(seed, "segments").random() < 0.5,
            checkpoints=derive_rng(seed, "checkpoints").random() < 0.5,
            sync_delay=derive_rng(seed, "sync").choice((0.0005, 0.002, 0.01)),
            split_min=derive_rng(seed, "split").choice((1, 1, 2, 4)),
            batched_adds=derive_rng(seed, "adds").random() < 0.3,
            # (production's default, one bookie at a time, in two seeds of three)
            parallel_long_polls=derive_rng(seed, "long_polls").random() < 1 / 3,
            storage="db" if derive_rng(seed, "storage").random() < 0.25 else "journal",
            immediate_lac=derive_rng(seed, "lac").random() >= 0.25,
            lac_delay=derive_rng(seed, "lac_delay").choice((0.0, 0.0, 0.0, 0.001)),
            auditor_bookie_check=3600.0 if derive_rng(seed, "auditor_check").random() < 0.5
            else 5.0,
        )

    @property
    def inline_syncs(self) -> bool:
        return self.journal in ("inline", "bookie")

    @property
    def overlapped(self) -> bool:
        return self.journal in ("overlapped", "bookie")

    def bookie_config(self, mutations: frozenset[str]) -> Any:
        """The BookieConfig every bookie of the run gets."""
        from pybk.bookie import BookieConfig
        from pybk.storage.store import INLINE_SYNC_ALWAYS

        # the garbage collector and the scrubber on a scale the runs reach (production: 30 s,
        # 10 s, 60 s, 1 h; a scrub pass an hour at 8 MiB/s)
        knobs: dict[str, Any] = {"mutations": mutations, "gc_interval": 2.0,
                                 "gc_min_ledger_age": 1.0, "gc_minor_interval": 4.0,
                                 "gc_major_interval": 12.0, "gc_compaction_rate": 1 << 20,
                                 "scrub_interval": 4.0, "scrub_rate": 1 << 20}
        if self.inline_syncs:
            knobs["journal_inline_sync_max"] = INLINE_SYNC_ALWAYS
        if self.overlapped:
            knobs.update(journal_overlap_syncs=True, journal_overlap_split_min=self.split_min)
        if self.preallocate:
            knobs.update(journal_preallocate=True, segment_size=8 << 10)
        if self.checkpoints:
            knobs.update(checkpoint_interval=2.0, checkpoint_delta_ratio=4.0,
                         checkpoint_max_deltas=8)
        if self.storage == "db":
            knobs.update(storage="db", db_write_cache_bytes=16 << 10,
                         db_read_ahead_bytes=8 << 10)
        return BookieConfig(**knobs)

    def describe(self) -> str:
        return (f"journal={self.journal}{'+preallocated' if self.preallocate else ''}"
                f"{' checkpoints=2s' if self.checkpoints else ''} sync_delay={self.sync_delay}"
                f"{f' split_min={self.split_min}' if self.overlapped else ''}"
                f" adds={'batched' if self.batched_adds else 'single'}"
                f" long_polls={'parallel' if self.parallel_long_polls else 'sequential'}"
                f"{' storage=db' if self.storage == 'db' else ''}"
                f"{'' if self.immediate_lac else ' lac=interval'}"
                f"{f' lac_delay={self.lac_delay:g}' if self.lac_delay else ''}"
                f"{f' auditor_check={self.auditor_bookie_check:g}s' if self.long_audits else ''}")

    @property
    def long_audits(self) -> bool:
        """The auditor's periodic bookie check outlasts a run (production's hour)."""
        return self.auditor_bookie_check >= 60.0

    def coverage(self) -> list[str]:
        """Coverage markers naming this configuration (one seed counts once per marker)."""
        out = [f"config_journal_{self.journal}",
               f"config_adds_{'batched' if self.batched_adds else 'single'}",
               f"config_long_polls_{'parallel' if self.parallel_long_polls else 'sequential'}",
               f"config_lac_{'immediate' if self.immediate_lac else 'interval'}"]
        if self.immediate_lac and self.lac_delay:
            out.append("config_lac_delayed")
        if self.preallocate:
            out.append("config_preallocated_segments")
        if self.checkpoints:
            out.append("config_frequent_checkpoints")
        if self.storage == "db":
            out.append("config_storage_db")
        out.append(f"config_auditor_check_{'long' if self.long_audits else 'short'}")
        return out

    def to_doc(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> SimConfig:
        return cls(**doc)
