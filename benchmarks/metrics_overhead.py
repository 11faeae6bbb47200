"""What recording metrics costs on the hot paths, measured side by side in one run.

Two paths, each run alternately without and with a stats object (rounds interleaved, so a
noisy neighbour hits both alike), printing entries/s, latency percentiles, the CPU time this
process spent per entry (the figure that survives a shared machine: entries/s there mostly
measures the neighbours) and the ratios:

* **bookie**: N callback writers add framed entries through ``Bookie.add_nowait`` (the path
  the TCP server feeds) into one bookie on the real disk (journal as in ``pybk bookie``:
  overlapped syncs through the sync process, inline syncs, preallocated segments). With
  stats, each add is timed (two loop-clock reads, one bisect) and each journal batch
  recorded once.
* **client**: one writer appends pipelined (a window of in-flight appends) to a ledger of an
  in-process cluster of 3 bookies on ``MemFileSystem`` (no disk: the client's and bookies'
  CPU is what is measured), without and with ``Client(metrics=registry)`` and
  ``LocalCluster(metrics=registry)``.

    python benchmarks/metrics_overhead.py [--duration 2] [--rounds 3] [--writers 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import tempfile
import time

from prometheus_client import CollectorRegistry

from pybk.bookie import Bookie, BookieConfig
from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.stats import BookieStats
from pybk.storage import OsFileSystem
from pybk.storage.memfs import MemFileSystem
from pybk.storage.store import INLINE_SYNC_ALWAYS
from pybk.wire import AddRequest, DigestManager, Response, master_key

KEY = master_key(b"bench")


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


Round = tuple[float, list[float], float]  # entries/s, latencies, CPU seconds per entry


async def bookie_round(root: str, writers: int, duration: float, stats: bool,
                       run: int) -> Round:
    fs = OsFileSystem(sync_process=True)
    bookie = Bookie("bench", os.path.join(root, f"b{run}-{stats}"), fs=fs,
                    config=BookieConfig(disk_check_interval=0, checkpoint_interval=0,
                                        journal_inline_sync_max=INLINE_SYNC_ALWAYS,
                                        journal_overlap_syncs=True, journal_preallocate=True),
                    rng=random.Random(1), stats=BookieStats() if stats else None)
    await bookie.start()
    payload = os.urandom(100)
    clock = time.perf_counter
    lat: list[float] = []
    count = 0
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    running = writers
    stop_at = clock() + duration

    class Writer:
        def __init__(self, lid: int) -> None:
            self.lid, self.dm, self.eid, self.t0 = lid, DigestManager(lid), 0, 0.0

        def send(self) -> None:
            body = self.dm.frame(self.eid, self.eid - 1, 0, payload)
            self.t0 = clock()
            bookie.add_nowait(AddRequest(self.lid, self.eid, KEY, body), self.done)

        def done(self, response: Response) -> None:
            nonlocal count, running
            now = clock()
            lat.append(now - self.t0)
            count += 1
            self.eid += 1
            if now < stop_at:
                self.send()
                return
            running -= 1
            if not running and not finished.done():
                finished.set_result(None)

    started, cpu = clock(), time.process_time()
    for w in range(writers):
        Writer(w + 1).send()
    await finished
    rate = count / (clock() - started)
    cpu_per_entry = (time.process_time() - cpu) / count
    await bookie.stop()
    return rate, lat, cpu_per_entry


async def client_round(duration: float, window: int, stats: bool) -> Round:
    registry = CollectorRegistry() if stats else None
    config = ClientConfig(explicit_lac_interval=0)
    async with LocalCluster("/c", 3, metadata="memory://", fs=MemFileSystem(),
                            rng=random.Random(1), metrics=registry,
                            client_config=config) as cluster:
        client = Client(cluster.store, transport=cluster.transport, config=config,
                        metrics=registry)
        lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        clock = time.perf_counter
        lat: list[float] = []
        inflight: set[asyncio.Future[int]] = set()
        count = 0
        stop_at = clock() + duration
        started, cpu = clock(), time.process_time()
        payload = b"x" * 100
        while clock() < stop_at:
            while len(inflight) < window:
                t0 = clock()
                fut = lh.append(payload)
                fut.add_done_callback(lambda _f, t0=t0: lat.append(clock() - t0))
                inflight.add(fut)
            done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            count += len(done)
        await asyncio.gather(*inflight)
        count += len(inflight)
        rate = count / (clock() - started)
        cpu_per_entry = (time.process_time() - cpu) / count
        await lh.close()
        return rate, lat, cpu_per_entry


def report(name: str, plain: list[Round], metered: list[Round]) -> None:
    def line(label: str, rounds: list[Round]) -> tuple[float, float]:
        rate = sorted(r for r, _, _ in rounds)[len(rounds) // 2]
        cpu = sorted(c for _, _, c in rounds)[len(rounds) // 2]
        lat = [x for _, xs, _ in rounds for x in xs]
        print(f"  {label:<14} {rate:>10,.0f} entries/s   p50 {pct(lat, 0.5) * 1e3:7.3f} ms   "
              f"p99 {pct(lat, 0.99) * 1e3:7.3f} ms   CPU {cpu * 1e6:6.1f} us/entry")
        return rate, cpu

    print(name)
    a_rate, a_cpu = line("no metrics", plain)
    b_rate, b_cpu = line("with metrics", metered)
    print(f"  ratio with/without: entries/s {b_rate / a_rate:.3f}, "
          f"CPU per entry {b_cpu / a_cpu:.3f}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--writers", type=int, default=64)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="pybk-metrics-", dir=args.dir)
    try:
        plain, metered = [], []
        for run in range(args.rounds):
            plain.append(await bookie_round(root, args.writers, args.duration, False, run))
            metered.append(await bookie_round(root, args.writers, args.duration, True, run))
        report(f"bookie add_nowait, {args.writers} writers, 100 B, real disk", plain, metered)
        plain, metered = [], []
        for _ in range(args.rounds):
            plain.append(await client_round(args.duration, args.window, False))
            metered.append(await client_round(args.duration, args.window, True))
        report(f"client append, window {args.window}, 100 B, 3 in-process bookies (MemFS)",
               plain, metered)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
