"""Durable appends into one bookie on the real disk, next to the plain-file ceiling and SQLite.

For each (writers, entry size): N writers each add framed entries to their own ledger and wait
for durability before sending the next one, for a fixed duration; twice: callback writers
(``Bookie.add_entry``, the next add sent from the durability callback, the shape of
BookKeeper's ``asyncAddEntry`` and of the TCP server's requests) and task writers (one asyncio
task each, ``await Bookie.add``). Then, in the same run and on the same disk:

* ceiling: a plain Python loop writing CRC-framed records to one file, one ``write`` and one
  ``fdatasync`` per group, the group size being the bookie's measured records per fsync. The
  file gets the bookie's file treatment: with preallocated journal segments (the default, as
  ``pybk bookie`` runs) it is a 64 MiB file of synced zeros written in place with ``pwrite``
  (``pybk.bench.RecordFile``), so each fdatasync flushes data only, as the bookie's do; with
  ``--append-segments`` both the bookie and the loop append to growing files. (Before, the
  loop always appended while the bookie wrote in place, so the bookie could beat its own
  ceiling.) Under load the bookie splits its writers into two cohorts whose batches take
  turns (one syncs while the other is answered), so its groups hold about half the writers;
  ``ceil@N`` is the stricter reference with every writer in each group;
* SQLite (stdlib ``sqlite3``), WAL mode, ``synchronous=FULL``, twice: ``sql1`` commits each
  append (what N concurrent writers that each await durability get from SQLite, which has no
  group commit across connections), ``sqlite`` is handed the bookie's whole group as one
  transaction (a stricter reference: the batching done for it).

The bookie runs as in a ``pybk bookie`` process: overlapped journal syncs through a sync
process (``journal_overlap_syncs``, ``OsFileSystem(sync_process=True)``), a batch with nothing
to overlap synced on the loop's thread (``INLINE_SYNC_ALWAYS``), journal segments preallocated
and written in place (``journal_preallocate``; ``--append-segments`` turns it off, and the
ceiling's file with it), and the server's garbage-collector settings
(``pybk.server.process.tune_gc_for_server``, applied once each bookie has started, after
collecting what the previous configurations left).

Targets (issue 2): with 256 writers >= 50% of the ceiling and >= 3x SQLite; a lone writer's
p50 <= 1.5 fsync latencies (the fsync latency: one 100 B record written and fdatasync'ed,
p50, on a file with the bookie's treatment).

    python benchmarks/bookie_append.py [--duration 2] [--dir /tmp] [--writers 1,16,256]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import tempfile
import time

from _common import cpu_probe, fsync_latencies, median, pct, plain_group_commit, run_sqlite

from pybk.bench import RecordFile
from pybk.bookie import Bookie, BookieConfig
from pybk.server.process import tune_gc_for_server
from pybk.storage import OsFileSystem
from pybk.storage.store import INLINE_SYNC_ALWAYS
from pybk.wire import DigestManager, master_key

KEY = master_key(b"bench")


async def run_bookie(root: str, writers: int, size: int, duration: float, run: int = 0,
                     style: str = "callback", preallocate: bool = True,
                     ) -> tuple[float, list[float], float]:
    """entries/s, latencies (s), records per fsync.

    ``style="callback"``: each writer adds through ``Bookie.add_entry`` and sends its next
    entry from the durability callback (BookKeeper's ``asyncAddEntry`` with an
    ``AddCallback``; also how the TCP server feeds the bookie). ``style="task"``: each writer
    is an asyncio task doing ``await bookie.add(...)``, which adds a task switch and a
    future per entry on the writer's side."""
    fs = OsFileSystem(sync_process=True)
    data_dir = os.path.join(root, f"bookie-{run}-{writers}-{size}-{style}")
    bookie = Bookie("bench", data_dir, fs=fs,
                    config=BookieConfig(disk_check_interval=0, checkpoint_interval=0,
                                        # alone on its loop, like a `pybk bookie` process
                                        journal_inline_sync_max=INLINE_SYNC_ALWAYS,
                                        journal_overlap_syncs=True,
                                        journal_preallocate=preallocate),
                    rng=random.Random(1))
    await bookie.start()
    # as `pybk bookie` does once started: freeze what start-up built, raise the gen0
    # threshold; first collect what earlier configurations left (a long-running server has
    # no such heap of dead bookies for its full collections to walk)
    gc.unfreeze()
    gc.collect()
    tune_gc_for_server()
    payload = os.urandom(size)
    lat: list[float] = []
    count = 0
    stop_at = 0.0
    clock = time.perf_counter
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    running = writers

    class CallbackWriter:
        __slots__ = ("callback", "dm", "eid", "lid", "t0")

        def __init__(self, lid: int) -> None:
            self.lid = lid
            self.dm = DigestManager(lid)
            self.eid = 0
            self.t0 = 0.0
            self.callback = self.on_done  # one bound method per writer, not per entry

        def send(self) -> None:
            eid = self.eid
            body = self.dm.frame(eid, eid - 1, 0, payload)
            self.t0 = clock()
            bookie.add_entry(self.lid, eid, KEY, body, self.callback)

        def on_done(self, error: BaseException | None) -> None:
            nonlocal count, running
            now = clock()
            if error is not None:
                if not finished.done():
                    finished.set_exception(RuntimeError(f"add failed: {error!r}"))
                return
            lat.append(now - self.t0)
            count += 1
            self.eid += 1
            if now < stop_at:
                self.send()
                return
            running -= 1
            if not running and not finished.done():
                finished.set_result(None)

    async def task_writer(lid: int) -> None:
        nonlocal count
        dm = DigestManager(lid)
        eid = 0
        while clock() < stop_at:
            body = dm.frame(eid, eid - 1, 0, payload)
            t0 = clock()
            await bookie.add(lid, eid, KEY, body)
            lat.append(clock() - t0)
            eid += 1
            count += 1

    assert bookie.store is not None
    stats = bookie.store.journal.stats
    b0, r0 = stats["batches"], stats["records"]
    start = clock()
    stop_at = start + duration
    if style == "callback":
        for lid in range(writers):
            CallbackWriter(lid).send()
        await finished
    else:
        await asyncio.gather(*(task_writer(lid) for lid in range(writers)))
    elapsed = clock() - start
    per_sync = (stats["records"] - r0) / max(1, stats["batches"] - b0)
    await bookie.stop()
    fs.close()
    shutil.rmtree(data_dir)  # (preallocated segments: 64 MiB or more each)
    return count / elapsed, lat, per_sync


