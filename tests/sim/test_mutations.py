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
from mutations_kit import EXPECTED, SAFETY

from pybk.sim.sweep import CI_DURATION, CI_FAULTS, CI_SEEDS, find_violation, run_seed
from pybk.testing import mutations

SEEDS_FILE = Path(__file__).with_name("regression_seeds.txt")

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

#: switches the sweep does not catch at all, each caught by the aimed test named. A polled
#: watch's baseline taken at its first poll: since the memory store has sync_watches the
#: auditor looks again once its watches are established, which finds the lapse the watch
#: missed, so R3 holds (none of the first 500 CI seeds, was 13, 48 and 71 of the first 100;
#: the lost-auditor-host replay passes with it, test_polled_watches.py, where a default
#: sweep with no second look finds it again); the adversarial watch conformance on the
#: polled memory store catches it
BY_TEST = {mutations.WATCH_BASELINE_AT_FIRST_POLL:
           "tests/metadata/test_polled_memory.py::test_the_adversarial_section_catches_a_"
           "baseline_taken_at_the_first_poll"}


#: switches caught by a pinned regression seed (tests/sim/regression_seeds.txt, with the
#: switch in its mutation column; test_regression_seeds.py runs it). Two table servers
#: opening a range at once, the newer checkpointing and truncating before the older has read
#: the logs: seed 226 met it until the traces moved, then 722 (found among the table seeds
#: below 4,000); since the table servers serve several clients and die aimed (29 Nov) neither
#: does, nor any table seed below 60: a search of the table seeds from 60 found 459; since a
#: lone writer's LAC rides its next add (issue 41, 29 Nov) 459 does not, nor any table seed
#: from 460 to 3,999 or 226 and 722 at 30 or 60 s: 4282, the first table seed from 4,000.
#: A ledger tail that skips a failed read was caught at CI seed 58, the last but one of the
#: 60; since seed 58 draws a lost auditor host (29 Nov) the first to catch it is 64, pinned.
#: An ack before the overlapped sync and recovery reads that do not fence were first caught at
#: CI seeds 46 and 20 once the traces moved (29 Nov): the searches took 104 s and 55 s of CI,
#: so those seeds are pinned too (the ack before the overlapped sync at 53 since the
#: lone-writer work of issue 41, the first overlapped-journal seed from 42 to catch it). A
#: tenancy gate that skips its quota check breaks only seeds that draw the gate with a quota
#: (one in sixteen draw the gate): 12 is the first CI seed that does, pinned.
#: A cursor's mark-delete position persisted past an unacknowledged record needs the cursor
#: consumer (a quarter of the log seeds): CI seeds 5, 7, 9, 21, 34 and 53 of the first 60
#: catch it (29 Nov); 9 is the quickest, pinned. An offload recorded complete before its
#: upload needs the simulated tier (a quarter of the log seeds): CI seeds 0, 11, 17, 26 and 49
#: catch it, 34 and 39 do not (29 Nov); 17 was the quickest, pinned, until it drew the orphan
#: sweep and stopped meeting it: 11 (unchanged by the sweep) is pinned now. The orphan sweep's
#: two switches need a seed that draws the sweep (half the offload seeds: 0, 17, 26, 34, 52
#: and 58 of the first 60): the first to catch each is pinned, 17 (TS3) and 58 (TS4) since
#: the sweep lists abandoned uploads too (0 and 52 were, before). An offload that deletes
#: an incomplete attempt's objects before replacing it needs a second offloader (the offload
#: service, half the offload seeds): CI seeds 34 and 52 of the first 60 catch it (29 Nov);
#: 34, the first, is pinned.
#: Six more were searched for in every CI run and first caught at seeds 5-13 (29 Nov, 20-35 s
#: each in CI, 152 s together): pinned at those seeds, each 2 runs instead of up to 14.
#: The caller-chosen-id and deferred-sync writers (pybk.sim.ledger_modes) are drawn in one seed
#: of eight each: CI seed 2 draws both and catches three of their switches (29 Nov); a force()
#: that does not wait for the bookies needs a forced entry lost, first at seed 9.
#: A table command applied before its append is acknowledged needs a table seed (one in
#: eight) whose aimed table server crash meets a read beside a write in flight: CI seeds 19
#: and 49 of the first 60 catch it (29 Nov); 19, the first, is pinned (a search is 20 runs).
#: Reads of the db engine's entry logs that trust rows and bodies unchecked need a disk fault
#: on a db bookie's entry logs: CI seeds 43 and 48 of the first 60 catch it (I10; 29 Nov), 43
#: is pinned. A mirror that resumes from its memory instead of the target's last record needs
#: the mirror (drawn in one seed of eight since 29 Nov: 8, 14, 17 and 54 of the first 60): 14
#: and 17 catch it (MR1, MR2), 14 is pinned.
BY_SEED = {mutations.ADV_ACKS_HELD_ENTRIES: 2,
           mutations.ADV_LAC_OVER_GAP: 2,
           mutations.DEFERRED_LAC_PAST_FORCE: 2,
           mutations.FORCE_BEFORE_SYNC: 9,
           mutations.APPLY_BEFORE_ACK: 19,
           mutations.TABLES_CATCH_UP_UNCHECKED: 4282,
           mutations.RECOVERY_TIMEOUT_AS_ABSENT: 12,
           mutations.REPLAY_DAMAGE_AS_TORN_TAIL: 13,
           mutations.INLINE_SYNC_SKIPS_FSYNC: 10,
           mutations.TAIL_READER_SKIPS_ON_ERROR: 7,
           mutations.RACK_PLAN_IGNORES_WRAP: 8,
           mutations.DB_LOG_UNSYNCED: 5,
           mutations.DB_READS_UNCHECKED: 43,
           mutations.MIRROR_RESUMES_FROM_MEMORY: 14,
           mutations.OFFLOAD_COMPLETE_BEFORE_UPLOAD: 11,
           mutations.OFFLOAD_DELETES_BEFORE_REPLACING: 34,
           mutations.SWEEP_IGNORES_ATTEMPTS_IN_PROGRESS: 17,
           mutations.SWEEP_NEEDS_INDEX: 58,
           mutations.MARK_DELETE_PAST_PENDING: 9,
           mutations.LEDGER_TAIL_SKIPS_ON_ERROR: 64,
           mutations.OVERLAP_ACK_BEFORE_SYNC: 53,
           mutations.RECOVERY_READS_DONT_FENCE: 20,
           mutations.TENANCY_QUOTA_UNCHECKED: 12}


def test_every_switch_has_its_expected_invariants() -> None:
    assert set(EXPECTED) == mutations.KNOWN
    for name, expected in EXPECTED.items():
        assert expected and expected <= SAFETY, name


def test_every_switch_is_in_the_documented_table() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "simulation.md").read_text()
    rows = {line.split("`")[1] for line in doc.splitlines() if line.startswith("| `")}
    assert rows >= mutations.KNOWN, sorted(mutations.KNOWN - rows)


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
