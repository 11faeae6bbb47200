"""Metadata store operations per backend (issue 43: "the metadata benchmarks unchanged
within noise"), this checkout beside another one in the same run.

    python benchmarks/metadata_ops.py [--ops 300] [--watches 30] [--rounds 3]
                                      [--backends memory,sqlite,zk] [--compare DIR]

Each backend runs, in a fresh process with the ``pybk`` package of the checkout measured:
``create`` (allocate an id, create the ledger's metadata), ``read``, ``write`` (a versioned
update, as a close does) and ``list`` (all ledgers) in ops/s; and ``watch`` (ms): one session
watches a ledger, another one changes it, the time until the first session's callback runs,
p50 over ``--watches`` changes. Two sessions of one store: a shared ``MemoryDirectory`` for
memory, one file for SQLite (whose watches are polled), one server for ZooKeeper (started
here on loopback, as the tests start it). ``--compare DIR`` runs the same in DIR's ``pybk``
(e.g. ``git worktree add /tmp/base <commit>``), rounds alternating, and prints the median of
the rounds' ratios, their range and a verdict: unchanged within 5%, within noise when at
least a quarter of the rounds found this build no slower.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator

from _common import median, paired_cost

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("create", "read", "write", "list", "watch")

_CHILD = textwrap.dedent("""
    import asyncio, json, os, sys, tempfile, time
    import pybk
    from pybk.metadata.base import LedgerMetadata
    from pybk.metadata.uri import MemoryDirectory, open_store

    backend, hosts, n, watches = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    assert pybk.__file__.startswith(os.environ["PYTHONPATH"]), pybk.__file__

    async def main():
        tmp = tempfile.mkdtemp(prefix="md-ops-")
        memory = MemoryDirectory()
        uri = {"memory": "memory://bench", "sqlite": f"sqlite://{tmp}/md.db",
               "zk": f"zk://{hosts}/bench-{os.getpid()}"}[backend]
        a, b = open_store(uri, memory=memory), open_store(uri, memory=memory)
        clock = time.perf_counter
        out = {}
        t0, mds = clock(), []
        for _ in range(n):
            lid = await a.allocate_ledger_id()
            mds.append(await a.create_ledger(LedgerMetadata(
                lid, 3, 2, 2, {0: ("b1:3181", "b2:3181", "b3:3181")})))
        out["create"] = n / (clock() - t0)
        t0 = clock()
        for md in mds:
            await a.read_ledger(md.ledger_id)
        out["read"] = n / (clock() - t0)
        t0 = clock()
        for md in mds:
            await a.write_ledger(md.with_changes(state="CLOSED", last_entry_id=9, length=90),
                                 md.version)
        out["write"] = n / (clock() - t0)
        t0 = clock()
        for _ in range(20):
            await a.list_ledgers()
        out["list"] = 20 / (clock() - t0)
        lat = []
        loop = asyncio.get_running_loop()
        for i in range(watches):
            lid = await b.allocate_ledger_id()
            md = await b.create_ledger(LedgerMetadata(lid, 3, 2, 2, {0: ("b1:3181",) * 3}))
            await a.read_ledger(lid)
            fired = loop.create_future()
            w = a.watch_ledger(lid, lambda _l: fired.done() or fired.set_result(clock()))
            await asyncio.sleep(0.05)  # (an established watch: the latency, not the set-up)
            t0 = clock()
            await b.write_ledger(md.with_changes(length=1), md.version)
            lat.append((await asyncio.wait_for(fired, 30.0)) - t0)
            w.cancel()
        lat.sort()
        out["watch"] = lat[len(lat) // 2] * 1e3
        await a.close()
        await b.close()
        print(json.dumps(out))

    asyncio.run(main())
""")


def run_child(path: str, backend: str, hosts: str, n: int, watches: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", _CHILD, backend, hosts, str(n), str(watches)],
                         env=dict(os.environ, PYTHONPATH=path), cwd=tempfile.gettempdir(),
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{backend} in {path} failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@contextlib.contextmanager
def zookeeper(wanted: bool) -> Iterator[str]:
    if not wanted:
        yield ""
        return
    from pybk.testing.zookeeper import ZooKeeperServer

    with ZooKeeperServer() as server:
        yield server.hosts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--watches", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", default="memory,sqlite,zk")
    p.add_argument("--compare", default=None, help="a checkout whose pybk to run beside")
    args = p.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    if unknown := set(backends) - {"memory", "sqlite", "zk"}:
        p.error(f"unknown backends {sorted(unknown)}")
    builds = {"this": CHECKOUT}
    if args.compare:
        builds["compare"] = os.path.abspath(args.compare)
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    with zookeeper("zk" in backends) as hosts:
        for i in range(args.rounds):
            order = list(builds) if i % 2 == 0 else list(builds)[::-1]
            for backend in backends:
                for build in order:
                    got.setdefault((backend, build), []).append(
                        run_child(builds[build], backend, hosts, args.ops, args.watches))
    print(f"metadata_ops: {args.ops} ledgers, {args.watches} watches, {args.rounds} rounds "
          f"(medians); this = {CHECKOUT}" + (f", compare = {builds['compare']}"
                                            if args.compare else ""))
    head = f"{'backend':<8} {'op':<7} {'unit':<6} {'this':>10}"
    print(head + (f" {'compare':>10} {'ratio':>7} {'rounds':>9}  verdict" if args.compare
                  else ""))
    for backend in backends:
        for op in OPS:
            unit = "ms p50" if op == "watch" else "ops/s"
            this = median([r[op] for r in got[(backend, "this")]])
            line = f"{backend:<8} {op:<7} {unit:<6} {this:>10,.2f}"
            if args.compare:
                other = median([r[op] for r in got[(backend, "compare")]])
                # above 1: this build is slower (a rate lower, a latency higher), paired
                # round by round (the two builds ran back to back)
                ratio, spread, say = paired_cost(
                    [(o[op] / t[op] if op != "watch" else t[op] / o[op])
                     for t, o in zip(got[(backend, "this")], got[(backend, "compare")],
                                     strict=True)], "slower")
                line += f" {other:>10,.2f} {ratio:>6.2f}x {spread:>9}  {say}"
            print(line)


if __name__ == "__main__":
    main()
