"""The checker can fail: each deliberately broken build is caught by the CI seed sweep.

For every switch in :mod:`pybk.testing.mutations` the CI sweep's seeds are run in order until
one shows a *safety* violation (I12 liveness failures do not count: a broken build must be
caught by the invariant it breaks, not by a timeout). That first seed's violations must
include one the switch is expected to break (any other is a wrong diagnosis, and fails the
test), and the same seed without the switch must pass: the violation is the broken build's,
not the seed's. With no mutation the sweep finds none: that is ``test_ci_sweep.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pybk.sim.sweep import CI_DURATION, CI_FAULTS, CI_SEEDS, find_violation, run_seed
from pybk.testing import mutations

SEEDS_FILE = Path(__file__).with_name("regression_seeds.txt")

#: every invariant but liveness (I12): what a broken build must be caught by
SAFETY = frozenset({
    "L1", "L2", "L3", "L4", "L5", "L6", "L7", "L8", "L9", "I1", "I3", "I5", "I7", "I9",
    "I10", "I11", "I14", "I15", "P1", "L10", "R1", "R2", "X1", "LG1", "LG2", "LG3", "LG4", "LG5",
    "T1", "T2", "T3", "T4", "T5", "I16", "R3",
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
    mutations.DB_LOG_UNSYNCED: {"I9", "I10", "I11", "L1", "LG1"},
    mutations.DB_COMPACTION_COVERS_CACHE: {"I9", "I10", "L1"},
    # re-replication that forgets the namespace's isolation group moves a fragment out of it
    mutations.REREPLICATION_LEAVES_GROUP: {"T1"},
    # a collector without its age guard deletes a ledger its metadata replica has not
    # learned of yet (the simulator's collectors read a replica half a guard behind)
    mutations.GC_IGNORES_MIN_AGE: {"I16", "I9", "I10", "L1", "LG1"},
    # a range owner overtaken while it caught up serves an old state: its next revision is
    # below the command log's last txid, the log writer refuses it, the table server dies
    mutations.TABLES_CATCH_UP_UNCHECKED: {"X1"},
    # a table command applied before the log acknowledged it: a read sees a put that a crash
    # then loses (the history is not linearizable)
    mutations.APPLY_BEFORE_ACK: {"X1"},
    # a polled watch whose baseline is its first poll misses the lost auditor host's
    # registration lapsing just after the new auditor's first look: with the hourly
    # periodic check nothing marks the bookie's ledgers in time
    mutations.WATCH_BASELINE_AT_FIRST_POLL: {"R3"},
    # a bookie's tenancy gate that never checks the storage quota keeps admitting a
    # namespace's new entries past it
    mutations.TENANCY_QUOTA_UNCHECKED: {"T3"},
}


#: switches whose broken rule the random sweep meets too rarely to catch in 60 seeds, each
#: caught instead by the named bug replay (tests/bug_replays.py) that aims at it. A replaced
#: bookie's late reply needs a lost request and a late answer on the same entry: 2 of the
#: first 400 CI seeds (86 and 337) on 28 Nov.
BY_REPLAY = {mutations.COUNTS_REPLACED_BOOKIES_ACKS: "BK-4651",
             # the db engine in one seed of four, a compaction then a crash of the same
             # bookie before its next checkpoint: none of the first 60 CI seeds (29 Nov)
             mutations.DB_COMPACTION_COVERS_CACHE: "BK-659"}

#: switches that break a part only an opt-in workload runs (the CI sweep draws none of
#: them), each caught by the test named, which runs that workload
BY_WORKLOAD = {mutations.REREPLICATION_LEAVES_GROUP:
               "tests/sim/test_tenancy_sim.py::test_the_simulator_catches_re_replication_out"
               "_of_the_group (Workload(tenancy=True))"}

#: switches the sweep does not catch at all, each caught by the aimed test named. Applying a
#: table command before the log acknowledges it needs a crash of the owner between the two
#: while a read runs: none of the first 120 CI seeds (29 Nov; the tables workload is in one
#: seed of eight)
BY_TEST = {mutations.APPLY_BEFORE_ACK:
           "tests/tables/test_linearizability.py::test_applying_before_the_log_acknowledges_is"
           "_caught"}


#: switches caught by a pinned regression seed (tests/sim/regression_seeds.txt, with the
#: switch in its mutation column; test_regression_seeds.py runs it). Two table servers
#: opening a range at once, the newer checkpointing before the older has read the logs: seed
#: 226 met it until the traces moved (29 Nov: lost auditor hosts, adds checked against the
#: metadata); a search of the seeds below 4,000 that draw tables found 722. A missed registry
#: watch needs polled watches, the hourly periodic check and the auditor's host lost with
#: the registration lapsing inside the new watch's first poll: 3 of the first 100 CI seeds
#: (13, 48 and 71, 29 Nov); the first is pinned (the lost-auditor-host replay aims at it)
#: A ledger tail that skips a failed read was caught at CI seed 58, the last but one of the
#: 60; since seed 58 draws a lost auditor host (29 Nov) the first to catch it is 64, pinned.
#: A tenancy gate that skips its quota check breaks only seeds that draw the gate with a
#: quota (one in sixteen draw the gate): 12 is the first CI seed that does, pinned.
BY_SEED = {mutations.TABLES_CATCH_UP_UNCHECKED: 722,
           mutations.WATCH_BASELINE_AT_FIRST_POLL: 13,
           mutations.LEDGER_TAIL_SKIPS_ON_ERROR: 64,
           mutations.TENANCY_QUOTA_UNCHECKED: 12}


def test_every_switch_has_its_expected_invariants() -> None:
    assert set(EXPECTED) == mutations.KNOWN
    for name, expected in EXPECTED.items():
        assert expected and expected <= SAFETY, name


def test_the_switches_left_to_replays_have_one() -> None:
    from bug_replays import REPLAYS

    by_name = {r.name: r for r in REPLAYS}
    for switch, name in BY_REPLAY.items():
        assert by_name[name].mutation == switch
        assert by_name[name].expect <= EXPECTED[switch]


def test_the_switches_left_to_seeds_have_one() -> None:
    rows = (line.split("#", 1)[0].split() for line in SEEDS_FILE.read_text().splitlines())
    pinned = {(row[3], int(row[0])) for row in rows if len(row) > 3}
    for switch, seed in BY_SEED.items():
        assert (switch, seed) in pinned, f"{switch}: no regression seed {seed} runs it"


def test_the_switches_left_to_tests_have_one() -> None:
    root = Path(__file__).parents[1]
    for switch, test in BY_TEST.items():
        path, name = test.split("::")
        source = (root.parent / path).read_text()
        assert f"def {name}(" in source, test
        assert switch in mutations.KNOWN


@pytest.mark.parametrize("mutation", sorted(mutations.KNOWN - set(BY_REPLAY)
                                            - set(BY_WORKLOAD) - set(BY_SEED)
                                            - set(BY_TEST)))
def test_sweep_catches_mutation(mutation: str) -> None:
    found = find_violation(list(CI_SEEDS)[:60], mutations=(mutation,), invariants=SAFETY)
    assert found is not None, f"{mutation}: no seed of the first 60 CI seeds caught it"
    caught = set(found.invariants) & EXPECTED[mutation]
    assert caught, (f"{mutation}: seed {found.seed} was caught by {found.invariants}, not by "
                    f"what the switch breaks ({sorted(EXPECTED[mutation])}):\n{found.report}")
    print(f"{mutation}: caught by seed {found.seed} ({', '.join(found.invariants)})")
    clean = run_seed(found.seed, CI_FAULTS, CI_DURATION, None, ())
    assert clean.ok, f"seed {found.seed} fails without {mutation} too: {clean.invariants}"
