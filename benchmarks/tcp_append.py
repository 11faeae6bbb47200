"""Pipelined appends over TCP to 3 bookie processes, beside the in-process LocalCluster figure.

    python benchmarks/tcp_append.py [--entries 20000] [--window 256] [--sizes 100,1024]

E=3 Qw=2 Qa=2. For each payload size: entries/s and p50/p99 append latency (call to ack) for
(a) LocalCluster (bookies in this process, no sockets) and (b) three ``pybk bookie`` processes
on loopback reached through ``TcpTransport``; then the ratio TCP / in-process (target >= 0.5).
Both use real files and fsync (group commit) under a temporary directory; the two modes
alternate for --rounds rounds and the median run of each is shown (this VM drifts).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pybk.cli import spawn_bookie, wait_ready
from pybk.client import Client
from pybk.cluster import LocalCluster


async def _pipelined(lh: Any, payload: bytes, n: int, window: int) -> tuple[float, list[float]]:
    """Append ``n`` entries keeping ``window`` in flight; (seconds, latencies)."""
    latencies: list[float] = []
    slots = asyncio.Semaphore(window)
    failures: list[BaseException] = []

    def done(start: float, fut: asyncio.Future[int]) -> None:
        latencies.append(time.perf_counter() - start)
        slots.release()
        if fut.exception() is not None:
            failures.append(fut.exception())  # type: ignore[arg-type]

    t0 = time.perf_counter()
    for _ in range(n):
        await slots.acquire()
        start = time.perf_counter()
        lh.append(payload).add_done_callback(lambda f, s=start: done(s, f))
    for _ in range(window):
        await slots.acquire()
    elapsed = time.perf_counter() - t0
    if failures:
        raise failures[0]
    return elapsed, latencies


async def _measure(client: Client, size: int, n: int, window: int) -> dict[str, float]:
    lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    payload = os.urandom(size)
    await _pipelined(lh, payload, min(2000, n), window)  # warm-up: connections, caches
    elapsed, lat = await _pipelined(lh, payload, n, window)
    await lh.close()
    q = statistics.quantiles(lat, n=100)
    return {"rate": n / elapsed, "p50": q[49] * 1e3, "p99": q[98] * 1e3}


async def _both(root: Path, sizes: list[int], n: int, window: int, rounds: int) -> Any:
    """Both clusters up at once; measurements alternate local/tcp so drift hits both alike.
    Returns {mode: {size: [result per round]}}."""
    results: dict[str, dict[int, list[dict[str, float]]]] = {
        "in-process": {s: [] for s in sizes},
        "tcp": {s: [] for s in sizes},
    }
    metadata = f"sqlite://{root / 'tcp' / 'metadata.db'}"
    ids = ("bookie-1", "bookie-2", "bookie-3")
    procs = {b: spawn_bookie(root / "tcp", b, metadata) for b in ids}
    try:
        for b, p in procs.items():
            await asyncio.to_thread(wait_ready, root / "tcp", b, p, 60.0)
        async with LocalCluster(root / "local", 3) as cluster, Client(metadata) as tcp_client:
            clients = {"in-process": cluster.client(), "tcp": tcp_client}
            for _ in range(rounds):
                for size in sizes:
                    for mode, client in clients.items():
                        results[mode][size].append(await _measure(client, size, n, window))
        return results
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except Exception:
                p.kill()


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median rate (its latencies come with it)."""
    return sorted(runs, key=lambda r: r["rate"])[len(runs) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; median shown")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="pybk-bench-") as tmp:
        results = asyncio.run(_both(Path(tmp), sizes, args.entries, args.window, args.rounds))
    print(
        f"pipelined appends, E=3 Qw=2 Qa=2, {args.entries} entries, window {args.window}, "
        f"median of {args.rounds} alternating rounds"
    )
    print(f"{'size':>6} {'mode':>11} {'entries/s':>10} {'p50 ms':>8} {'p99 ms':>8}  all rates")
    for size in sizes:
        med = {}
        for mode in ("in-process", "tcp"):
            runs = results[mode][size]
            r = med[mode] = _median_run(runs)
            rates = " ".join(f"{x['rate']:.0f}" for x in runs)
            print(
                f"{size:>6} {mode:>11} {r['rate']:>10.0f} {r['p50']:>8.2f} {r['p99']:>8.2f}"
                f"  [{rates}]"
            )
        ratio = med["tcp"]["rate"] / med["in-process"]["rate"]
        verdict = "meets" if ratio >= 0.5 else "BELOW"
        print(f"{size:>6} {'tcp/local':>11} {ratio:>10.2f}   ({verdict} the 0.5 target)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
