"""Pipelined appends over TCP to 3 bookie processes, beside an in-process cluster with the
same bookie settings.

    python benchmarks/tcp_append.py [--duration 1] [--window 256] [--sizes 100,1024]
                                    [--rounds 3] [--loop asyncio|uvloop|both] [--defaults]

E=3 Qw=2 Qa=2, ``--window`` appends in flight (closed loop, ``LedgerHandle.append``), 100 B and
1 KiB; entries/s and p50/p99 from the call to the acknowledgement. Like with like:

* tcp: three ``pybk bookie`` processes on loopback, reached through ``TcpTransport``. Their
  bookies run ``pybk.server.process.process_bookie_config()``: journal segments preallocated
  (64 MiB, written in place), overlapped syncs through a sync helper process per bookie, a
  batch with nothing to overlap synced inline, and the server's GC settings.
* in-process: a ``LocalCluster`` of 3 bookies given *the same* ``BookieConfig`` (one sync
  helper process per bookie too), this process's GC tuned the same way
  (``tune_gc_for_server``: it also serves the TCP client, so both clients get it).
* ``--defaults`` adds the in-process cluster as ``pybk.LocalCluster(root)`` sets it up (the
  settings that differ are printed), for reference: the target compares the first two.

What still differs, by construction: over TCP each request and reply crosses the codec and a
socket, and the bookies run in their own processes (on this 2-core machine they compete with
the client for the cores); in process the bookies share the client's loop. The modes
alternate for ``--rounds`` rounds (this VM drifts); medians. Target (issue 19): tcp >= 0.5x
in-process with the same settings. ``--loop both`` repeats everything on uvloop (the bookie
processes too) when it is installed.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
from pathlib import Path
from typing import Any

from _common import (
    config_diff,
    ledger_run,
    loops_to_run,
    median,
    run_on,
    server_settings,
    tcp_bookies,
)

from pybk.bookie import BookieConfig
from pybk.client import Client
from pybk.cluster import LocalCluster
from pybk.server.process import tune_gc_for_server

QUORUM = (3, 2, 2)
MODES = ("in-process", "tcp", "in-process defaults")


async def measure(root: Path, args: argparse.Namespace, loop: str
                  ) -> dict[str, dict[int, list[Any]]]:
    """Every cluster up at once; the modes alternate per round and size.
    {mode: {size: [Run per round]}}."""
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = MODES if args.defaults else MODES[:2]
    out: dict[str, dict[int, list[Any]]] = {m: {s: [] for s in sizes} for m in modes}
    async with tcp_bookies(root / "tcp", 3, loop=loop) as metadata, \
            LocalCluster(root / "local", 3, bookie_config=server_settings()) as same, \
            LocalCluster(root / "defaults", 3 if args.defaults else 0) as defaults, \
            Client(metadata) as tcp_client:
        gc.unfreeze()
        gc.collect()
        tune_gc_for_server()
        clients = {"in-process": same.client(), "tcp": tcp_client,
                   "in-process defaults": defaults.client()}
        for _ in range(args.rounds):
            for size in sizes:
                for mode in modes:
                    out[mode][size].append(await ledger_run(
                        clients[mode], QUORUM, size, args.window, args.duration))
    gc.unfreeze()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--window", type=int, default=256, help="appends in flight")
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; medians")
    ap.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="asyncio")
    ap.add_argument("--defaults", action="store_true",
                    help="also an in-process cluster with LocalCluster's default settings")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"pipelined appends, E=3 Qw=2 Qa=2, window {args.window}, {args.duration:g} s per "
          f"measurement, median of {args.rounds} alternating rounds")
    print("bookie settings, tcp and in-process alike: pybk.server.process."
          "process_bookie_config() (preallocated 64 MiB segments written in place, "
          "overlapped syncs through a sync helper process per bookie, inline syncs when "
          "nothing overlaps) and tune_gc_for_server(); differs by construction: sockets + "
          "codec, bookies in their own processes")
    if args.defaults:
        diff = config_diff(BookieConfig(), server_settings())
        print("in-process defaults differ from those in: " + "; ".join(diff))
    for loop in loops_to_run(args.loop):
        with tempfile.TemporaryDirectory(prefix="pybk-bench-") as tmp:
            results = run_on(loop, measure(Path(tmp), args, loop))
        print(f"\nevent loop: {loop} (client and bookie processes)")
        print(f"{'size':>6} {'mode':>19} {'entries/s':>10} {'p50 ms':>8} {'p99 ms':>8}  "
              "all rates")
        for size in sizes:
            rate: dict[str, float] = {}
            for mode, by_size in results.items():
                runs = by_size[size]
                rate[mode] = median([r.rate for r in runs])
                mid = sorted(runs, key=lambda r: r.rate)[len(runs) // 2].summary()
                rates = " ".join(f"{r.rate:.0f}" for r in runs)
                print(f"{size:>6} {mode:>19} {rate[mode]:>10.0f} {mid.p50 * 1e3:>8.2f} "
                      f"{mid.p99 * 1e3:>8.2f}  [{rates}]")
            ratio = rate["tcp"] / rate["in-process"]
            verdict = "meets" if ratio >= 0.5 else "BELOW"
            print(f"{size:>6} {'tcp / in-process':>19} {ratio:>10.2f}   ({verdict} the 0.5 "
                  "target; same bookie settings)")
            if "in-process defaults" in rate:
                print(f"{size:>6} {'tcp / defaults':>19} "
                      f"{rate['tcp'] / rate['in-process defaults']:>10.2f}")


if __name__ == "__main__":
    main()
