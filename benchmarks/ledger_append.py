"""Replicated ledger appends on the real disk, next to one bookie alone and SQLite.

For each quorum (E=3 Qw=2 Qa=2, and E=Qw=Qa=1), entry size (100 B, 1 KiB) and number of
appends in flight (1, 64, 1024): a LocalCluster of 3 in-process bookies (real files, fsync)
takes pipelined ``LedgerHandle.append`` calls for ``--duration`` seconds; we report
entries/s and the p50/p99 latency from append to acknowledgement. In the same run:

* one bookie driven directly (``Bookie.add_entry``, the callback path the transports call,
  entries framed as the client frames them) with the same number in flight: the ceiling the
  client's replication overhead is measured against (``benchmarks/targets.py`` drives the very
  bookie a ledger of the cluster uses);
* SQLite (stdlib ``sqlite3``), WAL mode, ``synchronous=FULL``, one transaction per group of
  ``in flight`` rows: what a user would otherwise pick.

    python benchmarks/ledger_append.py [--duration 2] [--dir /tmp] [--inflight 1,64,1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile

from _common import bookie_appender, closed_loop, pct, run_sqlite

from pybk import LocalCluster
from pybk.bookie import Bookie, BookieConfig
from pybk.storage import OsFileSystem


async def run_ledger(
    cluster: LocalCluster, quorum: tuple[int, int, int], size: int, inflight: int,
    duration: float,
) -> tuple[float, list[float]]:
    lh = await cluster.client().create_ledger(*quorum)
    payload = os.urandom(size)
    run = await closed_loop(lambda: lh.append(payload), inflight, duration)
    await lh.close()
    return run.rate, run.latencies


async def run_bookie(root: str, size: int, inflight: int, duration: float
                     ) -> tuple[float, list[float]]:
    bookie = Bookie("solo", os.path.join(root, f"solo-{size}-{inflight}"), fs=OsFileSystem(),
                    config=BookieConfig(disk_check_interval=0, checkpoint_interval=0),
                    rng=random.Random(1))
    await bookie.start()
    append = bookie_appender(bookie, 1, size)
    try:
        run = await closed_loop(append, inflight, duration)
        return run.rate, run.latencies
    finally:
        await bookie.stop()


async def main_async(args: argparse.Namespace) -> None:
    inflights = [int(x) for x in args.inflight.split(",")]
    sizes = [100, 1024]
    quorums = [(3, 2, 2), (1, 1, 1)]
    root = tempfile.mkdtemp(prefix="pybk-bench-", dir=args.dir)
    print(f"ledger appends, {args.duration:.1f} s per config, data under {root}")
    header = (f"{'quorum':>8} {'size':>5} {'inflight':>8} {'entries/s':>10} {'p50 ms':>8} "
              f"{'p99 ms':>8} | {'1 bookie/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'ratio':>6} | "
              f"{'sqlite/s':>9} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    try:
        solo: dict[tuple[int, int], tuple[float, list[float]]] = {}
        lite: dict[tuple[int, int], float] = {}
        async with LocalCluster(os.path.join(root, "cluster"), bookies=3) as cluster:
            for quorum in quorums:
                for size in sizes:
                    for n in inflights:
                        rate, lat = await run_ledger(cluster, quorum, size, n, args.duration)
                        if (size, n) not in solo:
                            solo[(size, n)] = await run_bookie(root, size, n, args.duration)
                            lite[(size, n)] = run_sqlite(root, size, n, args.duration)
                        (s, slat), q = solo[(size, n)], lite[(size, n)]
                        name = "/".join(map(str, quorum))
                        ms = [pct(x, p) * 1e3 for x, p in ((lat, .5), (lat, .99),
                                                             (slat, .5), (slat, .99))]
                        print(f"{name:>8} {size:>5} {n:>8} {rate:>10.0f} {ms[0]:>8.2f} "
                              f"{ms[1]:>8.2f} | {s:>10.0f} {ms[2]:>7.2f} {ms[3]:>7.2f} "
                              f"{rate / s:>6.2f} | {q:>9.0f} {rate / q:>6.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)  # about 1 GB of journals per run
    print("\nratio = ledger entries/s divided by the peer's entries/s on the same disk, same run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--inflight", default="1,64,1024")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
