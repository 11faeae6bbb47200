"""pybk.WAL appends on the real disk, next to the single-file group-commit ceiling and SQLite.

pybk is the embedded default, ``pybk.AsyncWAL(path)``: 3 in-process bookies, each record on all
3 and acknowledged by 2 (E=3, Qw=3, Qa=2), records batched into ledger entries. Every system
gets the same driver: ``--inflight`` (1024) appends outstanding, each one's completion issuing
the next (a done-callback, no task per append), for a slice of ``--duration``; two shapes:

* ``1/append``: one future per record (``wal.append(record)``);
* ``64/call``: records handed over 64 at a time, one future per call (``wal.append_many``,
  a future like ``append``: 16 calls in flight hold the 1024 records; what a program with
  records in bulk calls).

In the same run, alternating with pybk round by round (a shared VM's disk drifts; medians):

* ceiling: one asyncio writer task over one file, as ``benchmarks/bookie_append.py``'s ceiling
  frames records: each record CRC32C-framed as it is appended (length, crc, payload), the task
  writes whatever accumulated while it last synced with one ``write`` and one ``fdatasync``,
  then resolves the callers (group commit; the fsync runs on the loop, as a one-task
  writer does). ``plain``: the same framing and group size in a plain loop, no asyncio.
  Both write a preallocated file in place (``pybk.bench.RecordFile``), as the embedded WAL's
  bookies write their preallocated journal segments (before, they appended to a growing
  file: a ceiling pybk got a better deal from the disk than);
* SQLite (stdlib ``sqlite3``), WAL mode, ``synchronous=FULL``, a commit per record.

Then: the same with zstd on JSON-like records (and the compression ratio); a lone writer
awaiting each append, its p50 in fsync latencies (a 100-byte write + fdatasync on a
preallocated file, p50); and the
memory of a reader tailing a long log while it is written (``--tail-records``: RSS and
Python's allocated blocks, ``sys.getallocatedblocks()``, sampled each tenth of the way).

Targets (issue 16): >= 1.5x the ceiling, >= 20x SQLite's per-record commits, a lone writer's
p50 within 3 fsync latencies, the tailing reader's memory flat. The table compares each shape
with the ceiling in the same shape; the "target (a)" line sets pybk's ``64/call`` beside the
ceiling at one future per record (each record its own request, as the target's "one
CRC-framed record per record" is read), with the ratio of each round, and says what the
like-with-like (both ``64/call``) ratio is: pybk writes each record to 3 journals on the same
disk and waits for 2 fdatasyncs per round where the ceiling writes one copy and waits for one.

    python benchmarks/wal_append.py [--duration 2] [--rounds 3] [--dir /tmp]
                                    [--tail-records 10000000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _common import (
    GroupCommitFile,
    closed_loop,
    floor_verdict,
    fsync_latencies,
    median,
    pct,
    plain_group_commit,
    run_sqlite,
)

import pybk
from pybk.bench import RecordFile, replica_sync_floor
from pybk.logs import envelope

# -- pybk ---------------------------------------------------------------------------------------


async def run_pybk(root: str, size: int, per_call: int, inflight: int, duration: float,
                   compression: str = "none", payloads: list[bytes] | None = None,
                   ) -> tuple[float, float, int, int]:
    """records/s, records per entry, raw bytes appended (with their lengths), bytes stored."""
    path = tempfile.mkdtemp(prefix="wal-", dir=root)
    try:
        async with pybk.AsyncWAL(path, compression=compression) as wal:
            items = payloads or [os.urandom(size)]
            if per_call == 1:
                append, nxt = wal.append, itertools.cycle(items).__next__

                def one() -> asyncio.Future[Any]:
                    return append(nxt())
                make = one
            else:
                append_many = wal.append_many
                batches = [items[i:i + per_call] for i in range(0, len(items) - per_call + 1,
                                                                 per_call)] or [
                    items * per_call][:1]
                batches = [b if len(b) == per_call else (b * per_call)[:per_call]
                           for b in batches]
                nxt_batch = itertools.cycle(batches).__next__

                def many() -> asyncio.Future[Any]:
                    return append_many(nxt_batch())
                make = many
            rate = await drive(make, per_call, inflight, duration)
            st = wal._w().stats
        return rate, st["records"] / max(1, st["entries"]), st["raw_bytes"], st["stored_bytes"]
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- the driver alone -----------------------------------------------------------------------------


class Nothing:
    """No I/O at all: futures resolved at the next pass of the loop. What the driver itself
    costs, the floor under every system in the table."""

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future[int]] = []
        self.scheduled = False

    def append(self, _payload: object) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.waiters.append(fut)
        if not self.scheduled:
            self.scheduled = True
            loop.call_soon(self._resolve)
        return fut

    def _resolve(self) -> None:
        self.scheduled = False
        waiters, self.waiters = self.waiters, []
        for i, fut in enumerate(waiters):
            fut.set_result(i)


async def run_nothing(per_call: int, inflight: int, duration: float) -> float:
    sink = Nothing()
    return await drive(lambda: sink.append(None), per_call, inflight, duration)


# -- the ceiling ----------------------------------------------------------------------------------


async def drive(append: Callable[[], asyncio.Future[Any]], per_call: int, inflight: int,
                duration: float) -> float:
    """Keep ``inflight`` records outstanding (``per_call`` per future) for ``duration`` s;
    records/s."""
    run = await closed_loop(append, max(1, inflight // per_call), duration)
    return run.rate * per_call


async def run_ceiling(file: RecordFile, size: int, per_call: int, inflight: int,
                      duration: float) -> tuple[float, float]:
    """records/s, records per fsync. ``file`` is preallocated and written in place, as the
    embedded WAL's journal segments are (``pybk.wal.embedded_bookie_config``)."""
    log = GroupCommitFile(file)
    payload = os.urandom(size)
    batch = [payload] * per_call
    try:
        if per_call == 1:
            rate = await drive(lambda: log.append(payload), 1, inflight, duration)
        else:
            rate = await drive(lambda: log.append_many(batch), per_call, inflight, duration)
        return rate, log.records / max(1, log.syncs)
    finally:
        await log.close()


