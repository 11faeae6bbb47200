"""Disk use over time with the bookies' own garbage collection (issue 45), against its bound.

Two soaks, each sampling the bytes on disk (allocated blocks) every ``--sample`` seconds:

* **wal**: ``pybk.AsyncWAL(path, roll_bytes=1 MiB)`` (3 embedded bookies, every record on all
  3) appending ``--record`` byte records at ``--rate`` records/s and truncating every second
  to keep its last ``--retain-mb`` MB. Bound: replicas x (1.5 x retained + 16 MB); the
  verdict is on the largest sample of the last half of the run (disk use must level off
  under the bound and stay there).
* **p99**: a lone writer's append p50 and p99, idle and while every bookie of a 3-bookie
  ``LocalCluster`` compacts (major, paced) segments half of which was deleted; target: the
  p99 while compacting within 1.5x of idle.
* **logtime**: the same appends to a log (``pybk.logs``, E=Qw=3, 1 MiB segments) on a
  3-bookie ``LocalCluster`` with retention by time (the seconds that hold ``--retain-mb``),
  against the same bound.
* **ledgers**: a 3-bookie ``LocalCluster`` (with the WAL's bookies) with
  ``--ledgers`` ledgers of ``--ledger-mb`` MB each (E=Qw=3), then all but a tenth deleted
  while a writer keeps appending to a live ledger. Bound: per bookie, 1.5 x its live data +
  16 MB; printed: how long after the deletions every bookie was within it, next to the
  collection interval.

The bookies are the embedded WAL's (``pybk.wal.embedded_bookie_config``: 4 MiB segments,
collection every 5 s) unless ``--gc-interval`` says otherwise; ``--minutes`` is 0.75 by
default to keep the run short (the issue's soak is ``--minutes 10``). ``--plot FILE.png``
draws disk use over time (needs matplotlib).

    python benchmarks/gc_soak.py [--minutes 10] [--rate 1000] [--retain-mb 10]
                                 [--ledgers 100] [--ledger-mb 1] [--gc-interval 5]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import pybk
from pybk.bookie import BookieConfig
from pybk.cluster import LocalCluster
from pybk.wal import embedded_bookie_config

MB = 1_000_000
REPLICAS = 3


def disk_bytes(path: Path) -> int:
    """Bytes allocated under ``path`` (what ``du`` counts: preallocated blocks included)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # (a segment compacted away while we walk)
                pass
    return total


def bookie_config(args: argparse.Namespace) -> BookieConfig:
    """The embedded WAL's bookies (as a user gets them), ``--gc-interval`` if given."""
    config: BookieConfig = embedded_bookie_config()
    if args.gc_interval is not None:
        config = dataclasses.replace(config, gc_interval=args.gc_interval)
    return config


# -- the WAL soak ---------------------------------------------------------------------------


async def wal_soak(root: Path, args: argparse.Namespace) -> list[tuple[float, int]]:
    seconds = args.minutes * 60
    retain = int(args.retain_mb * MB)
    record = os.urandom(args.record)
    samples: list[tuple[float, int]] = []
    positions: deque[tuple[int, Any]] = deque()  # (bytes appended before it, position)
    appended = 0
    async with pybk.AsyncWAL(root / "wal", roll_bytes=1 << 20,
                             cluster_options={"bookie_config": bookie_config(args)}) as wal:
        loop = asyncio.get_running_loop()
        start = loop.time()
        next_sample = next_truncate = start
        tick = 0.01
        per_tick = max(1, round(args.rate * tick))
        while (now := loop.time()) - start < seconds:
            pos = await wal.append_many([record] * per_tick)
            appended += per_tick * len(record)
            positions.append((appended, pos[-1]))
            if now >= next_truncate:
                next_truncate += 1.0
                cut = None
                while positions and appended - positions[0][0] > retain:
                    cut = positions.popleft()[1]
                if cut is not None:
                    await wal.truncate(cut)
            if now >= next_sample:
                next_sample += args.sample
                samples.append((now - start, disk_bytes(root)))
            await asyncio.sleep(max(0.0, start + (appended / len(record)) / args.rate
                                    - loop.time()))
        samples.append((loop.time() - start, disk_bytes(root)))
    return samples


