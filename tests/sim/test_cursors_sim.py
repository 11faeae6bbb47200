"""The cursor consumer of the simulator's log workload (pybk.sim.cursors): the invariants
CU1..CU3 on hand-made histories, the swarm's draw, and a run under faults."""

from __future__ import annotations

import random
from dataclasses import replace

from pybk.sim import Faults, Workload, run
from pybk.sim.cluster import derive_rng
from pybk.sim.cursors import CURSOR, check_cursors
from pybk.sim.history import OK, Event, History
from pybk.sim.runner import scenario_of


def _history() -> History:
    return History()


def _record(h: History, n: int) -> dict[tuple[int, int, int], Event]:
    """Records 1:0:0 .. 1:n-1:0 in the log."""
    return {(1, i, 0): h.log_append_done("w", "simlog", f"w:{i}".encode(), OK, (1, i, 0))
            for i in range(n)}


def _invariants(h: History, in_log: dict[tuple[int, int, int], Event],
                truncations: list[Event] | None = None) -> set[str]:
    return {v.invariant for v in check_cursors(h, in_log, truncations or [])}


def _deliver(h: History, inst: int, *entries: int) -> None:
    for i in entries:
        h.cursor_deliver("c", CURSOR, inst, (1, i, 0), f"w:{i}".encode())


def _ack(h: History, inst: int, i: int, how: str = "ack",
         md: tuple[int, int, int] | None = None) -> None:
    h.cursor_ack("c", CURSOR, inst, (1, i, 0), how)
    h.cursor_ack_done("c", CURSOR, inst, (1, i, 0), how, OK, md)


def test_a_clean_history_passes() -> None:
    h = _history()
    log = _record(h, 4)
    h.cursor_open("c", CURSOR, 1, OK)
    _deliver(h, 1, 0, 1, 2)
    _ack(h, 1, 1)
    _ack(h, 1, 0, md=(1, 1, 0))
    h.cursor_open("c", CURSOR, 2, OK, (1, 1, 0))
    _deliver(h, 2, 2, 3)  # 2 was never acknowledged: handed out again
    assert _invariants(h, log) == set()


def test_a_redelivered_acknowledgement_is_cu1() -> None:
    h = _history()
    log = _record(h, 3)
    h.cursor_open("c", CURSOR, 1, OK)
    _deliver(h, 1, 0, 1)
    _ack(h, 1, 1, "cumulative", md=(1, 1, 0))
    h.cursor_open("c", CURSOR, 2, OK, (1, 1, 0))
    _deliver(h, 2, 0, 2)
    assert "CU1" in _invariants(h, log)


def test_an_ack_that_did_not_return_may_be_redelivered() -> None:
    h = _history()
    log = _record(h, 2)
    h.cursor_open("c", CURSOR, 1, OK)
    _deliver(h, 1, 0)
    h.cursor_ack("c", CURSOR, 1, (1, 0, 0), "ack")
    h.cursor_ack_done("c", CURSOR, 1, (1, 0, 0), "ack", "info", why="TimeoutError")
    h.cursor_open("c", CURSOR, 2, OK)
    _deliver(h, 2, 0, 1)
    assert _invariants(h, log) == set()


def test_a_skipped_unacknowledged_record_is_cu2_unless_truncated() -> None:
    h = _history()
    log = _record(h, 4)
    h.cursor_open("c", CURSOR, 1, OK)
    _deliver(h, 1, 0, 1, 2)
    _ack(h, 1, 0, md=(1, 0, 0))
    _ack(h, 1, 2, md=(1, 0, 0))  # 1: handed out, never acknowledged
    h.cursor_open("c", CURSOR, 2, OK, (1, 0, 0))
    _deliver(h, 2, 3)
    assert _invariants(h, log) == {"CU2"}
    h2 = _history()
    log2 = _record(h2, 4)
    h2.cursor_open("c", CURSOR, 1, OK)
    _deliver(h2, 1, 0, 1, 2)
    _ack(h2, 1, 0, md=(1, 0, 0))
    _ack(h2, 1, 2, md=(1, 0, 0))
    cut = h2.log_truncate("meta", "simlog", (1, 3, 0), "stored")
    h2.cursor_open("c", CURSOR, 2, OK, (1, 0, 0))
    _deliver(h2, 2, 3)
    assert _invariants(h2, log2, [cut]) == set()


def test_a_mark_delete_position_past_an_unacknowledged_record_is_cu3() -> None:
    h = _history()
    log = _record(h, 3)
    h.cursor_open("c", CURSOR, 1, OK)
    _deliver(h, 1, 0, 1, 2)
    _ack(h, 1, 2, md=(1, 2, 0))  # 0 and 1 never acknowledged
    assert "CU3" in _invariants(h, log)


def test_the_swarm_draws_cursors_from_a_stream_of_its_own() -> None:
    for seed in range(200):
        plain = Workload.draw(derive_rng(seed, "workload"))
        drawn = Workload.draw(derive_rng(seed, "workload"),
                              lambda name, s=seed: derive_rng(s, name))
        assert plain.log_cursors == 0 and not plain.log_offload
        assert drawn.log_cursors in (0, 1)
        assert (drawn.log_cursors == 0 and not drawn.log_offload) or drawn.log_writers == 1
        assert drawn.log_offload or not drawn.log_tier_sweep  # (sweeps only where it offloads)
        assert replace(drawn, log_cursors=0, log_offload=False, log_tier_sweep=False,
                       adv_writers=0, deferred_writers=0, mirror=False) == plain
    drawn_seeds = [s for s in range(200) if scenario_of(s).workload.log_cursors]
    assert 10 <= len(drawn_seeds) <= 45, drawn_seeds
    assert Workload.draw(random.Random(1), None).log_cursors == 0


CURSORS_ONLY = Workload(writers=0, readers=0, recoverers=0, deletes=False, autorecovery=False,
                        log_cursors=1)


def test_a_consumer_under_faults_passes_and_restarts() -> None:
    r = run(3, duration=12.0, faults=Faults.all(), keep_history=True, workload=CURSORS_ONLY)
    assert r.ok, r.report()
    assert r.stats.coverage.get("workload_log_cursors") == 1
    assert r.history is not None
    opens = [e for e in r.history if e.kind == "cursor_open" and e.outcome == OK]
    acks = [e for e in r.history if e.kind == "cursor_ack_done" and e.outcome == OK]
    assert len(opens) >= 2 and acks  # restarted at least once, acknowledged
    # some instances share the cursor between two consumers, which close and hand back
    assert r.stats.coverage.get("cursor_shared_consumers", 0) > 0
    assert r.stats.coverage.get("cursor_shared_consumer_closed", 0) > 0
    assert any("the cursor reads to the end: ok" in line for line in r.trace)


def test_a_mark_delete_position_persisted_past_a_pending_record_is_caught() -> None:
    r = run(3, duration=12.0, faults=Faults.all(), workload=CURSORS_ONLY,
            mutations=("cursor_mark_delete_past_pending",))
    assert {v.invariant for v in r.violations} & {"CU2", "CU3"}, r.report()
