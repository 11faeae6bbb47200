"""What the bookies' garbage collector costs everything else (issue 45): each row run with
the collector as shipped ("on") and without it ("off"), alternating in one run, with the ratio
and the spread between equal runs beside it.

    python benchmarks/gc_cost.py [--rounds 3] [--duration 2] [--lone 2000] [--seeds 0..9]
                                 [--only ledger,wal,lone,sim] [--dir /tmp]

"Off" is a bookie as it was before the collector: ``gc_interval=0`` (no collection or
compaction is ever scheduled) and every journal segment full size from the start
(``segment_initial_size=0``, no growing segments). Rows:

1. ``ledger``: a 3-bookie ``LocalCluster``, E3/Qw2/Qa2, 100 B, 1024 in flight (the pybk side
   of ``targets.py``'s ceiling row): entries/s.
2. ``wal``: ``pybk.AsyncWAL`` on its embedded cluster (collector every 5 s), 1 kB records, 1024
   in flight (``wal_append.py``'s main row): records/s.
3. ``lone``: ``pybk.WAL``, one 100 B append awaited at a time (``lone_commit.py``'s row): p50.
4. ``sim``: CPU seconds per simulated seed (30 virtual seconds, all faults, as a sweep's
   worker runs it); "off" runs the same seeds with the simulated bookies' collector (every 2
   virtual seconds) unscheduled.

The ledger and wal rows also print the CPU per append (this process's, all its threads'):
on a machine others share, the load moves wall-clock rates far more than CPU time. Each line
prints the median of the rounds' on/off ratios and their range; the verdict is in ``cost``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

from _common import closed_loop, median, paired_cost, pct

import pybk
from pybk.bookie import BookieConfig
from pybk.cluster import LocalCluster
from pybk.wal import embedded_bookie_config

ROWS = ("ledger", "wal", "lone", "sim")
#: a row's figure: higher is better for rates, lower for times
HIGHER = {"ledger": True, "wal": True, "lone": False, "sim": False}
UNIT = {"ledger": "entries/s", "wal": "records/s", "lone": "ms p50", "sim": "CPU s/seed"}


def off(config: BookieConfig) -> BookieConfig:
    """``config`` without the collector and with full-size segments from the start."""
    return dataclasses.replace(config, gc_interval=0.0, segment_initial_size=0)


async def timed_rate(append: Any, duration: float) -> tuple[float, float]:
    """(appends/s, CPU µs per append: this process's, every thread's) after a warm-up."""
    await closed_loop(append, 1024, min(duration, 0.3))
    cpu = time.process_time()
    run = await closed_loop(append, 1024, duration)
    return float(run.rate), (time.process_time() - cpu) * 1e6 / max(1, run.count)


async def ledger_rate(root: str, config: BookieConfig, duration: float) -> tuple[float, float]:
    async with LocalCluster(root, 3, bookie_config=config) as c:
        lh = await c.client().create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        payload = os.urandom(100)
        out = await timed_rate(lambda: lh.append(payload), duration)
        await lh.close()
        return out


async def wal_rate(root: str, config: BookieConfig, duration: float) -> tuple[float, float]:
    async with pybk.AsyncWAL(root, cluster_options={"bookie_config": config}) as wal:
        payload = os.urandom(1000)
        return await timed_rate(lambda: wal.append(payload), duration)


def lone_p50(root: str, config: BookieConfig, count: int) -> float:
    payload = os.urandom(100)
    with pybk.WAL(root, cluster_options={"bookie_config": config}) as wal:
        for _ in range(min(200, count)):
            wal.append(payload)
        lat = []
        for _ in range(count):
            t0 = time.perf_counter()
            wal.append(payload)
            lat.append(time.perf_counter() - t0)
    return pct(lat, 0.5) * 1e3


_SIM_CHILD = textwrap.dedent("""
    import dataclasses, gc, json, logging, sys, time
    logging.getLogger("pybk").setLevel(logging.CRITICAL)
    from pybk import sim
    from pybk.sim.configs import SimConfig

    seeds, collector = json.loads(sys.argv[1]), sys.argv[2] == "on"
    if not collector:  # (this process only: every seed's bookies without the collector)
        shipped = SimConfig.bookie_config
        SimConfig.bookie_config = lambda self, mutations: dataclasses.replace(
            shipped(self, mutations), gc_interval=0.0)
    gc.collect()
    gc.freeze()
    t0 = time.process_time()
    steps = 0
    for s in seeds:
        r = sim.run(s, faults=sim.Faults.all())
        steps += r.stats.loop_steps
        if not r.ok:
            print("FAILED", s, sorted({v.invariant for v in r.violations}), file=sys.stderr)
    print(json.dumps({"cpu": time.process_time() - t0, "steps": steps}))
