"""Mutation switches: deliberately broken behaviours, off unless a test hands them in.

The simulator's checker and the protocol tests must be able to fail. Each switch re-introduces
one real BookKeeper-class bug at one place in the protocol code, and a test turns it on to
show that its checks catch the bug. The production code that consults a switch declares its
name next to the code it breaks (``pybk.storage.store.ACK_BEFORE_FSYNC``, ...) and reads it
once, when it is built, from the ``mutations`` frozenset of the config it already takes
(``StoreConfig.mutations``, ``ClientConfig.mutations``, the memory store's
``PolledDelivery.mutations``): nothing reads them from the
environment or from global state, so two clusters in one process can run with different
switches, and production code never imports this module.

This module is the registry, for the outermost layers that make configs (the simulator's
runner, the command line, tests): :data:`KNOWN` lists every switch, and :class:`Mutations`
is the frozenset a config takes, refusing names nobody consults (a typo would otherwise test
nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from pybk.bookie.gc import GC_IGNORES_MIN_AGE
from pybk.bookie.reads import NO_SUCH_ENTRY_ON_IO_ERROR
from pybk.bookie.tenancy import TENANCY_QUOTA_UNCHECKED
from pybk.client.adv import ADV_ACKS_HELD_ENTRIES, ADV_LAC_OVER_GAP
from pybk.client.deferred import DEFERRED_LAC_PAST_FORCE, FORCE_BEFORE_SYNC
from pybk.client.isolation import REREPLICATION_LEAVES_GROUP
from pybk.client.placement import RACK_PLAN_IGNORES_WRAP
from pybk.client.reader import LEDGER_TAIL_SKIPS_ON_ERROR
from pybk.client.recovery import RECOVERY_READS_DONT_FENCE, RECOVERY_TIMEOUT_AS_ABSENT
from pybk.client.writer import (
    ACK_OUT_OF_ORDER,
    COUNTS_REPLACED_BOOKIES_ACKS,
    LAC_BEFORE_QUORUM,
)
from pybk.logs.cursor import MARK_DELETE_PAST_PENDING
from pybk.logs.mirror import MIRROR_RESUMES_FROM_MEMORY
from pybk.logs.offload import (
    OFFLOAD_COMPLETE_BEFORE_UPLOAD,
    OFFLOAD_DELETES_BEFORE_REPLACING,
    SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS,
    SWEEP_NEEDS_INDEX,
)
from pybk.logs.reader import TAIL_READER_SKIPS_ON_ERROR
from pybk.logs.takeover import SEGMENT_COMPLETED_AT_STALE_LAC
from pybk.metadata.memory_watches import WATCH_BASELINE_AT_FIRST_POLL
from pybk.ops.replicator import ENSEMBLE_BEFORE_COPY_DURABLE
from pybk.storage.dbstore import DB_COMPACTION_COVERS_CACHE, DB_LOG_UNSYNCED, DB_READS_UNCHECKED
from pybk.storage.startup import REPLAY_DAMAGE_AS_TORN_TAIL
from pybk.storage.store import (
    ACK_BEFORE_FSYNC,
    DELTA_SKIPS_LEDGER_STATE,
    INLINE_SYNC_SKIPS_FSYNC,
    OVERLAP_ACK_BEFORE_SYNC,
)
from pybk.tables.range import APPLY_BEFORE_ACK, TABLES_CATCH_UP_UNCHECKED

__all__ = [
    "ACK_BEFORE_FSYNC",
    "ACK_OUT_OF_ORDER",
    "ADV_ACKS_HELD_ENTRIES",
    "ADV_LAC_OVER_GAP",
    "APPLY_BEFORE_ACK",
    "COUNTS_REPLACED_BOOKIES_ACKS",
    "DB_COMPACTION_COVERS_CACHE",
    "DB_LOG_UNSYNCED",
    "DB_READS_UNCHECKED",
    "DEFERRED_LAC_PAST_FORCE",
    "DELTA_SKIPS_LEDGER_STATE",
    "ENSEMBLE_BEFORE_COPY_DURABLE",
    "FORCE_BEFORE_SYNC",
    "GC_IGNORES_MIN_AGE",
    "INLINE_SYNC_SKIPS_FSYNC",
    "KNOWN",
    "LAC_BEFORE_QUORUM",
    "LEDGER_TAIL_SKIPS_ON_ERROR",
    "MARK_DELETE_PAST_PENDING",
    "MIRROR_RESUMES_FROM_MEMORY",
    "NO_MUTATIONS",
    "NO_SUCH_ENTRY_ON_IO_ERROR",
    "OFFLOAD_COMPLETE_BEFORE_UPLOAD",
    "OFFLOAD_DELETES_BEFORE_REPLACING",
    "OVERLAP_ACK_BEFORE_SYNC",
    "RACK_PLAN_IGNORES_WRAP",
    "RECOVERY_READS_DONT_FENCE",
    "RECOVERY_TIMEOUT_AS_ABSENT",
    "REPLAY_DAMAGE_AS_TORN_TAIL",
    "REREPLICATION_LEAVES_GROUP",
    "SEGMENT_COMPLETED_AT_STALE_LAC",
    "SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS",
    "SWEEP_NEEDS_INDEX",
    "TABLES_CATCH_UP_UNCHECKED",
    "TAIL_READER_SKIPS_ON_ERROR",
    "TENANCY_QUOTA_UNCHECKED",
    "WATCH_BASELINE_AT_FIRST_POLL",
    "Mutations",
]

#: every switch some production code consults
KNOWN: Final = frozenset(
    {ACK_BEFORE_FSYNC, RECOVERY_READS_DONT_FENCE, NO_SUCH_ENTRY_ON_IO_ERROR, ACK_OUT_OF_ORDER,
     DELTA_SKIPS_LEDGER_STATE, ENSEMBLE_BEFORE_COPY_DURABLE, INLINE_SYNC_SKIPS_FSYNC,
     OVERLAP_ACK_BEFORE_SYNC, RECOVERY_TIMEOUT_AS_ABSENT, REPLAY_DAMAGE_AS_TORN_TAIL,
     TAIL_READER_SKIPS_ON_ERROR, SEGMENT_COMPLETED_AT_STALE_LAC, COUNTS_REPLACED_BOOKIES_ACKS,
     RACK_PLAN_IGNORES_WRAP, LEDGER_TAIL_SKIPS_ON_ERROR, LAC_BEFORE_QUORUM,
     DB_LOG_UNSYNCED, DB_COMPACTION_COVERS_CACHE, DB_READS_UNCHECKED,
     REREPLICATION_LEAVES_GROUP, GC_IGNORES_MIN_AGE, TABLES_CATCH_UP_UNCHECKED,
     APPLY_BEFORE_ACK, WATCH_BASELINE_AT_FIRST_POLL, TENANCY_QUOTA_UNCHECKED,
     MARK_DELETE_PAST_PENDING, OFFLOAD_COMPLETE_BEFORE_UPLOAD, OFFLOAD_DELETES_BEFORE_REPLACING,
     SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS, SWEEP_NEEDS_INDEX, ADV_ACKS_HELD_ENTRIES,
     ADV_LAC_OVER_GAP, DEFERRED_LAC_PAST_FORCE, FORCE_BEFORE_SYNC,
     MIRROR_RESUMES_FROM_MEMORY}
)


class Mutations(frozenset[str]):
    """A frozenset of switch names, each one of :data:`KNOWN`.

    ``Mutations("ack_before_fsync")``, ``Mutations.parse("a,b")``; ``name in m`` asks. It is
    what ``StoreConfig(mutations=...)`` and ``ClientConfig(mutations=...)`` take."""

    __slots__ = ()

    def __new__(cls, *names: str) -> Mutations:
        unknown = sorted(set(names) - KNOWN)
        if unknown:
            raise ValueError(
                f"unknown mutation {', '.join(map(repr, unknown))}; known: "
                f"{', '.join(sorted(KNOWN))}")
        return super().__new__(cls, names)

    @classmethod
    def parse(cls, text: str) -> Mutations:
        """From a comma-separated list (a command line's ``--mutation a,b``)."""
        return cls(*filter(None, (n.strip() for n in text.split(","))))

    @classmethod
    def of(cls, names: Iterable[str]) -> Mutations:
        return cls(*names)

    def __repr__(self) -> str:
        return f"Mutations({', '.join(map(repr, sorted(self)))})"


#: what every production configuration carries
NO_MUTATIONS: Final = Mutations()