def ceiling(file: RecordFile, size: int, group: int, secs: float) -> float:
    """The plain loop's records/s with groups of ``group``, on ``file``: treated as the
    bookie's segments are (preallocated and written in place, or appended), made once per
    run (making a preallocated file loads the disk for a while after)."""
    return plain_group_commit(file, size, group, secs)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=2.0,
                    help="seconds per configuration and system (split over the rounds)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternate bookie / ceiling / SQLite this many times per configuration "
                         "and report medians (a shared VM's disk speed drifts)")
    ap.add_argument("--dir", default="/tmp", help="where the temp directory goes (the disk)")
    ap.add_argument("--writers", default="1,16,256")
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--append-segments", action="store_true",
                    help="journal segments written by appends instead of preallocated")
    args = ap.parse_args()
    prealloc = not args.append_segments
    writers_list = [int(x) for x in args.writers.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    slice_ = args.duration / args.rounds
    with tempfile.TemporaryDirectory(prefix="pybk-bench-", dir=args.dir) as root:
        print(f"disk under test: {root}; {args.rounds} alternating rounds of {slice_:.2f} s, "
              "medians")
        if prealloc:
            print("file treatment, both sides: bookie journal segments preallocated (64 MiB, "
                  "written in place); ceiling file 64 MiB of synced zeros written in place "
                  "with pwrite: every fdatasync flushes data only")
        else:
            print("file treatment, both sides (--append-segments): the bookie's journal "
                  "segments and the ceiling's file are appended to and grow")
        header = (f"{'writers':>7} {'size':>5} | {'bookie/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
                  f"{'per sync':>8} {'tasks/s':>8} | {'ceiling/s':>9} {'ceil@N/s':>9} "
                  f"{'sqlite/s':>9} {'sql1/s':>7} | {'vs ceil':>7} {'vs ceil@N':>9} "
                  f"{'vs sqlite':>9} {'vs sql1':>8} {'tasks/ceil':>10} | {'cpu ns':>6}")
        print(header)
        print("-" * len(header))
        ceiling_file = RecordFile(os.path.join(root, "ceiling.log"), preallocate=prealloc)
        run = 0
        for size in sizes:
            for writers in writers_list:
                rates, tasks, p50s, p99s, ceils, sqls, sql1s, fsyncs, fulls, cpus = (
                    [] for _ in range(10))
                per_sync = 1.0
                for _ in range(args.rounds):
                    run += 1
                    cpus.append(cpu_probe())
                    rate, lat, per_sync = asyncio.run(
                        run_bookie(root, writers, size, slice_, run, preallocate=prealloc))
                    rates.append(rate)
                    p50s.append(pct(lat, 0.5))
                    p99s.append(pct(lat, 0.99))
                    tasks.append(asyncio.run(
                        run_bookie(root, writers, size, slice_, run, style="task",
                                   preallocate=prealloc))[0])
                    group = max(1, round(per_sync))
                    ceils.append(ceiling(ceiling_file, size, group, slice_))
                    fulls.append(ceils[-1] if group >= writers
                                 else ceiling(ceiling_file, size, writers, slice_))
                    sqls.append(run_sqlite(root, size, group, slice_))
                    sql1s.append(run_sqlite(root, size, 1, min(slice_, 0.5)))
                    if writers == 1:
                        fsyncs.append(pct(fsync_latencies(
                            ceiling_file, size, min(slice_, 0.5)), 0.5))
                rate, ceil, sql, sql1 = median(rates), median(ceils), median(sqls), median(sql1s)
                task, full = median(tasks), median(fulls)
                print(f"{writers:>7} {size:>5} | {rate:>9,.0f} {median(p50s) * 1e3:>7.3f} "
                      f"{median(p99s) * 1e3:>7.3f} {per_sync:>8.1f} {task:>8,.0f} | "
                      f"{ceil:>9,.0f} {full:>9,.0f} {sql:>9,.0f} {sql1:>7,.0f} | "
                      f"{rate / ceil:>6.0%} {rate / full:>9.0%} "
                      f"{rate / sql:>8.1f}x {rate / sql1:>7.1f}x {task / ceil:>9.0%} | "
                      f"{median(cpus):>6.0f}")
                if fsyncs:
                    ratios = [p / f for p, f in zip(p50s, fsyncs, strict=True)]
                    print(f"{'':>15}lone writer: p50 {median(p50s) * 1e3:.3f} ms vs one "
                          f"write+fdatasync p50 {median(fsyncs) * 1e3:.3f} ms = "
                          f"{median(ratios):.2f} fsync latencies (median of per-round ratios)")
        ceiling_file.close()
        print("bookie: callback writers (Bookie.add_entry, next add from the durability "
              "callback); tasks: one asyncio task per writer awaiting Bookie.add. ceiling: "
              "plain loop, CRC-framed records, one write+fdatasync per group of the bookie's "
              "measured records per sync, on a file treated as the bookie's segments are "
              "(above); ceil@N: the same with groups of all N writers; "
              "sqlite: WAL, synchronous=FULL, one transaction per group of the bookie's size; "
              "sql1: one transaction per append. cpu ns: the ceiling's framing loop without "
              "I/O, ns per record (a fixed amount of Python work: higher = a slower host "
              "CPU, which lowers the CPU-bound bookie's ratio to the fsync-bound ceiling)")


if __name__ == "__main__":
    main()