""")


def sim_cpu(seeds: list[int], collector: bool) -> tuple[float, float]:
    """(CPU s per seed, loop steps per seed) of ``seeds`` in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _SIM_CHILD, json.dumps(seeds),
                          "on" if collector else "off"], check=True, capture_output=True,
                         text=True, cwd=tempfile.gettempdir(),
                         env=dict(os.environ, PYTHONHASHSEED="0"))
    if out.stderr.strip():
        print(out.stderr.strip(), file=sys.stderr)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got["cpu"]) / len(seeds), float(got["steps"]) / len(seeds)


def measure(row: str, collector: bool, root: str, args: argparse.Namespace
            ) -> tuple[float, float | None]:
    """(the row's figure, its second: CPU µs per append, loop steps per seed, or None)."""
    path = tempfile.mkdtemp(prefix=f"gc-cost-{row}-", dir=root)
    try:
        if row == "ledger":
            config = BookieConfig() if collector else off(BookieConfig())
            return asyncio.run(ledger_rate(path, config, args.duration))
        if row == "wal":
            config = embedded_bookie_config()
            return asyncio.run(wal_rate(path, config if collector else off(config),
                                        args.duration))
        if row == "lone":
            config = embedded_bookie_config()
            return lone_p50(path, config if collector else off(config), args.lone), None
        return sim_cpu(args.seeds, collector)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def cost(on: list[float], off_: list[float], higher: bool) -> tuple[float, str, str]:
    """What on costs against off, round by round (``paired_cost``)."""
    return paired_cost([(b / a if higher else a / b) for a, b in zip(on, off_, strict=True)])


def main() -> None:
    from pybk.sim.sweep import parse_seeds

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per rate measurement")
    p.add_argument("--lone", type=int, default=2000, help="lone appends per measurement")
    p.add_argument("--seeds", default="0..9", help="simulated seeds per measurement")
    p.add_argument("--only", default=",".join(ROWS))
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    args.seeds = list(parse_seeds(args.seeds))
    rows = [r for r in args.only.split(",") if r]
    if unknown := set(rows) - set(ROWS):
        p.error(f"unknown rows {sorted(unknown)}: choose from {', '.join(ROWS)}")
    root = tempfile.mkdtemp(prefix="gc-cost-", dir=args.dir)
    got: dict[tuple[str, bool], list[tuple[float, float | None]]] = {}
    try:
        for i in range(args.rounds):
            for row in rows:  # on and off alternate, and which goes first alternates too
                for collector in ((True, False) if i % 2 == 0 else (False, True)):
                    got.setdefault((row, collector), []).append(
                        measure(row, collector, root, args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"gc_cost: {args.rounds} rounds, medians with the collector on / off, alternating")
    print(f"{'row':<12} {'unit':<11} {'on':>11} {'off':>11} {'cost':>6} {'rounds':>10}  verdict")
    note = ""
    for row in rows:
        on, off_ = got[(row, True)], got[(row, False)]
        lines = [(row, UNIT[row], [x[0] for x in on], [x[0] for x in off_], HIGHER[row])]
        if row == "sim":  # (deterministic: the same every round)
            steps = on[0][1] or 0.0, off_[0][1] or 1.0
            note = (f"sim: {steps[0]:,.0f} loop steps per seed with the collector, "
                    f"{steps[1]:,.0f} without ({steps[0] / steps[1]:.3f}x)")
        elif on[0][1] is not None:
            lines.append((f"{row} CPU", "us/append", [x[1] or 0.0 for x in on],
                          [x[1] or 0.0 for x in off_], False))
        for name, unit, a, b, higher in lines:
            ratio, spread, say = cost(a, b, higher)
            print(f"{name:<12} {unit:<11} {median(a):>11,.2f} {median(b):>11,.2f} "
                  f"{ratio:>5.2f}x {spread:>10}  {say}")
    if note:
        print(note)


if __name__ == "__main__":
    main()
