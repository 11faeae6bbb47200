"""Both storage engines side by side at scale: the journal engine (LedgerStore: entries read
back from the journal, an in-memory index of every entry) and the db engine (DbLedgerStore:
write cache flushed into per-ledger-sorted entry logs, on-disk location index, bounded caches).

Each engine runs in a child process of its own (so its RSS is its own), on real files:

* writes: ``--entries`` entries of ``--size`` bytes over 100 ledgers written interleaved
  (batches of ``--batch`` per ledger in turn), then one more ledger of the same length alone;
* restart: close, then the time to open again (checkpoint load, journal replay);
* catch-up: after the restart, one interleaved ledger read from its start in batched reads,
  then the ledger written alone, each cold (the engine's caches empty, and the run's files
  evicted from the OS page cache with ``posix_fadvise(DONTNEED)``);
* writes per CPU second: the same writes over the process's CPU time (all its threads), a
  figure less moved than wall time by other work on a shared machine;
* RSS: the peak, and the growth per entry over the start, extrapolated linearly to 100 M
  entries (an extrapolation, printed as one).

    python benchmarks/storage_scale.py [--entries 1000000] [--size 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from pybk.storage import OsFileSystem
from pybk.storage.engines import make_engine
from pybk.storage.store import StoreConfig
from pybk.wire import DigestManager

LEDGERS = 100
KEY = b"k" * 32
IID = "3b0c1a44-3b3a-4c4e-9a57-000000000037"
TARGET_ENTRIES = 100_000_000


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def drop_page_cache(root: str) -> None:
    """Evict this run's files (only them) from the OS page cache: the catch-up reads are
    cold for the disk too."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


async def child(engine: str, entries: int, size: int, batch: int, root: str) -> dict[str, Any]:
    base_rss = rss_mb()
    cfg = StoreConfig(storage=engine, journal_overlap_syncs=True)
    fs = OsFileSystem()
    store = make_engine(fs, root, IID, cfg)
    await store.open()
    per = entries // LEDGERS
    payload = b"x" * max(0, size - 32)
    frames = {lid: DigestManager(lid) for lid in range(LEDGERS + 1)}
    inflight = [0]
    room = asyncio.Event()

    def done(outcome: object) -> None:
        assert outcome is None, outcome
        inflight[0] -= 1
        room.set()

    async def write(lid: int, first: int, n: int) -> None:
        ids = list(range(first, first + n))
        bodies = [frames[lid].frame(e, e - 1, 0, payload) for e in ids]
        while inflight[0] >= 64:
            room.clear()
            await room.wait()
        inflight[0] += 1
        store.add_batch(lid, ids, bodies, KEY, False, done)

    async def drain() -> None:
        while inflight[0]:
            room.clear()
            await room.wait()

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    half_rss = base_rss
    for first in range(0, per, batch):
        if first <= per // 2 < first + batch:
            half_rss = rss_mb()
        for lid in range(LEDGERS):
            await write(lid, first, min(batch, per - first))
    await drain()
    write_s = time.perf_counter() - t0
    write_cpu = time.process_time() - cpu0
    for first in range(0, per, batch):  # the ledger written alone
        await write(LEDGERS, first, min(batch, per - first))
    await drain()
    written_rss = rss_mb()
    await store.close()
    t0 = time.perf_counter()
    store = make_engine(fs, root, IID, cfg)
    await store.open()
    restart_s = time.perf_counter() - t0

    def catch_up(lid: int) -> float:
        t = time.perf_counter()
        got = 0
        for first in range(0, per, 100):
            out, errors = store.read_many(lid, list(range(first, min(per, first + 100))),
                                          4 << 20)
            assert not errors, errors
            got += len(out)
        assert got == per
        return per / (time.perf_counter() - t)

    drop_page_cache(root)
    interleaved = catch_up(7)
    drop_page_cache(root)
    alone = catch_up(LEDGERS)
    await store.close()
    fs.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"write_eps": entries / write_s, "write_cpu_eps": entries / write_cpu,
            "restart_s": restart_s, "peak_rss": peak,
            "base_rss": base_rss, "half_rss": half_rss, "written_rss": written_rss,
            "read_interleaved": interleaved, "read_alone": alone}


def run_child(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"pybk-scale-{engine}-") as root:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", engine, "--entries", str(args.entries),
             "--size", str(args.size), "--batch", str(args.batch), "--root", root],
            capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{engine} engine failed:\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--child", choices=("journal", "db"))
    p.add_argument("--root")
    args = p.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.child, args.entries, args.size, args.batch,
                                           args.root))))
        return
    res = {e: run_child(e, args) for e in ("journal", "db")}
    print(f"storage engines, {args.entries:,} entries of {args.size} B over {LEDGERS} "
          f"interleaved ledgers (+1 alone), batches of {args.batch}")
    print(f"{'':28}{'journal':>14}{'db':>14}{'db / journal':>14}")
    rows = [("writes (entries/s)", "write_eps", "{:,.0f}"),
            ("writes per CPU s (entries)", "write_cpu_eps", "{:,.0f}"),
            ("restart (s)", "restart_s", "{:.3f}"),
            ("peak RSS (MB)", "peak_rss", "{:.0f}"),
            ("catch-up interleaved (e/s)", "read_interleaved", "{:,.0f}"),
            ("catch-up alone (e/s)", "read_alone", "{:,.0f}")]
    for label, key, fmt in rows:
        j, d = res["journal"][key], res["db"][key]
        print(f"{label:28}{fmt.format(j):>14}{fmt.format(d):>14}{d / j:>13.2f}x")
    print("targets (db engine):")
    for e in ("journal", "db"):
        # the slope over the second half of the writes (the caches are full by then, when
        # they fill at all), carried on linearly from the end: an extrapolation
        r = res[e]
        growth = max(0.0, r["written_rss"] - r["half_rss"]) / (args.entries / 2)
        # (never below the peak: a flush's transient memory counts as much as the steady)
        r["rss_100m"] = max(r["peak_rss"],
                            r["written_rss"] + growth * (TARGET_ENTRIES - args.entries))
        print(f"  {e}: RSS {r['written_rss']:.0f} MB after {args.entries:,} entries, growing "
              f"{growth * 2**20:.1f} B/entry over the second half; peak {r['peak_rss']:.0f} MB; "
              f"extrapolated linearly to 100M entries (at least the peak): "
              f"{r['rss_100m']:,.0f} MB")
    db, jr = res["db"], res["journal"]
    print(f"  RSS < 512 MB at 100M (extrapolated): {db['rss_100m']:,.0f} MB: "
          f"{verdict(db['rss_100m'] < 512)}")
    print(f"  restart < 5 s: {db['restart_s']:.3f} s: {verdict(db['restart_s'] < 5)}")
    w = db["write_eps"] / jr["write_eps"]
    print(f"  writes >= 0.8x journal engine: {w:.2f}x: {verdict(w >= 0.8)}")
    c = db["read_interleaved"] / jr["read_interleaved"]
    print(f"  interleaved catch-up >= 10x journal engine: {c:.2f}x: {verdict(c >= 10)}")
    a = db["read_alone"] / db["read_interleaved"]
    print(f"  interleaved within 2x of alone: alone/interleaved {a:.2f}x: "
          f"{verdict(a <= 2)}")


if __name__ == "__main__":
    main()
