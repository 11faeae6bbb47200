"""Deferred sync: what a lone writer gains by forcing every N entries instead of waiting for
every add's fsync.

Three in-process bookies on real files (E3/Qw2/Qa2, each bookie its own journal fsync). Each
writer appends ``--size``-byte entries one at a time, each awaited before the next, for
``--entries`` entries:

- synced: an ordinary ledger (each add answered after its bookies' fsync), the peer;
- deferred/N: ``create_ledger(write_flags={"deferred_sync"})``, ``force()`` after every N
  appends (and at the end), so at most N entries are ever not durable.

Rounds alternate the writers on the same disk; the table gives the medians over the rounds of
each writer's durable entries/s (counted up to its last force) and the p50 of one append, with
the ratio to the synced writer. Target: forcing every 10 entries at least doubles a lone
writer's durable rate (it waits for one fsync per 10 entries instead of one per entry).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _common import median, pct

import pybk
from pybk.bench import replica_sync_floor


async def run(root: Path, every: int, entries: int, size: int) -> tuple[float, float]:
    """(durable entries/s, p50 append seconds) of one writer; ``every`` 0: synced."""
    payload = b"x" * size
    async with pybk.LocalCluster(root, bookies=3) as cluster:
        client = cluster.client()
        flags = {"deferred_sync"} if every else None
        lh = await client.create_ledger(3, 2, 2, write_flags=flags)
        for _ in range(20):  # warm-up
            await lh.append(payload)
        if isinstance(lh, pybk.DeferredSyncLedgerHandle):
            await lh.force()
        clock = time.perf_counter
        lat = []
        start = clock()
        for i in range(1, entries + 1):
            t0 = clock()
            await lh.append(payload)
            lat.append(clock() - t0)
            if every and i % every == 0 and isinstance(lh, pybk.DeferredSyncLedgerHandle):
                await lh.force()
        if isinstance(lh, pybk.DeferredSyncLedgerHandle):
            await lh.force()
        elapsed = clock() - start
        await lh.close()
    return entries / elapsed, pct(lat, 0.5)


async def main_async(args: argparse.Namespace) -> None:
    everies = [int(x) for x in args.every.split(",")]
    writers = [0, *everies]
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pybk-deferred-"))
    rates: dict[int, list[float]] = {w: [] for w in writers}
    p50s: dict[int, list[float]] = {w: [] for w in writers}
    try:
        for r in range(args.rounds):
            for w in writers:
                root = base / f"r{r}-w{w}"
                rate, p50 = await run(root, w, args.entries, args.size)
                rates[w].append(rate)
                p50s[w].append(p50)
                shutil.rmtree(root, ignore_errors=True)
        _serial, floor = replica_sync_floor([str(base / f"floor{i}.log") for i in range(2)],
                                            args.size, duration=0.2, preallocate=False)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    synced = median(rates[0])
    print(f"deferred sync, lone writer, E3/Qw2/Qa2, {args.size} B entries, {args.entries} "
          f"per round, {args.rounds} rounds (medians)")
    print(f"  {'writer':<14}{'durable/s':>12}{'append p50':>14}{'vs synced':>11}")
    for w in writers:
        name = "synced" if w == 0 else f"deferred/{w}"
        rate = median(rates[w])
        print(f"  {name:<14}{rate:>12,.0f}{median(p50s[w]) * 1e3:>11.3f} ms"
              f"{rate / synced:>10.2f}x")
    print(f"  sync floor (Qa = 2 journals' write + fdatasync at once, same disk): p50 "
          f"{statistics.median(floor) * 1e3:.3f} ms")
    if 10 in rates:
        ratio = median(rates[10]) / synced
        verdict = "met" if ratio >= 2.0 else "NOT MET"
        print(f"target: deferred/10 durable rate >= 2x synced: {ratio:.2f}x -> {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--every", default="1,10,100", help="force every N entries")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=None, help="where the bookies write (default: a tmp dir)")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
