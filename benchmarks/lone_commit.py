"""A lone commit: one record at a time, each awaited before the next, from plain code.

The first number a new user of a write-ahead log measures. Each system writes ``--size``-byte
records one at a time after a warm-up, in alternating rounds (every system once per round, on
the same disk), and the table gives the medians over the rounds of each round's p50, p99 and
records/s:

- raw: ``os.write`` of the record to an appended file + ``os.fdatasync``; the disk's floor for
  one durable copy.
- sqlite: SQLite (stdlib), WAL mode, ``synchronous=FULL``, one ``INSERT`` per commit.
- wal 1 replica: ``pybk.WAL(path, bookies=1, ensemble_size=1, write_quorum=1, ack_quorum=1)``,
  the synchronous facade from this thread.
- wal default: ``pybk.WAL(path)`` (3 in-process bookies, E3/Qw3/Qa2), the synchronous facade.
- async default: ``pybk.AsyncWAL(path)`` awaited on its own loop in this thread.

Then the targets (issue 41), each with its ratio and verdict: the one-replica WAL's p50 within
1.3x SQLite's and its p99 within 1.5x; the default WAL's p50 within 1.3x of the floor its
quorums imply (3 journals' write + fdatasync, as ``benchmarks/wal_append.py`` measures it); the
synchronous facade's p50 within 10% of the async one's. A verdict that misses names the
machine's floor for the ratio (what raw fsyncs alone would score).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable

from _common import floor_verdict, median, pct

import pybk
from pybk.bench import RecordFile, replica_sync_floor

ONE_REPLICA = {"bookies": 1, "ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1}


def timed(commit: Callable[[], object], warmup: int, count: int) -> list[float]:
    for _ in range(warmup):
        commit()
    clock = time.perf_counter
    lat = []
    for _ in range(count):
        t0 = clock()
        commit()
        lat.append(clock() - t0)
    return lat


def run_raw(root: str, payload: bytes, warmup: int, count: int) -> list[float]:
    path = os.path.join(root, "raw.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    try:
        def commit() -> None:
            os.write(fd, payload)
            os.fdatasync(fd)
        return timed(commit, warmup, count)
    finally:
        os.close(fd)
        os.unlink(path)


def run_sqlite(root: str, payload: bytes, warmup: int, count: int) -> list[float]:
    path = os.path.join(root, "lone.db")
    db = sqlite3.connect(path, isolation_level=None)  # autocommit: one commit per insert
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE log(id INTEGER PRIMARY KEY, payload BLOB)")
        row = (payload,)
        return timed(lambda: db.execute("INSERT INTO log(payload) VALUES (?)", row),
                     warmup, count)
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)


def run_wal(root: str, payload: bytes, warmup: int, count: int, **knobs: int) -> list[float]:
    path = tempfile.mkdtemp(prefix="wal-", dir=root)
    try:
        with pybk.WAL(path, **knobs) as wal:
            return timed(lambda: wal.append(payload), warmup, count)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_async_wal(root: str, payload: bytes, warmup: int, count: int) -> list[float]:
    async def go(path: str) -> list[float]:
        async with pybk.AsyncWAL(path) as wal:
            for _ in range(warmup):
                await wal.append(payload)
            clock = time.perf_counter
            lat = []
            for _ in range(count):
                t0 = clock()
                await wal.append(payload)
                lat.append(clock() - t0)
            return lat

    path = tempfile.mkdtemp(prefix="awal-", dir=root)
    try:
        return asyncio.run(go(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def quorum_floor(root: str, size: int, duration: float) -> float:
    """The default WAL's floor: 3 journals' write + fdatasync (E3/Qw3: each lone append's
    third sync is done before the next one's on a device that serializes them), the faster
    of one after the other and all at once, p50 in seconds."""
    files = [RecordFile(os.path.join(root, f"floor-{i}.log"), preallocate=True,
                        prealloc_size=8 << 20) for i in range(3)]
    try:
        serial, both = replica_sync_floor(list(files), size, duration)
    finally:
        for f in files:
            f.close()
            with contextlib.suppress(FileNotFoundError):  # (close may remove it)
                os.unlink(f.path)
    return min(pct(serial, 0.5), pct(both, 0.5))


SYSTEMS: dict[str, Callable[[str, bytes, int, int], list[float]]] = {
    "raw write+fdatasync": run_raw,
    "sqlite WAL, sync=FULL": run_sqlite,
    "wal 1 replica (sync)": lambda r, p, w, c: run_wal(r, p, w, c, **ONE_REPLICA),
    "wal default (sync)": run_wal,
    "async wal default": run_async_wal,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2000, help="timed records per round")
    ap.add_argument("--warmup", type=int, default=200, help="untimed records first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--dir", default=".", help="where the temp directory goes (the disk)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 100 records, 10 warm-up, 1 round")
    args = ap.parse_args()
    if args.quick:
        args.records, args.warmup, args.rounds = 100, 10, 1
    if args.records < 1 or args.rounds < 1 or args.warmup < 0 or args.size < 1:
        ap.error("--records, --rounds and --size must be >= 1, --warmup >= 0")
    payload = os.urandom(args.size)
    stats: dict[str, dict[str, list[float]]] = {
        name: {"p50": [], "p99": [], "rate": []} for name in SYSTEMS}
    floors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="pybk-lone-", dir=args.dir) as root:
        print(f"disk under test: {root}; {args.size}-byte records, one at a time, "
              f"{args.warmup} warm-up + {args.records} timed per system and round, "
              f"{args.rounds} alternating rounds, medians")
        for r in range(args.rounds):
            order = list(SYSTEMS) if r % 2 == 0 else list(reversed(SYSTEMS))
            for name in order:
                lat = SYSTEMS[name](root, payload, args.warmup, args.records)
                stats[name]["p50"].append(pct(lat, 0.5))
                stats[name]["p99"].append(pct(lat, 0.99))
                stats[name]["rate"].append(len(lat) / sum(lat))
            floors.append(quorum_floor(root, args.size, 0.1 if args.quick else 0.5))
    med = {name: {k: median(v) for k, v in s.items()} for name, s in stats.items()}
    print(f"{'lone writer':<24} {'p50 ms':>8} {'p99 ms':>8} {'records/s':>10} "
          f"{'p50/raw':>8} {'p50/sqlite':>10}")
    raw, sql = med["raw write+fdatasync"], med["sqlite WAL, sync=FULL"]
    for name, m in med.items():
        print(f"{name:<24} {m['p50'] * 1e3:>8.3f} {m['p99'] * 1e3:>8.3f} {m['rate']:>10,.0f} "
              f"{m['p50'] / raw['p50']:>8.2f} {m['p50'] / sql['p50']:>10.2f}")
    one, dflt, asy = (med["wal 1 replica (sync)"], med["wal default (sync)"],
                      med["async wal default"])
    floor = median(floors)
    print(f"floor of the default's quorums (3 journals' write + fdatasync, same run): "
          f"{floor * 1e3:.3f} ms = {floor / raw['p50']:.2f} raw fsyncs")
    print("targets (ratio, limit, verdict; a miss names the floor: raw fsync alone in its place)")
    rows = [
        ("1 replica p50 / sqlite p50", one["p50"] / sql["p50"], 1.3,
         raw["p50"] / sql["p50"], sql["p50"]),
        ("1 replica p99 / sqlite p99", one["p99"] / sql["p99"], 1.5,
         raw["p99"] / sql["p99"], sql["p99"]),
        ("default p50 / quorum floor", dflt["p50"] / floor, 1.3, 1.0, floor),
        ("sync p50 / async p50", dflt["p50"] / asy["p50"], 1.1, None, asy["p50"]),
    ]
    for what, ratio, limit, machine_floor, unit in rows:
        verdict = floor_verdict(ratio <= limit, limit, machine_floor, "x", unit * 1e6)
        print(f"  {what:<28} {ratio:>6.2f}x  <= {limit:.1f}x  {verdict}")


if __name__ == "__main__":
    main()
