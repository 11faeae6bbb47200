"""I13: a run is a pure function of its seed (same trace, byte for byte)."""

from __future__ import annotations

from pybk import sim


def test_twenty_seeds_run_twice_give_identical_traces() -> None:
    first = {s: sim.run(s, duration=10.0, faults=sim.Faults.all()) for s in range(20)}
    second = {s: sim.run(s, duration=10.0, faults=sim.Faults.all()) for s in range(20)}
    for s in range(20):
        assert first[s].trace_hash == second[s].trace_hash, f"seed {s} diverged"
        assert first[s].trace == second[s].trace
    # Different seeds really are different runs.
    assert len({r.trace_hash for r in first.values()}) == 20


def test_result_carries_stats_and_a_repro_command() -> None:
    r = sim.run(3, bookies=4, duration=5.0, faults=sim.Faults.parse("crash,drop"))
    assert r.ok, r.report()
    assert r.bookies == 4
    assert r.stats.virtual_seconds >= 5.0
    assert r.stats.operations > 0 and r.stats.messages > 0
    assert "--seed 3" in r.command() and "--faults crash,drop" in r.command()
    assert r.trace[0].split()[1:3] == ["seed", "3"]


def test_the_repro_command_replays_the_same_run() -> None:
    """The command printed for a failing seed must replay that run exactly, whether the bookie
    count was drawn from the seed or given (a sweep once printed ``--bookies N`` for a drawn
    count, and passing it changed what the seed drew: the "repro" passed)."""
    import shlex

    from click.testing import CliRunner

    from pybk.cli.simulate import simulate

    for bookies in (None, 5):
        r = sim.run(911, bookies=bookies, duration=5.0, faults=sim.Faults.all())
        args = shlex.split(r.command())[2:]  # drop "pybk simulate"
        assert ("--bookies" in args) == (bookies is not None)
        out = CliRunner().invoke(simulate, args)
        assert f"trace hash {r.trace_hash}" in out.output, (r.command(), out.output[-500:])


def test_same_trace_in_another_process() -> None:
    """Hash randomization and memory addresses differ between processes: a run must not care."""
    from pybk.sim.sweep import sweep

    here = {s: sim.run(s, duration=10.0, faults=sim.Faults.all()).trace_hash for s in range(4)}
    there = sweep(range(4), faults="all", duration=10.0, workers=2)
    assert {s.seed: s.trace_hash for s in there.seeds} == here


def test_a_sweep_worker_frees_each_runs_objects_before_the_next_run(monkeypatch) -> None:
    """In a worker (everything loaded frozen), ``run_seed`` frees the finished run's cyclic
    garbage at once: nothing of it is left for the next run's collection to find, and the
    summary is the one a caller's own process gets."""
    import gc

    from pybk.sim import sweep

    plain = sweep.run_seed(3, "all", 3.0, None, ())
    monkeypatch.setattr(sweep, "_frozen_worker", True)
    gc.collect()
    as_worker = sweep.run_seed(3, "all", 3.0, None, ())
    assert gc.collect() < 50  # (without it: the run's thousand-odd objects in cycles)
    assert (as_worker.trace_hash, as_worker.ok) == (plain.trace_hash, plain.ok)
    assert as_worker.cpu_seconds > 0
