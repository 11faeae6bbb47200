"""Whole-cluster simulations fanned out over Spark executors: one row per seed.

Each seed runs in an executor's Python worker exactly as ``pybk simulate`` runs it in a local
process (:func:`pybk.sim.sweep.run_seed`: the same code, configuration and fault plan), so
its trace hash is the one a local run gives; Spark only decides where. The rows come back to
the driver and are answered as a DataFrame (and, for the command line, as the sweep's own
summary, printed the same way).

The simulator is deterministic whatever the process's hash seed, and workers also get
``PYTHONHASHSEED=0`` (PySpark's default for its workers, as the local sweep's processes do).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["SIM_ROWS", "run_on_spark", "simulate", "summary_from_rows"]

#: one row per seed
SIM_ROWS = ("seed BIGINT, ok BOOLEAN, violations ARRAY<STRING>, trace_hash STRING, "
            "operations BIGINT, faults MAP<STRING, BIGINT>, wall_seconds DOUBLE, "
            "virtual_seconds DOUBLE, coverage MAP<STRING, BIGINT>, topology ARRAY<INT>, "
            "command STRING, report STRING")


def _run_seeds(args: tuple[str, float, int | None, tuple[str, ...]]) -> Callable[
        [Iterator[int]], Iterator[tuple[Any, ...]]]:
    faults, duration, bookies, mutations = args

    def run(seeds: Iterator[int]) -> Iterator[tuple[Any, ...]]:
        from pybk.sim.sweep import run_seed  # in the executor: the local sweep's own function

        for seed in seeds:
            s = run_seed(int(seed), faults, duration, bookies, mutations)
            yield (s.seed, s.ok, list(s.invariants), s.trace_hash, s.operations,
                   dict(s.faults), s.wall_seconds, s.virtual_seconds, dict(s.coverage),
                   list(s.topology), s.command, s.report)

    return run


def run_on_spark(
    spark: Any,
    seeds: Iterable[int],
    *,
    faults: str = "all",
    duration: float = 30.0,
    bookies: int | None = None,
    mutations: tuple[str, ...] = (),
    partitions: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[list[tuple[Any, ...]], float]:
    """Run the seeds on the executors; (rows in seed order, wall seconds). ``on_progress``
    gets (seeds done, seeds) while the job runs (from Spark's status tracker)."""
    from pybk.sim.faults import Faults

    seed_list = [int(s) for s in seeds]
    Faults.parse(faults)  # a bad fault spec fails here, on the driver
    if not seed_list:
        return [], 0.0
    sc = spark.sparkContext
    # several seeds per task (a task costs a round trip to a worker), several tasks per
    # core (seeds differ in length: small tasks even the cores out)
    n = partitions or 8 * sc.defaultParallelism
    n = max(1, min(n, len(seed_list)))
    group = f"pybk-simulate-{id(seed_list):x}"
    rdd = sc.parallelize(seed_list, n).mapPartitions(
        _run_seeds((faults, duration, bookies, tuple(mutations))))
    out: dict[str, Any] = {}

    def collect() -> None:
        sc.setJobGroup(group, "pybk simulate", interruptOnCancel=True)
        try:
            out["rows"] = rdd.collect()
        except BaseException as exc:
            out["error"] = exc

    start = time.perf_counter()
    thread = threading.Thread(target=collect, name="pybk-simulate-collect", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.25)
            if on_progress is not None:
                done = 0
                tracker = sc.statusTracker()
                for job_id in tracker.getJobIdsForGroup(group):
                    job = tracker.getJobInfo(job_id)
                    for stage_id in (job.stageIds if job else []):
                        stage = tracker.getStageInfo(stage_id)
                        if stage is not None:
                            done += stage.numCompletedTasks
                on_progress(min(len(seed_list), done * len(seed_list) // n), len(seed_list))
    except BaseException:
        sc.cancelJobGroup(group)
        thread.join(30)
        raise
    wall = time.perf_counter() - start
    if "error" in out:
        raise out["error"]
    rows = sorted(out["rows"], key=lambda r: r[0])
    if on_progress is not None:
        on_progress(len(seed_list), len(seed_list))
    return rows, wall


def simulate(
    spark: Any,
    seeds: Iterable[int] = range(100),
    *,
    faults: str = "all",
    duration: float = 30.0,
    bookies: int | None = None,
    partitions: int | None = None,
) -> Any:
    """Run one simulation per seed on Spark's executors and return a DataFrame, one row per
    seed (SIM_ROWS): seed, ok, the violated invariants, trace hash, operations, faults by
    kind, wall seconds (and virtual seconds, coverage, topology, the command that
    reproduces it, the report of a failing seed). Eager: the simulations run here, once.

    Every trace hash equals the one ``pybk.sim.run(seed, ...)`` gives in a local process
    with the same arguments."""
    rows, _ = run_on_spark(spark, seeds, faults=faults, duration=duration, bookies=bookies,
                           partitions=partitions)
    return spark.createDataFrame(rows, SIM_ROWS)


def summary_from_rows(rows: Iterable[Any], wall_seconds: float, workers: int) -> Any:
    """The local sweep's :class:`~pybk.sim.sweep.SweepSummary` of rows from
    :func:`run_on_spark` (or a DataFrame's collected rows), for printing it the same way."""
    from pybk.sim.sweep import SeedSummary, SweepSummary

    seeds = []
    for r in rows:
        (seed, ok, violations, trace_hash, operations, faults, wall, virtual, coverage,
         topology, command, report) = tuple(r)
        seeds.append(SeedSummary(
            seed=int(seed), ok=bool(ok), trace_hash=str(trace_hash),
            virtual_seconds=float(virtual), wall_seconds=float(wall),
            operations=int(operations), faults=dict(faults or {}),
            coverage=dict(coverage or {}),
            topology=tuple(topology) if topology is not None else (0, 0, 0),
            command=str(command), report=str(report or ""),
            invariants=list(violations or []),
        ))
    seeds.sort(key=lambda s: s.seed)
    return SweepSummary(seeds, wall_seconds, workers)