def run_plain(file: RecordFile, size: int, group: int, duration: float
              ) -> tuple[float, list[float]]:
    """The ceiling's framing and group size in a plain loop (no asyncio), on a preallocated
    file written in place: records/s, sync latencies."""
    return plain_group_commit(file, size, group, duration)


# -- JSON-like records ----------------------------------------------------------------------------


def json_records(n: int, rng: random.Random) -> list[bytes]:
    """About 100-byte JSON events with the repetition of real ones (keys, enums, ids)."""
    actions = ["view", "click", "add_to_cart", "purchase", "search"]
    out = []
    for i in range(n):
        doc = {"ts": 1_700_000_000_000 + i * 7, "user": f"u{rng.randrange(5000):05d}",
               "action": rng.choice(actions), "item": rng.randrange(100_000),
               "price": round(rng.uniform(1, 200), 2)}
        out.append(json.dumps(doc, separators=(",", ":")).encode())
    return out


# -- a lone writer --------------------------------------------------------------------------------


async def lone_writer(root: str, size: int, duration: float) -> list[float]:
    path = tempfile.mkdtemp(prefix="wal-lone-", dir=root)
    try:
        async with pybk.AsyncWAL(path) as wal:
            payload = os.urandom(size)
            lat: list[float] = []
            stop = time.perf_counter() + duration
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                await wal.append(payload)
                lat.append(time.perf_counter() - t0)
            return lat
    finally:
        shutil.rmtree(path, ignore_errors=True)


def lone_sync_writer(root: str, size: int, count: int) -> list[float]:
    path = tempfile.mkdtemp(prefix="wal-sync-", dir=root)
    try:
        with pybk.WAL(path) as wal:
            payload = os.urandom(size)
            lat = []
            for _ in range(count):
                t0 = time.perf_counter()
                wal.append(payload)
                lat.append(time.perf_counter() - t0)
            return lat
    finally:
        shutil.rmtree(path, ignore_errors=True)