# -- a log with time-based retention ---------------------------------------------------------


async def log_time_soak(root: Path, args: argparse.Namespace) -> list[tuple[float, int]]:
    """A log (E=Qw=3, 1 MiB segments) on a 3-bookie LocalCluster with the WAL's bookies,
    appended at the WAL soak's rate and kept by age: the seconds that hold ``--retain-mb``."""
    seconds = args.minutes * 60
    keep_s = args.retain_mb * MB / (args.rate * args.record)
    record = os.urandom(args.record)
    samples: list[tuple[float, int]] = []
    async with LocalCluster(root / "logtime", 3, bookie_config=bookie_config(args)) as c:
        log = await c.client().namespace().create_log(
            "soak", ensemble_size=3, write_quorum=3, ack_quorum=2, roll_bytes=1 << 20,
            retention_seconds=keep_s)
        async with await log.writer() as w:
            loop = asyncio.get_running_loop()
            start = next_sample = loop.time()
            per_tick = max(1, round(args.rate * 0.01))
            appended = 0
            while (now := loop.time()) - start < seconds:
                await asyncio.gather(*(w.append(record) for _ in range(per_tick)))
                appended += per_tick
                if now >= next_sample:
                    next_sample += args.sample
                    samples.append((now - start, disk_bytes(root / "logtime")))
                await asyncio.sleep(max(0.0, start + appended / args.rate - loop.time()))
        samples.append((loop.time() - start, disk_bytes(root / "logtime")))
    return samples


# -- the ledgers soak ------------------------------------------------------------------------


