"""Spark bulk writes into pybk beside Parquet, and simulations on Spark beside the local sweep.

1. Rows/s of writing one cached DataFrame (1,000,000 rows of 100 bytes by default) from
   ``local[2]`` with ``df.write.format("pybk")`` into 3 ``pybk bookie`` processes over TCP
   (``pybk cluster up``; a log with E3/Qw2/Qa2, no compression) and with
   ``df.write.parquet`` to a directory on the same disk, in alternating rounds; the medians
   and the ratio pybk / Parquet (the goal: at least 0.5x). ``write_partitions`` (the
   mapInArrow path) is measured too. A first, untimed round warms the JVM's JIT and the
   Python workers up (the first write of a session is 2-4x slower for every writer).
2. Seeds per minute of ``pybk.spark.simulate`` on ``local[2]`` beside ``pybk simulate``'s
   local sweep with 2 worker processes (the same 2 cores), the same seeds and duration.

What differs between the peers (say so with the figures): Parquet is written by the JVM
itself and fsyncs nothing; pybk moves each batch from the JVM to a Python worker (Arrow), then
over TCP to two bookies of three, each of which journals it with fsync (group commit) before
the write is acknowledged, and the job publishes in one metadata CAS at the end.

    .venv/bin/python benchmarks/spark_write.py [--rows 1000000] [--rounds 3] [--seeds 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _pybk(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True, text=True,
                         check=False)
    if out.returncode:
        raise SystemExit(f"pybk {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout.strip()


def _create_log(metadata: str, name: str) -> None:
    import asyncio

    import pybk

    async def go() -> None:
        async with pybk.Client(metadata) as client:
            await client.namespace().create_log(name, ensemble_size=3, write_quorum=2,
                                                ack_quorum=2, compression="none")

    asyncio.run(go())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_writes(spark: Any, metadata: str, root: Path, rows: int, size: int,
                 rounds: int, warmup: int) -> None:
    from pyspark.sql import functions as F

    import pybk.spark

    # 100-byte values (hex digits of a hash: Parquet cannot dictionary-encode them away)
    digest = F.concat(F.sha2(F.col("id").cast("string"), 512),
                      F.sha2((F.col("id") + 1).cast("string"), 512))
    df = spark.range(0, rows, numPartitions=2).select(
        F.substring(digest, 1, size).cast("binary").alias("value")).cache()
    assert df.count() == rows
    payload_mb = rows * size / 1e6
    times: dict[str, list[float]] = {"pybk data source": [], "pybk write_partitions": [],
                                     "parquet": []}
    for r in range(-warmup, rounds):
        for name in times:
            if name == "parquet":
                out = root / f"parquet-{r}"
                t0 = time.perf_counter()
                df.write.mode("overwrite").parquet(str(out))
                if r >= 0:
                    times[name].append(time.perf_counter() - t0)
                shutil.rmtree(out)
                continue
            log = f"bench-{name.split()[-1]}-{r + warmup}"
            _create_log(metadata, log)
            t0 = time.perf_counter()
            if name == "pybk data source":
                (df.write.format("pybk").option("metadata", metadata).option("log", log)
                 .mode("append").save())
            else:
                pybk.spark.write_partitions(df, metadata=metadata, log=log).collect()
            if r >= 0:
                times[name].append(time.perf_counter() - t0)
        if r < 0:
            print("warm-up round done (the JVM's JIT and the Python workers)", flush=True)
            continue
        line = "  ".join(f"{k} {rows / v[-1]:,.0f} rows/s" for k, v in times.items())
        print(f"round {r + 1}: {line}", flush=True)
    print(f"\n{rows:,} rows x {size} B ({payload_mb:.0f} MB) from local[2], median of {rounds}"
          f" alternating rounds:")
    print(f"{'writer':<24}{'rows/s':>12}{'MB/s':>9}{'p50 s':>9}{'max s':>9}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:<24}{rows / med[k]:>12,.0f}{payload_mb / med[k]:>9.1f}{_pct(v, 0.5):>9.2f}"
              f"{max(v):>9.2f}")
    for k in ("pybk data source", "pybk write_partitions"):
        print(f"ratio {k} / parquet: {med['parquet'] / med[k]:.2f}x (goal >= 0.5x)")
    df.unpersist()


def bench_simulate(spark: Any, seeds: int, duration: float) -> None:
    from pybk.sim.sweep import sweep
    from pybk.spark.simulate import run_on_spark

    seed_list = list(range(seeds))
    local = sweep(seed_list, duration=duration, workers=2)
    rows, wall = run_on_spark(spark, seed_list, duration=duration)
    spark_rate = 60 * len(rows) / wall
    same = sum(1 for r, s in zip(rows, local.seeds, strict=True) if r[3] == s.trace_hash)
    print(f"\nsimulation, {seeds} seeds x {duration:g} virtual s, faults all:")
    print(f"{'runner':<34}{'seeds/min':>10}{'wall s':>9}")
    print(f"{'pybk simulate, 2 local workers':<34}{local.seeds_per_minute:>10.1f}"
          f"{local.wall_seconds:>9.1f}")
    print(f"{'pybk.spark.simulate, local[2]':<34}{spark_rate:>10.1f}{wall:>9.1f}")
    print(f"ratio spark / local: {spark_rate / local.seeds_per_minute:.2f}x; trace hashes "
          f"equal for {same}/{seeds} seeds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--skip-writes", action="store_true")
    parser.add_argument("--skip-sim", action="store_true")
    args = parser.parse_args()
    import pybk.spark

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    root = Path(tempfile.mkdtemp(prefix="pybk-spark-bench-", dir=os.environ.get("TMPDIR")))
    spark = pybk.spark.local_session("local[2]", "pybk spark_write benchmark")
    try:
        if not args.skip_writes:
            metadata = _pybk("cluster", "up", "--root", str(root / "cluster"), "--bookies",
                             "3").splitlines()[-1]
            try:
                bench_writes(spark, metadata, root, args.rows, args.size, args.rounds,
                             args.warmup)
            finally:
                _pybk("cluster", "down", "--root", str(root / "cluster"))
        if not args.skip_sim:
            bench_simulate(spark, args.seeds, args.duration)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end (the machine is shared)")


if __name__ == "__main__":
    main()
