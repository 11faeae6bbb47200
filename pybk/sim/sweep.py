"""Run many seeds, in parallel processes where cores allow, and summarise them.

Used by ``pybk simulate`` and by the CI test. Each worker process runs whole seeds and sends
back a compact :class:`SeedSummary` (the full trace only for failing seeds). Workers get
``PYTHONHASHSEED=0`` so that even code that (wrongly) iterates over a set of strings cannot make
two runs of one seed differ between processes.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

from pybk.runtime import sometimes
from pybk.sim.faults import Faults
from pybk.sim.runner import SOMETIMES, run

__all__ = [
    "CI_DURATION",
    "CI_FAULTS",
    "CI_SEEDS",
    "SeedSummary",
    "SweepSummary",
    "default_workers",
    "find_violation",
    "parse_seeds",
    "run_seed",
    "sweep",
]


@dataclass
class SeedSummary:
    seed: int
    ok: bool
    trace_hash: str
    virtual_seconds: float
    wall_seconds: float
    operations: int
    faults: dict[str, int]
    coverage: dict[str, int]
    topology: tuple[int, int, int]
    command: str
    report: str = ""  # the violation report (failing seeds only)
    invariants: list[str] = field(default_factory=list)
    #: the configuration the seed drew (SimConfig.describe())
    config: str = ""
    cpu_seconds: float = 0.0


@dataclass
class SweepSummary:
    seeds: list[SeedSummary]
    wall_seconds: float
    workers: int

    @property
    def failures(self) -> list[SeedSummary]:
        return [s for s in self.seeds if not s.ok]

    @property
    def virtual_seconds(self) -> float:
        return sum(s.virtual_seconds for s in self.seeds)

    @property
    def operations(self) -> int:
        return sum(s.operations for s in self.seeds)

    @property
    def seeds_per_minute(self) -> float:
        return 60.0 * len(self.seeds) / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def cpu_seconds_per_seed(self) -> float:
        """CPU seconds one seed takes (its process's, whatever else shares the machine)."""
        return sum(s.cpu_seconds for s in self.seeds) / len(self.seeds) if self.seeds else 0.0

    @property
    def virtual_to_real(self) -> float:
        """Virtual seconds simulated per wall-clock second (summed over workers)."""
        return self.virtual_seconds / self.wall_seconds if self.wall_seconds else 0.0

    def faults(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for s in self.seeds:
            total.update(s.faults)
        return dict(sorted(total.items()))

    def coverage(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for s in self.seeds:
            total.update(s.coverage)
        return dict(sorted(total.items()))

    def never_reached(self) -> list[str]:
        """The sometimes points (pybk.runtime.sometimes) that no seed of the sweep hit."""
        hit = {k.removeprefix(SOMETIMES) for k in self.coverage() if k.startswith(SOMETIMES)}
        return sorted(set(sometimes.declared()) - hit)

    def invariants(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for s in self.seeds:
            total.update(s.invariants)
        return dict(sorted(total.items()))


def run_seed(seed: int, faults_spec: str, duration: float, bookies: int | None,
             mutations: tuple[str, ...]) -> SeedSummary:
    """One seed, summarised (picklable: runs in worker processes)."""
    # Bookies log the damage the simulator inflicts; the trace already has it (and the run
    # still sees every exception logged: pybk.sim.findings). Only for the run: a sweep run
    # in the caller's own process (one worker, a test) leaves its logging as it found it.
    logger = logging.getLogger("pybk")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    cpu = time.process_time()
    try:
        r = run(seed, bookies=bookies, duration=duration, faults=Faults.parse(faults_spec),
                mutations=mutations)
    finally:
        logger.setLevel(level)
    summary = SeedSummary(
        seed=seed, ok=r.ok, trace_hash=r.trace_hash, virtual_seconds=r.stats.virtual_seconds,
        wall_seconds=r.stats.wall_seconds, operations=r.stats.operations,
        faults=r.stats.faults, coverage=r.stats.coverage, topology=r.topology,
        command=r.command(), report="" if r.ok else r.report(),
        invariants=sorted({v.invariant for v in r.violations}),
        config=r.config.describe() if r.config is not None else "",
    )
    if _frozen_worker:
        # The run's objects are garbage now, in reference cycles (the run, its loop, its
        # tasks): freed here while they are still in the CPU's caches, they cost about a
        # third of what the next run's end-of-run collection paid to free them among its own
        # (1-2% of a seed). Only in a worker, where everything else is frozen out of the
        # collector's way; elsewhere a full collection walks every module's objects.
        del r
        gc.collect()
    summary.cpu_seconds = time.process_time() - cpu
    return summary


#: set by :func:`_worker_start` in a sweep's worker process
_frozen_worker = False


def _worker_start() -> None:
    """A sweep worker, once: load everything a seed uses, then move it all to the
    collector's permanent generation, so the collections a run makes (and the one at its
    end, which finalizes the run's coroutines while its loop can still run them) walk the
    run's own objects only, not every module of the process each time. (Not done by
    ``sim.run`` itself: a run's objects become garbage only after it returns, and frozen at
    the next run's start they would never be collected in a process that runs many.)"""
    import pybk.sim.runner  # noqa: F401  (imported for its side effect: loaded)

    global _frozen_worker
    logging.getLogger("pybk").setLevel(logging.CRITICAL)
    gc.collect()
    gc.freeze()
    _frozen_worker = True


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def sweep(
    seeds: Iterable[int],
    *,
    faults: str = "all",
    duration: float = 30.0,
    bookies: int | None = None,
    mutations: tuple[str, ...] = (),
    workers: int | None = None,
    on_result: Callable[[SeedSummary], None] | None = None,
) -> SweepSummary:
    """Run ``seeds`` (in ``workers`` processes; 1 = in this process) and summarise."""
    seeds = list(seeds)
    workers = workers or default_workers()
    start = time.perf_counter()
    results: list[SeedSummary] = []
    if workers <= 1 or len(seeds) <= 1:
        for s in seeds:
            res = run_seed(s, faults, duration, bookies, mutations)
            results.append(res)
            if on_result:
                on_result(res)
    else:
        # Spawned (not forked) workers start a fresh interpreter, which reads PYTHONHASHSEED
        # (workers start lazily, so the variable stays set while the pool runs).
        ctx = multiprocessing.get_context("spawn")
        saved = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = "0"
        try:
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                     initializer=_worker_start) as pool:
                futs = [pool.submit(run_seed, s, faults, duration, bookies, mutations)
                        for s in seeds]
                for fut in as_completed(futs):
                    res = fut.result()
                    results.append(res)
                    if on_result:
                        on_result(res)
        finally:
            if saved is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = saved
    results.sort(key=lambda r: r.seed)
    return SweepSummary(results, time.perf_counter() - start, workers)


def parse_seeds(spec: str) -> list[int]:
    """``0..499`` (inclusive), ``7``, or a comma list of both."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        if ".." in part:
            lo, hi = part.split("..", 1)
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"empty seed range {part!r}")
            out.extend(range(a, b + 1))
        else:
            out.append(int(part))
    return out


#: The CI sweep (tests/sim/test_ci_sweep.py): seeds, faults and virtual seconds per seed.
CI_SEEDS = range(0, 500)
CI_FAULTS = "all"
CI_DURATION = 30.0


def find_violation(
    seeds: Iterable[int],
    *,
    mutations: tuple[str, ...] = (),
    faults: str = CI_FAULTS,
    duration: float = CI_DURATION,
    invariants: Iterable[str] | None = None,
) -> SeedSummary | None:
    """Run ``seeds`` in order in this process; return the first seed whose violations include
    one of ``invariants`` (any, if None), or None when every seed passes that bar."""
    wanted = None if invariants is None else set(invariants)
    for s in seeds:
        res = run_seed(s, faults, duration, None, mutations)
        if not res.ok and (wanted is None or wanted & set(res.invariants)):
            return res
    return None
