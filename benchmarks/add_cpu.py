"""CPU per replicated append: this process's CPU time over the appends completed.

Wall-clock rates on a shared machine drift with the other processes; the CPU one append costs
(client, in-process transport, bookies, storage: all in this process) moves much less, so it
is what compares two builds run one after the other. A ``LocalCluster`` of 3 bookies,
E3/Qw2/Qa2 (or ``--quorum``), ``--size`` byte entries kept ``--inflight`` deep by the
closed-loop driver for ``--duration`` seconds, after a warm-up; ``--fs mem`` puts the bookies
on ``MemFileSystem`` (no disk: the Python cost alone), ``--fs disk`` on real files in a temp
dir (the fdatasync thread's CPU is counted: it is this process's). The collector is tuned as
``targets.py`` tunes it. Prints, per round: entries/s, CPU us per entry (process time, and
the user / system split, the event loop thread's own and how busy it was), entries per journal sync.

    python benchmarks/add_cpu.py [--fs mem,disk] [--rounds 3] [--duration 2] [--inflight 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

from _common import closed_loop

from pybk import LocalCluster
from pybk.storage.memfs import MemFileSystem


async def one(fs_kind: str, args: argparse.Namespace) -> tuple[float, ...]:
    quorum = tuple(int(x) for x in args.quorum.split("/"))
    payload = os.urandom(args.size)
    with tempfile.TemporaryDirectory(prefix="pybk-addcpu-", dir=args.dir) as root:
        fs = MemFileSystem() if fs_kind == "mem" else None
        async with LocalCluster(root, 3, fs=fs, tune_gc=True) as cluster:
            client = cluster.client()
            lh = await client.create_ledger(*quorum)
            await closed_loop(lambda: lh.append(payload), args.inflight,
                              min(args.duration, 0.5))
            t0 = os.times()
            m0 = time.thread_time()
            run = await closed_loop(lambda: lh.append(payload), args.inflight, args.duration)
            t1 = os.times()
            main_thread = time.thread_time() - m0
            await lh.close()
    user = t1.user - t0.user
    system = t1.system - t0.system
    n = run.count
    return (run.rate, (user + system) / n * 1e6, user / n * 1e6, system / n * 1e6,
            main_thread / n * 1e6, main_thread / run.elapsed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fs", default="mem,disk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--inflight", type=int, default=1024)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--quorum", default="3/2/2")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    for r in range(args.rounds):
        for kind in args.fs.split(","):
            rate, cpu, user, system, main_cpu, busy = asyncio.run(one(kind, args))
            print(f"round {r} fs={kind:4s} {rate:10,.0f} entries/s  CPU {cpu:5.2f} us/entry "
                  f"(user {user:5.2f}, sys {system:5.2f}; loop thread {main_cpu:5.2f}, "
                  f"busy {busy:4.0%})  "
                  f"load {os.getloadavg()[0]:.2f}  "
                  f"{time.strftime('%H:%M:%S')}", flush=True)


if __name__ == "__main__":
    main()
