"""Whole-cluster simulations fanned out over Spark executors: ``pybk.spark.simulate`` runs one
seed per row (crashes, partitions, lost writes, corrupt disks injected from the seed), and a
few seeds are run again locally to show the traces are the same, byte for byte.

    .venv/bin/python spark_examples/sim_sweep.py [--seeds 200] [--duration 10]
"""

from __future__ import annotations

import time

from _cluster import arguments, check, session
from pyspark.sql import functions as F

import pybk.spark
from pybk import sim


def main() -> None:
    args = arguments(__doc__, seeds=(int, 200, "how many seeds (0..N-1)"),
                     duration=(float, 10.0, "virtual seconds of faults per seed"))
    spark = session(args.master, "pybk sim_sweep")
    try:
        t0 = time.perf_counter()
        df = pybk.spark.simulate(spark, seeds=range(args.seeds), faults="all",
                                 duration=args.duration)
        wall = time.perf_counter() - t0
        df.select("seed", "ok", "violations", "operations", "faults", "wall_seconds") \
            .show(5, truncate=False)
        totals = df.agg(F.count("*").alias("seeds"), F.sum(F.col("ok").cast("int")).alias("ok"),
                        F.sum("operations").alias("operations")).collect()[0]
        print(f"{totals.seeds} seeds in {wall:.1f} s ({60 * totals.seeds / wall:.0f} seeds/min "
              f"on {args.master}), {totals.operations:,} operations")
        failing = df.filter(~F.col("ok")).select("seed", "violations", "command").collect()
        for row in failing:
            print(f"seed {row.seed} violated {row.violations}: {row.command}")
        hashes = {r.seed: r.trace_hash for r in df.select("seed", "trace_hash").collect()}
    finally:
        spark.stop()
    check(sorted(hashes) == list(range(args.seeds)), f"{args.seeds} seeds ran, one row each")
    for seed in (0, args.seeds // 2, args.seeds - 1):
        local = sim.run(seed=seed, duration=args.duration, faults=sim.Faults.all())
        check(local.trace_hash == hashes[seed],
              f"seed {seed}: the executor's trace hash is the local run's "
              f"({local.trace_hash[:16]}...)")
    check(not failing, "every seed kept every invariant")


if __name__ == "__main__":
    main()
