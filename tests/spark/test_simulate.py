"""Simulations fanned out over Spark executors: every seed's trace hash equals a local run's,
and ``pybk simulate --spark`` prints the summary the local sweep prints."""

from __future__ import annotations

import re
from typing import Any

from click.testing import CliRunner

import pybk.spark
from pybk import sim
from pybk.cli import main as pybk_main
from pybk.sim.sweep import run_seed

#: virtual seconds per seed: short, so 40 seeds stay a few seconds of the suite
DURATION = 3.0


def test_forty_seeds_through_spark_equal_local_runs(spark: Any) -> None:
    df = pybk.spark.simulate(spark, seeds=range(40), faults="all", duration=DURATION)
    assert df.columns[:7] == ["seed", "ok", "violations", "trace_hash", "operations", "faults",
                              "wall_seconds"]
    rows = {r.seed: r for r in df.collect()}
    assert sorted(rows) == list(range(40))
    for seed in range(40):
        local = run_seed(seed, "all", DURATION, None, ())
        row = rows[seed]
        assert row.trace_hash == local.trace_hash, f"seed {seed}: traces differ"
        assert (row.ok, sorted(row.violations), row.operations, dict(row.faults)) == (
            local.ok, local.invariants, local.operations, local.faults)
        assert row.wall_seconds > 0
    # and the library's own entry point agrees for one of them
    assert sim.run(seed=7, duration=DURATION, faults=sim.Faults.all()).trace_hash == \
        rows[7].trace_hash
    assert sum(sum(r.faults.values()) for r in rows.values()) > 0  # faults were injected


def _table(output: str) -> dict[str, str]:
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│|]", line) if c.strip()]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_cli_spark_sweep_prints_the_local_summary(spark: Any) -> None:
    args = ["simulate", "--seeds", "0..5", "--duration", str(DURATION)]
    runner = CliRunner()
    local = runner.invoke(pybk_main, [*args, "--workers", "1"])
    on_spark = runner.invoke(pybk_main, [*args, "--spark", "local[2]"])  # reuses the session
    assert local.exit_code == on_spark.exit_code, on_spark.output
    a, b = _table(local.output), _table(on_spark.output)
    assert "seeds" in a and "coverage" in a
    timing = {"wall seconds", "seeds per minute", "virtual-to-real ratio",
              "CPU seconds per seed"}
    assert {k: v for k, v in a.items() if k not in timing} == \
        {k: v for k, v in b.items() if k not in timing}
    assert set(a) == set(b)
    assert spark.sparkContext._jsc is not None  # the test's session is still up