def replica_floor_line(root: str, size: int, fsync: float, p50: float) -> tuple[str, float]:
    """What the disk alone makes a lone append wait for: the embedded WAL writes each record
    to 3 journals (E3/Qw3) and acknowledges on 2 (Qa2), so the floor is 2 journals' write +
    fdatasync, and in a steady run, where every append's third sync must also happen before
    the next append's syncs on a device that serializes them, 3 (``replica_sync_floor``: the
    faster of one after the other and all at once). (the line, the 3-journal floor in
    fsyncs)."""
    floors = []
    for replicas in (2, 3):
        files = [RecordFile(os.path.join(root, f"floor-{replicas}-{i}.log"), preallocate=True,
                            prealloc_size=8 << 20) for i in range(replicas)]
        try:
            serial, both = replica_sync_floor(files, size, 0.5)
        finally:
            for f in files:
                f.close()
        floors.append((pct(serial, 0.5), pct(both, 0.5)))
    (s2, c2), (s3, c3) = floors
    return (f"replicas' sync floor on this disk (preallocated journal files): 2 journals "
            f"{min(s2, c2) * 1e3:.3f} ms = {min(s2, c2) / fsync:.2f} fsyncs (one after the other "
            f"{s2 * 1e3:.3f} ms, at once {c2 * 1e3:.3f} ms), 3 journals {min(s3, c3) * 1e3:.3f} ms "
            f"= {min(s3, c3) / fsync:.2f} fsyncs (one after the other {s3 * 1e3:.3f} ms, at once "
            f"{c3 * 1e3:.3f} ms); the lone writer's p50 = {p50 / min(s2, c2):.2f}x the 2-journal "
            f"floor, {p50 / min(s3, c3):.2f}x the 3-journal one"), min(s3, c3) / fsync


