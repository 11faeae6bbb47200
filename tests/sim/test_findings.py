"""Failures are findings: a bug that raises instead of corrupting data is caught (X1), in a
bookie (its handler answers IO_ERROR and logs the exception) and in a client (a tailing
reader whose LAC read raises: the blind spot the old harness had, where every exception a
reader met was swallowed); the faults' expected errors are not."""

from __future__ import annotations

import pytest

from pybk import sim
from pybk.sim.scenario import Scenario

LOAD = sim.Workload(recoverers=0, deletes=False, log_writers=0, log_readers=0)


def short(seed: int = 2) -> Scenario:
    return Scenario(seed=seed, duration=5.0, topology=(3, 2, 2), bookies=3,
                    config=sim.SimConfig(), workload=LOAD, plan=sim.FaultPlan(), events=[],
                    faults_spec="none")


def test_a_clean_run_has_no_findings() -> None:
    r = sim.run(0, scenario=short())
    assert r.ok, r.report()


def test_an_exception_inside_a_bookie_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    from pybk.bookie.bookie import Bookie

    real = Bookie._read_lac

    def broken(self: Bookie, req: object) -> object:
        if getattr(req, "ledger_id", 0) >= 1:
            raise KeyError("a bug in the bookie's LAC read")
        return real(self, req)  # type: ignore[arg-type]

    monkeypatch.setattr(Bookie, "_read_lac", broken)
    r = sim.run(0, scenario=short())
    x1 = [v for v in r.violations if v.invariant == "X1"]
    assert x1, r.report()
    assert "KeyError" in x1[0].message and "a bug in the bookie" in x1[0].message
    assert any("Traceback" in line for line in r.trace), "the trace carries the traceback"


def test_a_tail_readers_lac_read_that_raises_is_a_finding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pybk.client.reader import ReadHandle

    async def broken(self: ReadHandle) -> int:
        raise AttributeError("a bug in the reader's LAC read")

    monkeypatch.setattr(ReadHandle, "read_last_add_confirmed", broken)
    r = sim.run(0, scenario=short())
    found = [v for v in r.violations if v.invariant == "X1"]
    assert found and "AttributeError" in found[0].message, r.report()
    assert found[0].message.startswith("r1 ")


def test_expected_errors_of_injected_faults_are_not_findings() -> None:
    sc = short(5)
    sc.plan = sim.FaultPlan(drop=0.05, reset=0.02, events=["crash", "partition"],
                            weights={"crash": 1, "partition": 1})
    sc.events = [sim.FaultEvent(1.0, "crash", 1), sim.FaultEvent(2.0, "partition", 2),
                 sim.FaultEvent(3.0, "crash", 3)]
    r = sim.run(0, scenario=sc)
    assert sum(r.stats.faults.values()) > 3
    assert not [v for v in r.violations if v.invariant == "X1"], r.report()


def test_a_seed_run_in_this_process_leaves_its_logging_as_it_was() -> None:
    """A sweep's seed quiets pybk's loggers while it runs (the trace has what bookies log),
    then puts the level back: a sweep run in the caller's own process (one worker, a test)
    must not silence the application's pybk warnings afterwards."""
    import logging

    from pybk.sim.sweep import run_seed

    logger = logging.getLogger("pybk")
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        summary = run_seed(0, "none", 2.0, None, ())
        assert summary.ok, summary.report
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(before)
