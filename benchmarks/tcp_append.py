"""Pipelined appends over TCP to 3 bookie processes, beside the in-process LocalCluster figure.

    python benchmarks/tcp_append.py [--entries 20000] [--window 256] [--sizes 100,1024]

E=3 Qw=2 Qa=2. For each payload size: entries/s and p50/p99 append latency (call to ack) for
(a) LocalCluster (bookies in this process, no sockets) and (b) three ``pybk bookie`` processes
on loopback reached through ``TcpTransport``; then the ratio TCP / in-process (target >= 0.5).
Both runs use real files and fsync (group commit) under a temporary directory.
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


async def _in_process(root: Path, sizes: list[int], n: int, window: int) -> dict[int, Any]:
    out = {}
    async with LocalCluster(root, 3) as cluster:
        client = cluster.client()
        for size in sizes:
            out[size] = await _measure(client, size, n, window)
    return out


async def _over_tcp(root: Path, sizes: list[int], n: int, window: int) -> dict[int, Any]:
    metadata = f"sqlite://{root / 'metadata.db'}"
    procs = {b: spawn_bookie(root, b, metadata) for b in ("bookie-1", "bookie-2", "bookie-3")}
    try:
        for b, p in procs.items():
            await asyncio.to_thread(wait_ready, root, b, p, 60.0)
        out = {}
        async with Client(metadata) as client:
            for size in sizes:
                out[size] = await _measure(client, size, n, window)
        return out
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(30)
            except Exception:
                p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--sizes", default="100,1024")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="pybk-bench-") as tmp:
        local = asyncio.run(_in_process(Path(tmp) / "local", sizes, args.entries, args.window))
        tcp = asyncio.run(_over_tcp(Path(tmp) / "tcp", sizes, args.entries, args.window))
    print(f"pipelined appends, E=3 Qw=2 Qa=2, {args.entries} entries, window {args.window}")
    print(f"{'size':>6} {'mode':>11} {'entries/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for size in sizes:
        for mode, res in (("in-process", local[size]), ("tcp", tcp[size])):
            r = res
            print(f"{size:>6} {mode:>11} {r['rate']:>10.0f} {r['p50']:>8.2f} {r['p99']:>8.2f}")
        ratio = tcp[size]["rate"] / local[size]["rate"]
        verdict = "meets" if ratio >= 0.5 else "BELOW"
        print(f"{size:>6} {'tcp/local':>11} {ratio:>10.2f}   ({verdict} the 0.5 target)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
