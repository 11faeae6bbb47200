"""What each mutation switch breaks: the invariants a broken build must be caught by.

Shared by test_mutations.py (the sweep's search) and test_regression_seeds.py (pinned seeds)."""

from __future__ import annotations

from pybk.testing import mutations

#: every invariant but liveness (I12): what a broken build must be caught by
SAFETY = frozenset({
    "L1", "L2", "L3", "L4", "L5", "L6", "L7", "L8", "L9", "I1", "I3", "I5", "I7", "I9",
    "I10", "I11", "I14", "I15", "P1", "L10", "R1", "R2", "X1", "LG1", "LG2", "LG3", "LG4", "LG5",
    "T1", "T2", "T3", "T4", "T5", "I16", "R3", "CU1", "CU2", "CU3", "TS1", "TS2", "TB1", "TB2",
    "TS3", "TS4", "AV1", "AV2", "DS1", "DS2", "MR1", "MR2",
})

#: where each broken build must show up
EXPECTED = {
    mutations.ACK_BEFORE_FSYNC: {"I9", "I10", "I11", "L1"},
    mutations.RECOVERY_READS_DONT_FENCE: {"L1", "L8"},
    mutations.NO_SUCH_ENTRY_ON_IO_ERROR: {"I9", "L1"},
    mutations.ACK_OUT_OF_ORDER: {"L6"},
    # a replaced bookie's late reply counted: an entry acknowledged short of its quorum
    mutations.COUNTS_REPLACED_BOOKIES_ACKS: {"I15"},
    # a rack plan that forgets the wrap-around write sets puts one on a single rack
    mutations.RACK_PLAN_IGNORES_WRAP: {"P1"},
    # a ledger tail that swallows a failed read skips the range
    mutations.LEDGER_TAIL_SKIPS_ON_ERROR: {"L10"},
    mutations.DELTA_SKIPS_LEDGER_STATE: {"I14"},
    mutations.ENSEMBLE_BEFORE_COPY_DURABLE: {"R1", "R2"},
    # acknowledged without a durable copy: a crash loses what a bookie said it held
    mutations.INLINE_SYNC_SKIPS_FSYNC: {"I9", "I10", "I11", "L1", "LG1"},
    mutations.OVERLAP_ACK_BEFORE_SYNC: {"I9", "I10", "I11", "L1", "LG1"},
    # a timeout counted as "absent": recovery closes a ledger (or a segment) short
    mutations.RECOVERY_TIMEOUT_AS_ABSENT: {"L1", "LG1", "LG4"},
    # damage in the middle of the journal cut as a torn tail: synced entries vanish
    mutations.REPLAY_DAMAGE_AS_TORN_TAIL: {"I9", "I10", "L1"},
    # a reader that swallows a failed read skips records
    mutations.TAIL_READER_SKIPS_ON_ERROR: {"LG1"},
    # a taken-over segment completed at a stale LAC loses the old writer's last records
    mutations.SEGMENT_COMPLETED_AT_STALE_LAC: {"LG1", "LG4"},
    # the LAC told before the Qa-th ack: a reader sees what Qa bookies never acknowledged
    mutations.LAC_BEFORE_QUORUM: {"I3", "L5"},
    # the db engine: an entry log named in a checkpoint before it is synced, and a
    # compaction's checkpoint that covers what is only in the write cache (a crash loses both)
    # (a log's record among the lost entries: LG1, as seed 5 shows since it draws a lost
    # auditor host, whose bookie dies with its unsynced data)
    mutations.DB_LOG_UNSYNCED: {"I9", "I10", "I11", "I14", "L1", "LG1"},
    mutations.DB_COMPACTION_COVERS_CACHE: {"I9", "I10", "L1"},
    mutations.DB_READS_UNCHECKED: {"I9", "I10"},
    mutations.MIRROR_RESUMES_FROM_MEMORY: {"MR1", "MR2"},
    # re-replication that forgets the namespace's isolation group moves a fragment out of it
    mutations.REREPLICATION_LEAVES_GROUP: {"T1"},
    # a collector without its age guard deletes a ledger its metadata replica has not
    # learned of yet (the simulator's collectors read a replica half a guard behind)
    mutations.GC_IGNORES_MIN_AGE: {"I16", "I9", "I10", "L1", "LG1"},
    # a range owner overtaken while it caught up serves an old state: its next revision is
    # below the command log's last txid, the log writer refuses it, the table server dies
    mutations.TABLES_CATCH_UP_UNCHECKED: {"X1"},
    # a table command applied before the log acknowledged it: a read sees a write that a
    # crash of the table server then loses (the key's history is not linearizable)
    mutations.APPLY_BEFORE_ACK: {"TB1"},
    # a polled watch whose baseline is its first poll misses the lost auditor host's
    # registration lapsing just after the new auditor's first look: without the auditor's
    # second look (sync_watches) and with the hourly periodic check nothing marks the
    # bookie's ledgers in time (caught by a watch conformance test: BY_TEST)
    mutations.WATCH_BASELINE_AT_FIRST_POLL: {"R3"},
    # a bookie's tenancy gate that never checks the storage quota keeps admitting a
    # namespace's new entries past it
    mutations.TENANCY_QUOTA_UNCHECKED: {"T3"},
    # a cursor's persisted mark-delete position past a record handed out and not
    # acknowledged: the consumer that restarts recovers it (CU3) and skips the record (CU2)
    mutations.MARK_DELETE_PAST_PENDING: {"CU2", "CU3"},
    # an offload recorded complete when it starts: the bookies' copy goes while the objects
    # are still being uploaded, or after an upload that failed and was cleaned up
    mutations.OFFLOAD_COMPLETE_BEFORE_UPLOAD: {"TS1", "TS2"},
    mutations.OFFLOAD_DELETES_BEFORE_REPLACING: {"TS1", "TS2", "LG1"},
    # an orphan sweep that spares only complete offloads deletes the objects of an attempt
    # still uploading (whose bookie copy may then go: TS1, TS2), or of a failed one the log
    # still records
    mutations.SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS: {"TS3", "TS1", "TS2"},
    # an orphan sweep that finds attempts by their index never removes a data object whose
    # index never landed (an upload cut short, its attempt replaced since)
    mutations.SWEEP_NEEDS_INDEX: {"TS4"},
    # an id held ahead of a gap acknowledged before it is sent: lost when the gap stays
    mutations.ADV_ACKS_HELD_ENTRIES: {"AV1"},
    # the LAC told over a gap, to an id held (never sent): readers see ids no bookie holds
    mutations.ADV_LAC_OVER_GAP: {"AV2"},
    # force() that does not wait for the bookies: a "durable" entry a crash or a failed add
    # takes back
    mutations.FORCE_BEFORE_SYNC: {"DS1"},
    # the written LAC told to the bookies: readers see entries no force made durable
    mutations.DEFERRED_LAC_PAST_FORCE: {"DS2"},
}