# -- a reader tailing a long log ----------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def tail_memory(root: str, size: int, total: int) -> list[tuple[int, float, int]]:
    """A writer appends ``total`` records (append_many, 4096 at a time, up to 8 calls in
    flight) while a reader follows the tail; RSS each tenth of the way (records read)."""
    path = tempfile.mkdtemp(prefix="wal-tail-", dir=root)
    samples: list[tuple[int, float, int]] = []
    try:
        async with pybk.AsyncWAL(path) as wal:
            payload = os.urandom(size)
            batch = [payload] * 4096
            read = 0
            step = max(1, total // 10)

            async def read_all() -> None:
                nonlocal read
                async for _ in wal.log.reader():
                    read += 1
                    if read % step == 0:
                        samples.append((read, rss_mb(), sys.getallocatedblocks()))
                    if read >= total:
                        return

            reader = asyncio.ensure_future(read_all())
            gc.collect()
            samples.append((0, rss_mb(), sys.getallocatedblocks()))
            sent = 0
            inflight: set[asyncio.Future[Any]] = set()
            while sent < total:
                n = min(len(batch), total - sent)
                fut = wal.append_many(batch[:n])
                inflight.add(fut)
                sent += n
                if len(inflight) >= 8:
                    done, inflight = await asyncio.wait(inflight,
                                                        return_when=asyncio.FIRST_COMPLETED)
                    for f in done:
                        f.result()
            await asyncio.gather(*inflight)
            await reader
        return samples
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- main -----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=2.0,
                    help="seconds per system and shape (split over the rounds)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp", help="where the temp directory goes (the disk)")
    ap.add_argument("--inflight", type=int, default=1024)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--tail-records", type=int, default=10_000_000,
                    help="records of the tailing-reader memory run (0: skip it)")
    args = ap.parse_args()
    slice_ = args.duration / args.rounds
    size, inflight = args.size, args.inflight
    with tempfile.TemporaryDirectory(prefix="pybk-wal-bench-", dir=args.dir) as root, \
            contextlib.closing(RecordFile(os.path.join(root, "ceiling.log"),
                                          preallocate=True)) as ceiling_file:
        print(f"disk under test: {root}; {size}-byte records, {inflight} outstanding, "
              f"{args.rounds} alternating rounds of {slice_:.2f} s, medians")
        print("pybk: pybk.AsyncWAL(path), embedded, 3 bookies, E=3 Qw=3 Qa=2")
        header = (f"{'shape':>9} | {'pybk/s':>9} {'rec/entry':>9} | {'ceiling/s':>9} "
                  f"{'rec/sync':>8} {'plain/s':>9} | {'sqlite1/s':>9} | {'vs ceil':>7} "
                  f"{'vs plain':>8} {'vs sqlite':>9} | {'floor/s':>9}")
        print(header)
        print("-" * len(header))
        shapes = (1, 64)
        res: dict[str, dict[int, list[float]]] = {
            k: {pc: [] for pc in shapes}
            for k in ("pybk", "per_entry", "ceil", "group", "plain", "sqlite", "floor")}
        for _ in range(args.rounds):  # every system and shape once a round: one disk state
            for per_call in shapes:
                res["floor"][per_call].append(
                    asyncio.run(run_nothing(per_call, inflight, min(slice_, 0.5))))
                rate, pe, _, _ = asyncio.run(run_pybk(root, size, per_call, inflight, slice_))
                res["pybk"][per_call].append(rate)
                res["per_entry"][per_call].append(pe)
                ceil, group = asyncio.run(run_ceiling(ceiling_file, size, per_call, inflight,
                                                      slice_))
                res["ceil"][per_call].append(ceil)
                res["group"][per_call].append(group)
                res["plain"][per_call].append(
                    run_plain(ceiling_file, size, max(1, round(group)), slice_)[0])
            res["sqlite"][1].append(run_sqlite(root, size, 1, min(slice_, 0.5)))
        med = {k: {pc: median(v) for pc, v in by.items() if v} for k, by in res.items()}
        sql = med["sqlite"][1]
        for per_call in shapes:
            rate, ceil, plain = med["pybk"][per_call], med["ceil"][per_call], med["plain"][per_call]
            name = "1/append" if per_call == 1 else f"{per_call}/call"
            print(f"{name:>9} | {rate:>9,.0f} {med['per_entry'][per_call]:>9.0f} | {ceil:>9,.0f} "
                  f"{med['group'][per_call]:>8.0f} {plain:>9,.0f} | {sql:>9,.0f} | "
                  f"{rate / ceil:>6.2f}x {rate / plain:>7.2f}x {rate / sql:>8.1f}x | "
                  f"{med['floor'][per_call]:>9,.0f}")
        many, one = max(shapes), med["ceil"][1]
        ratios = [p / c for p, c in zip(res["pybk"][many], res["ceil"][1], strict=True)]
        print(f"\ntarget (a): pybk, 1024 records outstanding as append_many calls of {many} "
              f"({med['pybk'][many]:,.0f}/s), against the ceiling with each record its own "
              f"request (1024 outstanding, one future each: {one:,.0f}/s): "
              f"{med['pybk'][many] / one:.2f}x (per round: "
              f"{', '.join(f'{r:.2f}x' for r in ratios)}); against SQLite's per-record "
              f"commits: {med['pybk'][many] / sql:.0f}x")
        ceil_mb = med["ceil"][many] * (size + 8) / 1e6
        pybk_mb = med["pybk"][many] * (size + 4) * 3 / 1e6
        per_record = med["pybk"][1] / one
        driver = med["floor"][1] / one
        print(f"  like with like (both 1/append): {per_record:.2f}x: "
              f"{floor_verdict(per_record >= 1.5, 1.5, driver, 'x')}: the driver alone, a "
              f"future per record resolved with no I/O at all, makes {med['floor'][1]:,.0f}/s "
              f"= {driver:.2f}x the ceiling: no system driven with a future per record "
              "goes faster")
        print(f"  like with like (both {many}/call): {med['pybk'][many] / med['ceil'][many]:.2f}x:"
              f" pybk writes {pybk_mb:,.0f} MB/s (3 copies, one per bookie's journal, 2 of "
              f"their fdatasyncs awaited each round), the ceiling {ceil_mb:,.0f} MB/s (1 copy, "
              f"1 fdatasync)")

        rng = random.Random(7)
        docs = json_records(20_000, rng)
        raw = envelope.encode(docs[:1000], None, 0, -1, envelope.CODEC_NONE)
        packed = envelope.encode(docs[:1000], None, 0, -1, envelope.CODEC_ZSTD)
        print(f"\nJSON-like records ({sum(map(len, docs)) / len(docs):.0f} B average), "
              f"both shapes, with and without zstd:")
        by_codec: dict[tuple[str, int], list[float]] = {}
        stored: dict[str, tuple[int, int]] = {}
        for _ in range(args.rounds):
            for per_call in shapes:
                for codec in ("none", "zstd"):
                    rate, _, raw_bytes, stored_bytes = asyncio.run(
                        run_pybk(root, size, per_call, inflight, slice_, codec, docs))
                    by_codec.setdefault((codec, per_call), []).append(rate)
                    stored[codec] = (raw_bytes, stored_bytes)
        for per_call in shapes:
            name = "1/append" if per_call == 1 else f"{per_call}/call"
            none, zstd = median(by_codec["none", per_call]), median(by_codec["zstd", per_call])
            print(f"  {name:>8}: compression=none {none:>9,.0f} records/s, zstd "
                  f"{zstd:>9,.0f} records/s ({zstd / none:.2f}x)")
        for codec in ("none", "zstd"):
            r, st = stored[codec]
            print(f"  compression={codec:<4}: {st / max(1, r):.2f} bytes stored per byte "
                  f"appended")
        print(f"  zstd on one 1000-record envelope: {len(raw)} -> {len(packed)} bytes, "
              f"ratio {len(raw) / len(packed):.1f}x")

        lone = asyncio.run(lone_writer(root, size, min(args.duration, 2.0)))
        sync_lone = lone_sync_writer(root, size, 500)
        fsync = pct(fsync_latencies(ceiling_file, size, 0.5), 0.5)
        p50, p99 = pct(lone, 0.5), pct(lone, 0.99)
        print(f"\nlone writer (await each append): p50 {p50 * 1e3:.3f} ms, p99 "
              f"{p99 * 1e3:.3f} ms = {p50 / fsync:.2f} fsync latencies "
              f"(100 B write + fdatasync p50 {fsync * 1e3:.3f} ms); "
              f"{len(lone) / min(args.duration, 2.0):,.0f} appends/s")
        print(f"lone writer, sync pybk.WAL.append: p50 {pct(sync_lone, 0.5) * 1e3:.3f} ms "
              f"= {pct(sync_lone, 0.5) / fsync:.2f} fsync latencies")
        line, floor3 = replica_floor_line(root, size, fsync, p50)
        print(line)
        print(f"target (b), a lone writer's p50 <= 3 fsyncs: {p50 / fsync:.2f}: "
              f"{floor_verdict(p50 / fsync <= 3, 3, floor3, ' fsyncs', fsync * 1e6)} "
              "(the floor: 3 journals' syncs, as a steady lone writer's appends each wait for "
              "the third sync of the one before on this disk)")

        if args.tail_records:
            t0 = time.perf_counter()
            samples = asyncio.run(tail_memory(root, size, args.tail_records))
            took = time.perf_counter() - t0
            print(f"\ntailing reader of a log being written, {args.tail_records:,} records "
                  f"in {took:.0f} s ({args.tail_records / took:,.0f} written and read per s), "
                  f"process RSS (MB) by records read:")
            print("  " + "  ".join(f"{n / 1e6:.1f}M:{mb:.0f}" for n, mb, _ in samples))
            print("  Python's allocated blocks (thousands), same points: " + "  ".join(
                f"{blocks / 1e3:.0f}" for _, _, blocks in samples))
            if len(samples) > 2:
                later = samples[1:]
                rss = [mb for _, mb, _ in later]
                blocks = [b for _, _, b in later]
                print(f"  from the first tenth to the end: RSS {min(rss):.0f}-{max(rss):.0f} MB "
                      f"(end {later[-1][1] - later[0][1]:+.0f} MB), allocated blocks "
                      f"{min(blocks) / 1e3:.0f}k-{max(blocks) / 1e3:.0f}k "
                      f"(end {(later[-1][2] - later[0][2]) / 1e3:+.0f}k)")
    print("\nshapes: 1/append = one future per record, 64/call = append_many of 64 (one "
          "future per call). ceiling: one asyncio writer task, each record CRC-framed, one "
          "write + fdatasync per accumulated group (rec/sync), on a preallocated file "
          "written in place (as the WAL's bookies' segments). plain: the same framing and "
          "group size in a loop without asyncio. sqlite1: WAL mode, synchronous=FULL, a "
          "commit per record. floor: the driver with no I/O at all (futures resolved at the "
          "next pass of the loop): no system with this driver can go faster.")


if __name__ == "__main__":
    main()
