"""Real BookKeeper and Pulsar data-loss bugs (each named by its upstream issue) as named
scenarios: a fixed fault schedule, a topology, a load and a configuration each, for
``test_bug_replays.py``. Each must pass on pybk; where a mutation switch re-introduces the
broken rule, the same scenario run with it must violate ``expect``.

A scenario's ``seed`` was chosen once (the first, searching upwards, for which the scenario
with its switch violates ``expect`` and without passes: ``find_seed``) and is pinned: the
schedule, the seed and the code decide the run, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pybk.sim.configs import SimConfig
from pybk.sim.faults import FaultPlan
from pybk.sim.scenario import FaultEvent, Scenario
from pybk.sim.workload import Workload

__all__ = ["REPLAYS", "Replay", "find_seed"]

#: the ledger workload alone (no logs), quick
LEDGERS = Workload(log_writers=0, log_readers=0, add_rate=20.0)
#: the log workload alone
LOGS = Workload(writers=0, readers=0, recoverers=0, deletes=False, log_rate=10.0)


@dataclass
class Replay:
    name: str
    url: str
    what: str
    topology: tuple[int, int, int]
    bookies: int
    events: list[tuple[float, str, dict[str, Any]]]
    seed: int = 0
    duration: float = 12.0
    workload: Workload = LEDGERS
    config: SimConfig = field(default_factory=SimConfig)
    net: dict[str, float] = field(default_factory=dict)
    #: the switch that breaks the rule this bug broke (None: pybk has no such switch)
    mutation: str | None = None
    #: what the broken build must violate
    expect: frozenset[str] = frozenset()
    #: coverage markers the run must reach (the scenario does what it says)
    reaches: tuple[str, ...] = ()
    #: metadata watches delivered as real backends deliver them (polled, established late)
    polled_watches: bool = False

    def scenario(self, seed: int | None = None) -> Scenario:
        kinds = list(dict.fromkeys(kind for _at, kind, _p in self.events))
        plan = FaultPlan(events=kinds, weights={k: 1 for k in kinds},
                         polled_watches=self.polled_watches, **self.net)
        return Scenario(
            seed=self.seed if seed is None else seed, duration=self.duration,
            topology=self.topology, bookies=self.bookies, config=self.config,
            workload=self.workload, plan=plan,
            events=[FaultEvent(at, kind, 1000 + i, dict(params))
                    for i, (at, kind, params) in enumerate(self.events)],
            faults_spec=",".join(kinds) or "none", note=f"{self.name}: {self.what}",
        )


REPLAYS: list[Replay] = [
    Replay(
        "BK-2614", "https://github.com/apache/bookkeeper/issues/2614",
        "a fence request is lost and a recovery starts while a slow writer's late adds are in "
        "flight: recovery reads must fence too, or the late add is acknowledged on an unfenced "
        "bookie and lost",
        (4, 3, 3), 5,
        [(0.934, "lose_fence", {"bookie": "b1"}),
         (2.257, "slow_link", {"writer": "w1", "bookie": "b1", "delay": 1.426, "hold": 7.0,
                               "fence_lost": False})],
        seed=4, duration=3.455,
        workload=Workload(readers=0, deletes=False, add_rate=25.0, log_writers=0,
                          log_readers=0),
        config=SimConfig(sync_delay=0.01),
        mutation="recovery_reads_dont_fence", expect=frozenset({"L1", "L8"}),
        reaches=("fencing_read",),
    ),
    Replay(
        "BK-2908", "https://github.com/apache/bookkeeper/issues/2908",
        "a corrupt journal record on one bookie: its reads must fail with an I/O error, never "
        "say NoSuchEntry (a single false negative truncates a recovered ledger)",
        (3, 3, 2), 4,
        [(3.0, "bitflip", {"live": True}), (5.0, "latent", {"live": True}),
         (7.0, "bitflip", {"live": True})],
        seed=1, mutation="no_such_entry_on_io_error", expect=frozenset({"I9", "L1"}),
    ),
    Replay(
        "BK-1591", "https://github.com/apache/bookkeeper/issues/1591",
        "failed bookies replaced while the metadata store stalls (Qw > Qa): no entry may be "
        "acknowledged on a fragment that is not durable in the metadata",
        (5, 3, 2), 6,
        [(2.0, "meta_stall", {"for": 3.0}), (2.2, "crash", {"timed": False}),
         (6.0, "meta_stall", {"for": 3.0}), (6.1, "crash", {"timed": False})],
    ),
    Replay(
        "BK-544", "https://github.com/apache/bookkeeper/issues/544",
        "a bookie restarted with an emptied data directory under the same identity must refuse "
        "(cookie), not come back as a new bookie that forgot its fences",
        (3, 2, 2), 5,
        [(3.0, "wipe", {}), (5.0, "slow_link", {"fence_lost": True})],
        reaches=("wiped_bookie_refused",),
    ),
    Replay(
        "BK-2612", "https://github.com/apache/bookkeeper/issues/2612",
        "a wiped bookie under the same identity during recovery: its NoSuchEntry answers must "
        "never be trusted to lower the LAC",
        (3, 3, 2), 5,
        [(2.5, "wipe", {}), (2.8, "recovery_timeout", {"hold": 3.0})],
    ),
    Replay(
        "BK-4097", "https://github.com/apache/bookkeeper/issues/4097",
        "back-to-back ensemble changes while writes are in flight: every acknowledged entry "
        "stays on the bookies the metadata names",
        (4, 3, 3), 6,
        [(2.0, "crash", {"timed": False}), (2.05, "crash", {"timed": False}),
         (6.0, "crash", {"timed": False}), (6.02, "crash", {"timed": False})],
        seed=1, reaches=("ensemble_change_during_pending_adds",),
    ),
    Replay(
        "BK-4651", "https://github.com/apache/bookkeeper/issues/4651",
        "an ensemble change racing in-flight adds that then succeed on the old bookies "
        "(E=2, Qw=2, Qa=1)",
        (2, 2, 1), 4,
        [(2.0, "slow_link", {"fence_lost": False}), (2.1, "crash", {"timed": False}),
         (5.0, "slow_link", {"fence_lost": False}), (5.1, "crash", {"timed": False})],
        # lost requests and reset connections make the writer replace bookies whose replies
        # are still on their way: the broken build counts those late replies as acks
        net={"drop": 0.03, "duplicate": 0.03, "reset": 0.01},
        mutation="counts_replaced_bookies_acks", expect=frozenset({"I15"}),
    ),
    Replay(
        "BK-3005", "https://github.com/apache/bookkeeper/issues/3005",
        "an entry acknowledged although an ensemble change broke its ack set: acknowledgements "
        "stay in entry order and at Qa",
        (3, 3, 2), 4, [], seed=1, duration=30.0, net={"drop": 0.01},
        workload=Workload(readers=0, recoverers=0, deletes=False, add_rate=12.0, log_writers=0,
                          log_readers=0),
        config=SimConfig(sync_delay=0.0005),
        mutation="ack_out_of_order", expect=frozenset({"L6"}),
    ),
    Replay(
        "BK-4462", "https://github.com/apache/bookkeeper/pull/4462",
        "a client fences (recovers) a ledger while its paused writer still adds: the writer "
        "must get fenced errors only",
        (3, 2, 2), 4,
        [(2.0, "pause_writer", {"resume_after": 4.0}), (2.5, "recovery_timeout", {"hold": 0.1}),
         (8.0, "pause_writer", {"resume_after": 3.0})],
        reaches=("writer_fenced",),
    ),
    Replay(
        "BK-4812", "https://github.com/apache/bookkeeper/issues/4812",
        "bookies replaced by empty ones at the same address: they refuse to start, and the old "
        "writer's adds never succeed after a recovery closed the ledger",
        (3, 3, 2), 5,
        [(2.0, "wipe", {}), (3.0, "pause_writer", {"resume_after": 3.0}),
         (3.5, "slow_link", {"fence_lost": True})],
    ),
    Replay(
        "BK-3329", "https://github.com/apache/bookkeeper/pull/3329",
        "an index checkpoint that moves past state not yet in it (fences, explicit LACs): "
        "after a crash, the checkpoint chain plus the journal is the index",
        (3, 3, 2), 4,
        [(3.0, "crash", {"timed": False, "mode": "torn"}), (5.0, "slow_link", {}),
         (7.0, "crash", {"timed": False}), (9.0, "crash", {"timed": False})],
        seed=9, duration=15.0, config=SimConfig(checkpoints=True),
        mutation="delta_skips_ledger_state", expect=frozenset({"I14"}),
    ),
    Replay(
        "BK-4844", "https://github.com/apache/bookkeeper/pull/4844",
        "checkpoints and journal rotation while bookies crash: replay starts no later than "
        "the oldest entry the checkpoint does not hold",
        (3, 2, 2), 4,
        [(5.0, "crash", {"mode": "reorder"}), (7.0, "crash", {"mode": "torn"}),
         (9.0, "crash", {"mode": "drop"}), (11.0, "crash", {"mode": "torn"})],
        duration=14.0, config=SimConfig(checkpoints=True, preallocate=True),
        reaches=("checkpoint_deltas_loaded",),
    ),
    Replay(
        "BK-3956", "https://github.com/apache/bookkeeper/pull/3956",
        "kill -9 tears the journal's last record: the bookie starts, cutting only what it "
        "never acknowledged",
        (3, 2, 2), 4,
        [(2.0, "crash", {"mode": "torn", "timed": True}),
         (4.0, "crash", {"mode": "torn", "timed": True}),
         (6.0, "crash", {"mode": "reorder", "timed": True})],
        config=SimConfig(journal="serial", sync_delay=0.01),
        seed=1, reaches=("journal_tail_truncated",),
    ),
    Replay(
        "BK-4659", "https://github.com/apache/bookkeeper/issues/4659",
        "a corrupted record in the middle of a crashed bookie's journal: replay refuses (or "
        "uses what precedes it only), never drops the synced records after it as a torn tail",
        (3, 3, 2), 4,
        [(3.0, "bitflip", {"live": False, "aim": "batch_header"}),
         (6.0, "misdirect", {"live": False, "how": "write"})],
        duration=10.0,
        mutation="replay_damage_as_torn_tail", expect=frozenset({"I9", "I10", "L1"}),
    ),
    Replay(
        "BK-1067", "https://github.com/apache/bookkeeper/issues/1067",
        "a hung bookie during recovery: recovery decides on Qw-Qa+1 negatives, and a timeout "
        "is never one of them",
        (5, 3, 2), 6,
        [(2.0, "recovery_timeout", {"hold": 4.0}), (5.0, "recovery_timeout", {"hold": 4.0}),
         (8.0, "recovery_timeout", {"hold": 4.0})],
        seed=11, mutation="recovery_timeout_as_absent", expect=frozenset({"L1"}),
    ),
    Replay(
        "BK-1066", "https://github.com/apache/bookkeeper/issues/1066",
        "the same entry written more than once to a bookie (network replays, retries, a "
        "flapping ensemble): replicas never diverge",
        (3, 2, 2), 4,
        [(2.0, "crash", {}), (4.0, "partition", {}), (6.0, "swizzle", {})],
        net={"duplicate": 0.05, "reorder": 0.02},
    ),
    Replay(
        "Pulsar-7490", "https://github.com/apache/pulsar/issues/7490",
        "a write persisted but reported failed, then the log moves on to a new writer: no "
        "record appears at two positions, none is lost",
        (3, 2, 2), 4,
        [(2.0, "partition", {}), (2.5, "crash_writer", {}), (5.0, "meta_expire", {}),
         (6.0, "crash_writer", {})],
        workload=LOGS, seed=47,
        mutation="segment_completed_at_stale_lac", expect=frozenset({"LG1", "LG4"}),
    ),
    Replay(
        "Pulsar-20968", "https://github.com/apache/pulsar/issues/20968",
        "bookies restarted one by one while a log is written and read (Qw=Qa=2): a reader "
        "starting afterwards reads every acknowledged record",
        (3, 2, 2), 3,
        [(2.0, "crash", {"bookie": "b0", "timed": True}),
         (4.0, "crash", {"bookie": "b1", "timed": True}),
         (6.0, "crash", {"bookie": "b2", "timed": True}),
         (8.0, "crash", {"bookie": "b0", "timed": True})],
        workload=Workload(readers=0, recoverers=0, deletes=False, add_rate=25.0,
                          log_rate=8.0),
        config=SimConfig(journal="overlapped", split_min=1, batched_adds=True),
        # (seed 1: seed 0's run stopped catching the switch when a lone writer's LAC began
        # to ride its next add and journal batch, issue 41)
        seed=1,
        mutation="overlap_ack_before_sync", expect=frozenset({"LG1", "I9", "I10", "I11"}),
    ),
    Replay(
        "BP-44", "https://github.com/apache/bookkeeper/pull/2706",
        "an acknowledgement with no durable journal behind it: a crash loses e0 and recovery "
        "must not close the ledger empty",
        (3, 2, 2), 4,
        [(2.0, "crash", {"mode": "drop"}), (4.0, "crash", {"mode": "drop"}),
         (6.0, "crash", {"mode": "drop"})],
        seed=1, mutation="ack_before_fsync", expect=frozenset({"I9", "I10", "I11", "L1"}),
    ),
    Replay(
        "BK-659", "https://github.com/apache/bookkeeper/issues/659",
        "a compaction moves the journal's checkpoint mark past entries that are still only in "
        "the write cache: the journal holding them is trimmed, and a crash loses them (db "
        "engine: ledgers deleted so compaction runs, bookies crashing after it)",
        (2, 2, 1), 4,
        [(14.0, "crash", {}), (19.0, "crash", {}), (24.0, "crash", {}), (28.0, "crash", {})],
        duration=32.0, config=SimConfig(storage="db", checkpoints=True),
        mutation="db_compaction_covers_cache", expect=frozenset({"I9", "I10", "L1"}),
    ),
    Replay(
        # (pybk's own: issue 43, where the persistent backends' watches took their baseline
        # at the first poll and missed this change; BookKeeper keeps its periodic bookie
        # check for a lost notification, BK-4255, the issue linked. No switch: with
        # watch_baseline_at_first_poll the auditor's second look, once sync_watches says its
        # watches are established, still finds the lapse, test_polled_watches.py)
        "lost-auditor-host", "https://github.com/apache/bookkeeper/issues/4255",
        "the host of the elected auditor goes, its bookie with it; the auditor's session "
        "lapses first, a new auditor is elected and its first bookie check still sees the "
        "bookie registered, the registration lapsing ms later: only its registry watch, or "
        "its second check once its watches are established, can tell it (polled watches; "
        "the periodic check is production's hour), and the lost bookie's ledgers must be "
        "marked within seconds",
        (3, 3, 2), 5,
        [(3.0, "lose_auditor_host", {"bookie": "b1", "order": "auditor_first", "aimed": True,
                                     "session_timeout": 1.0, "gap": 0.01})],
        duration=10.0, polled_watches=True, config=SimConfig(auditor_bookie_check=3600.0),
        reaches=("auditor_host_lapse_aimed", "auditor_host_loss_noticed"),
    ),
]


def find_seed(replay: Replay, limit: int = 40) -> int | None:
    """The first seed for which ``replay`` passes and, with its switch, violates ``expect``
    (what was pinned; a helper for when the code moves and a pin must be chosen again)."""
    from pybk.sim.runner import run

    for seed in range(limit):
        clean = run(seed, scenario=replay.scenario(seed))
        if not clean.ok or not all(clean.stats.coverage.get(m) for m in replay.reaches):
            continue
        if replay.mutation is None:
            return seed
        broken = run(seed, scenario=replay.scenario(seed), mutations=(replay.mutation,))
        if {v.invariant for v in broken.violations} & replay.expect:
            return seed
    return None