async def ledgers_soak(root: Path, args: argparse.Namespace
                       ) -> tuple[list[tuple[float, int]], float | None, int]:
    config = bookie_config(args)
    entry = os.urandom(16 << 10)
    per_ledger = max(1, int(args.ledger_mb * MB) // len(entry))
    async with LocalCluster(root / "cluster", 3, bookie_config=config) as c:
        client = c.client()
        ids = []
        for _ in range(args.ledgers):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await lh.append_many([entry] * per_ledger)
            await lh.close()
            ids.append(lh.id)
        keep = max(1, args.ledgers // 10)
        live_per_bookie = keep * per_ledger * len(entry)
        bound = 1.5 * live_per_bookie + 16 * MB
        writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        loop = asyncio.get_running_loop()
        start = loop.time()
        for lid in ids[keep:]:
            await client.delete_ledger(lid)
        samples: list[tuple[float, int]] = []
        within: float | None = None
        written = 0
        give_up = max(3 * args.gc_interval + 30, 60.0)
        while loop.time() - start < give_up:
            await writer.append_many([entry] * 4)  # writes go on meanwhile (64 KB / step)
            written += 4 * len(entry)
            now = loop.time() - start
            per_bookie = [disk_bytes(c.bookie_dir(b)) for b in c.bookie_ids]
            if not samples or now - samples[-1][0] >= args.sample:
                samples.append((now, sum(per_bookie)))
            # the live data grows by what the writer added
            if within is None and all(d <= bound + written * 1.5 for d in per_bookie):
                within = now
                break
            await asyncio.sleep(0.05)
        await writer.close()
        samples.append((loop.time() - start, sum(disk_bytes(c.bookie_dir(b))
                                                 for b in c.bookie_ids)))
    return samples, within, int(bound)


# -- a writer's p99 while compaction runs ------------------------------------------------------


async def p99_soak(root: Path, args: argparse.Namespace) -> tuple[list[float], list[float],
                                                                  int, float]:
    """A lone writer's append latencies idle, then while every bookie compacts (forced runs,
    paced at ``gc_compaction_rate``): segments half live (two ledgers written in turns, one
    deleted), so major compaction rewrites half of each."""
    config = dataclasses.replace(bookie_config(args), gc_interval=0, gc_min_ledger_age=0)
    chunk = [os.urandom(16 << 10)] * 8
    async with LocalCluster(root / "p99", 3, bookie_config=config) as c:
        client = c.client()
        keep = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        drop = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        for _ in range(max(1, int(args.p99_mb * MB) // (2 * 8 * (16 << 10)))):
            await keep.append_many(chunk)
            await drop.append_many(chunk)
        await keep.close()
        await drop.close()
        await client.delete_ledger(drop.id)
        writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        loop = asyncio.get_running_loop()
        record = os.urandom(args.record)

        async def lone(until: Any) -> list[float]:
            out = []
            while not until():
                t0 = loop.time()
                await writer.append(record)
                out.append(loop.time() - t0)
            return out

        idle_end = loop.time() + args.p99_seconds
        idle = await lone(lambda: loop.time() >= idle_end)
        runs = asyncio.gather(*(c.bookie(b).run_gc() for b in c.bookie_ids))
        busy = await lone(runs.done)
        results = await runs
        await writer.close()
    moved = sum(r.entries_moved for r in results)
    seconds = max(r.seconds for r in results)
    return idle, busy, moved, seconds


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


# -- report -----------------------------------------------------------------------------------


def table(samples: list[tuple[float, int]], bound: float, rows: int = 12) -> None:
    step = max(1, len(samples) // rows)
    shown = samples[::step]
    if shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    print(f"  {'t (s)':>8}  {'disk (MB)':>10}  {'bound (MB)':>10}")
    for t, used in shown:
        print(f"  {t:8.1f}  {used / MB:10.1f}  {bound / MB:10.1f}"
              f"{'' if used <= bound else '  over'}")


def plot(path: str, series: dict[str, tuple[list[tuple[float, int]], float]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(--plot needs matplotlib: pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, len(series), figsize=(6 * len(series), 4))
    for ax, (name, (samples, bound)) in zip(axes if len(series) > 1 else [axes],
                                            series.items(), strict=True):
        ax.plot([t for t, _ in samples], [u / MB for _, u in samples], label="disk use")
        ax.axhline(bound / MB, color="red", linestyle="--", label="bound")
        ax.set_title(name)
        ax.set_xlabel("seconds")
        ax.set_ylabel("MB")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot written to {path}")


def levels_off(samples: list[tuple[float, int]], args: argparse.Namespace,
               series: dict[str, tuple[list[tuple[float, int]], float]], name: str) -> bool:
    """Print the samples against the retained-bytes bound; met when the second half's
    largest sample is within it (disk use levelled off under the bound and stayed)."""
    bound = REPLICAS * (1.5 * args.retain_mb * MB + 16 * MB)
    table(samples, bound)
    peak = max(u for t, u in samples if t >= samples[-1][0] / 2)
    met = peak <= bound
    print(f"  second half's largest: {peak / MB:.1f} MB; bound {REPLICAS} x (1.5 x "
          f"{args.retain_mb:g} + 16) = {bound / MB:.1f} MB: {'met' if met else 'NOT MET'}")
    series[name] = (samples, bound)
    return met


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=0.75, help="the WAL soak's length")
    p.add_argument("--rate", type=float, default=1000.0, help="WAL records per second")
    p.add_argument("--record", type=int, default=1000, help="WAL record bytes")
    p.add_argument("--retain-mb", type=float, default=10.0)
    p.add_argument("--ledgers", type=int, default=100)
    p.add_argument("--ledger-mb", type=float, default=1.0)
    p.add_argument("--gc-interval", type=float, default=None,
                   help="seconds (default: the embedded WAL's bookies' own)")
    p.add_argument("--sample", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--p99-mb", type=float, default=40.0,
                   help="data per bookie (half of it deleted) for the p99 row")
    p.add_argument("--p99-seconds", type=float, default=3.0, help="the idle p99's window")
    p.add_argument("--only", choices=("wal", "logtime", "ledgers", "p99"), default=None)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    p.add_argument("--plot", default=None, help="draw disk use over time to this PNG")
    args = p.parse_args()
    if args.minutes <= 0 or args.rate <= 0 or args.record <= 0 or (
            args.gc_interval is not None and args.gc_interval <= 0):
        p.error("--minutes, --rate, --record and --gc-interval must be positive")
    if args.gc_interval is None:
        args.gc_interval = embedded_bookie_config().gc_interval
    root = Path(tempfile.mkdtemp(prefix="pybk-gc-soak-", dir=args.dir))
    print(f"pybk of {Path(pybk.__file__).resolve().parent.parent}; gc interval "
          f"{args.gc_interval:g} s")
    series: dict[str, tuple[list[tuple[float, int]], float]] = {}
    ok = True
    try:
        if args.only in (None, "wal"):
            began = time.perf_counter()
            samples = asyncio.run(wal_soak(root, args))
            written = args.rate * args.record * args.minutes * 60
            print(f"\nwal: {args.rate:g} x {args.record} B records/s for {args.minutes:g} min "
                  f"(~{written / MB:,.0f} MB appended), keeping the last {args.retain_mb:g} MB "
                  f"({time.perf_counter() - began:.0f} s)")
            ok &= levels_off(samples, args, series, f"WAL keeping its last {args.retain_mb:g} MB")
        if args.only in (None, "logtime"):
            keep_s = args.retain_mb * MB / (args.rate * args.record)
            samples = asyncio.run(log_time_soak(root, args))
            print(f"\nlogtime: a log appended at {args.rate:g} x {args.record} B records/s for "
                  f"{args.minutes:g} min, retention by time: {keep_s:g} s (~"
                  f"{args.retain_mb:g} MB)")
            ok &= levels_off(samples, args, series, f"log keeping {keep_s:g} s")
        if args.only in (None, "ledgers"):
            samples, within, bound_each = asyncio.run(ledgers_soak(root, args))
            keep = max(1, args.ledgers // 10)
            print(f"\nledgers: {args.ledgers} x {args.ledger_mb:g} MB on 3 bookies (E=Qw=3), "
                  f"{args.ledgers - keep} deleted, a writer appending meanwhile")
            table(samples, 3 * bound_each)
            met = within is not None and within <= args.gc_interval + 15
            ok &= met
            when = "never, within the run" if within is None else f"{within:.1f} s"
            print(f"  every bookie within 1.5 x live + 16 MB ({bound_each / MB:.1f} MB) "
                  f"after: {when}; the collection interval {args.gc_interval:g} s (+ the "
                  f"minimum age and a compaction): {'met' if met else 'NOT MET'}")
            series["ledgers: 90% deleted"] = (samples, 3 * bound_each)
        if args.only in (None, "p99"):
            idle, busy, moved, seconds = asyncio.run(p99_soak(root, args))
            ratio = p99(busy) / p99(idle) if idle and busy else float("nan")
            met = ratio <= 1.5
            ok &= met
            print(f"\np99: a lone writer ({args.record} B appends, E=Qw=3), idle and while the "
                  f"3 bookies compact ({moved:,} entries moved, {seconds:.1f} s, paced at "
                  f"{bookie_config(args).gc_compaction_rate / (1 << 20):g} MiB/s)")
            print(f"  {'':12}{'appends':>9}{'p50 (ms)':>10}{'p99 (ms)':>10}")
            for name, lat in (("idle", idle), ("compacting", busy)):
                print(f"  {name:12}{len(lat):9,}{sorted(lat)[len(lat) // 2] * 1e3:10.2f}"
                      f"{p99(lat) * 1e3:10.2f}")
            print(f"  p99 compacting / idle: {ratio:.2f}x; target <= 1.5x: "
                  f"{'met' if met else 'NOT MET'}")
        if args.plot:
            plot(args.plot, series)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nverdict: {'all met' if ok else 'NOT all met'}")
    sys.exit(0)


if __name__ == "__main__":
    main()
