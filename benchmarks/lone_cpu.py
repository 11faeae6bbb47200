"""CPU per lone append: one record at a time, each awaited before the next, with no I/O.

The Python path of a lone commit alone: ``pybk.WAL`` / ``pybk.AsyncWAL`` on a
``MemFileSystem`` (no write, no fsync, no sync helper), 100-byte records, the process's CPU
time (user + system, every thread: the caller's and the loop's) over the appends, and the
Python-level calls per append (cProfile, a separate pass). Each shape runs in a process of its
own; with ``--against DIR`` (another checkout's root) the two builds alternate round by
round, so a shared machine's drift moves both alike; medians over the rounds.

    python benchmarks/lone_cpu.py [--rounds 5] [--count 3000] [--against /path/to/other]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

SHAPES = ("async 1 replica", "sync 1 replica", "async default", "sync default")
ONE = {"bookies": 1, "ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1}


def _child(shape: str, count: int, profile: bool) -> None:
    import cProfile

    import pybk
    from pybk.storage.memfs import MemFileSystem

    knobs = dict(ONE) if "1 replica" in shape else {}
    knobs["cluster_options"] = {"fs": MemFileSystem()}
    payload = os.urandom(100)
    prof = cProfile.Profile() if profile else None

    with tempfile.TemporaryDirectory(prefix="pybk-lonecpu-") as root:
        if shape.startswith("sync"):
            with pybk.WAL(root, **knobs) as wal:
                for _ in range(300):
                    wal.append(payload)
                on_loop = cProfile.Profile() if profile else None  # (the loop's thread)
                if prof is not None and on_loop is not None:
                    wal._runner.run(_call(on_loop.enable))
                    prof.enable()
                c0, w0 = time.process_time(), time.perf_counter()
                for _ in range(count):
                    wal.append(payload)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                if prof is not None and on_loop is not None:
                    prof.disable()
                    wal._runner.run(_call(on_loop.disable))
                    prof.create_stats()
                    on_loop.create_stats()
                    print(f"{(_calls(prof) + _calls(on_loop)) / count:.1f}")
                    return
        else:
            async def go() -> tuple[float, float]:
                async with pybk.AsyncWAL(root, **knobs) as wal:
                    for _ in range(300):
                        await wal.append(payload)
                    if prof is not None:
                        prof.enable()
                    c0, w0 = time.process_time(), time.perf_counter()
                    for _ in range(count):
                        await wal.append(payload)
                    return time.process_time() - c0, time.perf_counter() - w0
            cpu, wall = asyncio.run(go())
    if prof is not None:
        prof.disable()
        print(f"{_calls(prof) / count:.1f}")
    else:
        print(f"{cpu / count * 1e6:.2f} {wall / count * 1e6:.2f}")


async def _call(fn: Callable[[], object]) -> None:
    fn()


def _calls(prof: Any) -> int:
    import pstats

    return int(pstats.Stats(prof).total_calls)  # type: ignore[attr-defined]


def _run(root: str, shape: str, count: int, profile: bool = False) -> list[float]:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=root)
    cmd = [sys.executable, os.path.join(here, "lone_cpu.py"), "--child", shape,
           "--count", str(count)] + (["--profile"] if profile else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return [float(x) for x in out.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--count", type=int, default=3000, help="timed appends per measurement")
    ap.add_argument("--against", help="another checkout's root: measured alternating")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.count, args.profile)
        return
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if s not in SHAPES]
    if bad or args.rounds < 1 or args.count < 1:
        ap.error(f"unknown shape {bad} (of {SHAPES})" if bad else "--rounds, --count >= 1")
    this = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    builds = {"this": this} | ({"against": os.path.abspath(args.against)} if args.against
                                else {})
    cpu: dict[tuple[str, str], list[float]] = {(b, s): [] for b in builds for s in shapes}
    wall: dict[tuple[str, str], list[float]] = {k: [] for k in cpu}
    print(f"{args.count:,} lone 100 B appends per measurement on MemFileSystem (no I/O), "
          f"{args.rounds} alternating rounds; process CPU (all threads) per append, medians")
    for r in range(args.rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        for shape in shapes:
            for b in order:
                c, w = _run(builds[b], shape, args.count)
                cpu[b, shape].append(c)
                wall[b, shape].append(w)
        print(f"round {r}: " + ", ".join(f"{b}/{s} {cpu[b, s][-1]:.0f}" for s in shapes
                                         for b in builds)
              + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    calls = {(b, s): _run(builds[b], s, min(args.count, 1000), profile=True)[0]
             for b in builds for s in shapes}
    print(f"\n{'shape':<16} {'build':<8} {'CPU us':>8} {'range':>13} {'wall us':>8} "
          f"{'calls':>7}" + ("  this/against" if len(builds) > 1 else ""))
    for s in shapes:
        for b in builds:
            c = cpu[b, s]
            ratio = (f"  {statistics.median(c) / statistics.median(cpu['against', s]):.2f}"
                     if len(builds) > 1 and b == "this" else "")
            print(f"{s:<16} {b:<8} {statistics.median(c):8.1f} {min(c):6.0f}-{max(c):<6.0f} "
                  f"{statistics.median(wall[b, s]):8.1f} {calls[b, s]:7.0f}{ratio}")


if __name__ == "__main__":
    main()
