"""Where a replicated append's CPU goes, layer by layer: the same workload with the layers
below a point cut off.

The ceiling target (issue 19: E3/Qw2/Qa2 in process at >= 0.6x the single-file group-commit
ceiling) is decided by CPU per entry on the event loop's thread. ``add_cpu.py`` gives the
total; this script splits it by running the same closed loop (E3/Qw2/Qa2, 100 B, 1024 in
flight, ``MemFileSystem``) with everything below one layer replaced by an immediate answer,
each variant in a process of its own (the replacements patch classes), the variants
alternating round by round:

* ``driver``: the closed-loop driver alone, each append a future resolved at the next loop
  pass (what every row of ``targets.py`` pays, the ceiling's included);
* ``client``: the ledger client and the in-process transport; each bookie request answered
  at the next loop pass without a bookie;
* ``bookies``: the bookies admit each batch (checks, records framed with their CRCs, the
  journal's buffer) and, when the journal completes it, put it in the index and answer; the
  journal writes nothing and syncs nothing;
* ``journal``: everything, on ``MemFileSystem`` (the journal's batch framing, writes and
  syncs into memory);
* ``disk`` (``--disk``): everything on real files in a temp dir (``LocalCluster``'s defaults:
  the syncs in helper processes, whose CPU is not this thread's).

The differences between neighbours are the layers' own costs. Wall-clock noise on a shared
machine moves every variant alike within a round; the medians over ``--rounds`` are printed.

    python benchmarks/add_layers.py [--rounds 5] [--count 200000] [--disk] [--loop both]
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
from itertools import accumulate
from typing import Any

VARIANTS = ("driver", "client", "bookies", "journal")


def _cut_below_client() -> None:
    """Each bookie request is answered (stored) at the next loop pass, by no bookie."""
    from pybk.transport.local import LocalTransport

    def add(self: Any, bookie_id: str, request: Any, on_done: Any,
            timeout: float | None = None) -> None:
        asyncio.get_running_loop().call_soon(on_done, None)

    assert hasattr(LocalTransport, "add")
    LocalTransport.add = add  # type: ignore[method-assign]


def _cut_below_bookies() -> None:
    """The journal completes each batch at once, as if written and synced: records are
    still made by the store, positions and offsets computed as the journal does."""
    from pybk.storage.index import Position
    from pybk.storage.journal import Journal
    from pybk.storage.journalbatch import JournalBatch
    from pybk.storage.records import BATCH_HEADER_SIZE

    assert hasattr(Journal, "_write_batch") and hasattr(Journal, "_take")

    async def write_batch(self: Any) -> None:
        data, tags, futs, entries = self._take(0)
        offsets = list(accumulate(map(len, data), initial=BATCH_HEADER_SIZE))
        batch = JournalBatch(tags, offsets, futs, offsets[-1], entries)
        batch.position = Position(self._seq, offsets[-1], self._batch_seq)
        self._batch_seq += 1
        self._complete(batch)

    Journal._write_batch = write_batch  # type: ignore[method-assign]


async def _driver_only(count: int) -> tuple[float, float]:
    from _common import closed_loop

    loop = asyncio.get_running_loop()
    pending: list[asyncio.Future[None]] = []
    scheduled = False

    def flush() -> None:
        nonlocal pending, scheduled
        due, pending = pending, []
        scheduled = False
        for fut in due:
            fut.set_result(None)

    def append() -> asyncio.Future[None]:
        nonlocal scheduled
        fut = loop.create_future()
        pending.append(fut)
        if not scheduled:
            scheduled = True
            loop.call_soon(flush)
        return fut

    await closed_loop(append, 1024, count=min(count, 20_000))
    t0, w0 = time.thread_time(), time.perf_counter()
    await closed_loop(append, 1024, count=count)
    return time.thread_time() - t0, time.perf_counter() - w0


async def _ledger(count: int, disk: bool) -> tuple[float, float]:
    from _common import closed_loop

    from pybk import LocalCluster
    from pybk.storage.memfs import MemFileSystem

    payload = os.urandom(100)
    with tempfile.TemporaryDirectory(prefix="pybk-layers-") as root:
        async with LocalCluster(root, 3, fs=None if disk else MemFileSystem(),
                                tune_gc=True) as cluster:
            lh = await cluster.client().create_ledger(3, 2, 2)
            await closed_loop(lambda: lh.append(payload), 1024, count=min(count, 20_000))
            t0, w0 = time.thread_time(), time.perf_counter()
            await closed_loop(lambda: lh.append(payload), 1024, count=count)
            return time.thread_time() - t0, time.perf_counter() - w0


def _child(variant: str, count: int, loop: str) -> None:
    from _common import run_on

    if variant == "client":
        _cut_below_client()
    elif variant == "bookies":
        _cut_below_bookies()
    if variant == "driver":
        cpu, wall = run_on(loop, _driver_only(count))
    else:
        cpu, wall = run_on(loop, _ledger(count, variant == "disk"))
    print(f"{cpu / count * 1e6:.4f} {count / wall:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=200_000, help="appends per measurement")
    ap.add_argument("--disk", action="store_true", help="also the whole path on real files")
    ap.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop", "both"])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.count, args.loop)
        return
    from _common import loops_to_run

    for loop in loops_to_run(args.loop):
        _measure(args, loop)


def _measure(args: argparse.Namespace, loop: str) -> None:
    variants = VARIANTS + (("disk",) if args.disk else ())
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    rate: dict[str, list[float]] = {v: [] for v in variants}
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"{loop}: E3/Qw2/Qa2, 100 B, 1024 in flight, {args.count:,} appends per "
          f"measurement, {args.rounds} round(s); CPU of the event loop's thread per append (us)")
    for r in range(args.rounds):
        row = []
        for v in variants:
            out = subprocess.run(
                [sys.executable, os.path.join(here, "add_layers.py"), "--child", v,
                 "--count", str(args.count), "--loop", loop],
                check=True, capture_output=True, text=True).stdout.split()
            cpu[v].append(float(out[0]))
            rate[v].append(float(out[1]))
            row.append(f"{v} {float(out[0]):5.2f}")
        print(f"round {r}: " + ", ".join(row) + f"  (load {os.getloadavg()[0]:.2f})",
              flush=True)
    med = {v: statistics.median(cpu[v]) for v in variants}
    total = med["journal"]
    print(f"\n{'variant':10s} {'us/append':>10s} {'appends/s':>10s}   layer (the difference "
          f"to the variant above)")
    below = 0.0
    names = {"driver": "the closed-loop driver (shared with every peer)",
             "client": "ledger client + in-process transport",
             "bookies": "bookies: admission, records + CRCs, index, answers",
             "journal": "journal: batch framing, writes and syncs (memory)",
             "disk": "real files instead of memory (syscalls; syncs in helpers)"}
    for v in variants:
        own = med[v] - below
        share = f"{own / total:6.1%} of the in-memory whole" if v != "disk" else ""
        print(f"{v:10s} {med[v]:10.2f} {statistics.median(rate[v]):10,.0f}   "
              f"{names[v]}: {own:+.2f} us {share}")
        below = med[v]
    print()


if __name__ == "__main__":
    main()
