"""The measurements ``targets.py`` is made of, each one figure of pybk or of its peer.

Apart from the runner (``targets.py``: the rounds, the rows and their verdicts) so that each
measurement reads on its own: what it drives, for how long, and what it returns. Every
function here runs on the loop it is awaited on; none prints.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import crc32c
from _common import (
    GroupCommitFile,
    Run,
    closed_loop,
    frame_records,
    fsync_latencies,
    open_loop,
    percentile,
)

from pybk.bench import RecordFile, replica_sync_floor
from pybk.bench.ceiling import RECORD_HEADER

#: the entries' size (B) and the quorums (E, Qw, Qa) of the rows
SIZE = 100
E3 = (3, 2, 2)
E1 = (1, 1, 1)


async def ledger_closed_loop(client: Any, quorum: tuple[int, int, int], inflight: int,
                             duration: float) -> tuple[Run, Any]:
    """Appends to a new ledger (warm-up, then ``duration`` s); (run, the open handle)."""
    lh = await client.create_ledger(*quorum)
    payload = os.urandom(SIZE)
    append = lh.append
    await closed_loop(lambda: append(payload), inflight, min(duration, 0.3))
    return await closed_loop(lambda: append(payload), inflight, duration), lh


class GcWatch:
    """The collector's passes while a measurement runs (``gc.callbacks``): how many, and the
    longest, so a latency tail can be told apart from the collector's pauses."""

    def __init__(self) -> None:
        self.passes = 0
        self.longest = 0.0
        self._started = 0.0

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.passes += 1
            self.longest = max(self.longest, time.perf_counter() - self._started)


async def idle_loop_lateness(duration: float, period: float = 0.001) -> list[float]:
    """How late an idle event loop wakes up: a timer every ``period`` s for ``duration`` s,
    each sample the time past its due time. Nothing of pybk runs: this is the machine's floor
    for any latency measured on this loop (a descheduled process, a busy neighbour)."""
    loop = asyncio.get_running_loop()
    late: list[float] = []
    end = loop.time() + duration
    while loop.time() < end:
        due = time.perf_counter() + period
        await asyncio.sleep(period)
        late.append(max(0.0, time.perf_counter() - due))
    return late


async def ledger_open_loop(client: Any, rate: float, duration: float
                           ) -> tuple[Run, dict[str, float]]:
    """An open loop at ``rate`` (E3/Qw2/Qa2): (run, {CPU per append in s, collector passes,
    longest pass in s})."""
    lh = await client.create_ledger(*E3)
    payload = os.urandom(SIZE)
    append = lh.append
    try:
        await closed_loop(lambda: append(payload), 1, 0.1)
        idle = await idle_loop_lateness(min(duration, 0.5))
        cpu = time.process_time()
        with GcWatch() as watch:
            run = await open_loop(lambda: append(payload), rate, duration)
        cpu = time.process_time() - cpu
        return run, {"cpu": cpu / max(1, run.count), "gc_passes": watch.passes,
                     "gc_longest": watch.longest, "idle_p99": percentile(idle, 0.99),
                     "idle_max": max(idle, default=0.0)}
    finally:
        await lh.close()


async def ceiling_run(target: str | RecordFile, inflight: int, duration: float
                      ) -> tuple[Run, float]:
    """The single-file group-commit ceiling at ``inflight``: (run, records per fsync).
    ``target``: a path (a growing file) or the round's preallocated file."""
    log = GroupCommitFile(target, preallocate=False if isinstance(target, str) else None)
    payload = os.urandom(SIZE)
    try:
        await closed_loop(lambda: log.append(payload), inflight, min(duration, 0.3))
        syncs, records = log.syncs, log.records
        run = await closed_loop(lambda: log.append(payload), inflight, duration)
        return run, (log.records - records) / max(1, log.syncs - syncs)
    finally:
        await log.close()


def read_ceiling(root: str, entries: int) -> float:
    """Records/s of a plain loop reading ``entries`` CRC-framed 100 B records from one file
    (1 MiB reads, each record's header parsed and CRC verified, payloads kept)."""
    path = os.path.join(root, "read-ceiling.log")
    payload = os.urandom(SIZE)
    with open(path, "wb") as f:
        for i in range(0, entries, 10_000):
            f.write(b"".join(frame_records(payload, min(10_000, entries - i))))
    unpack, crc, hsize = RECORD_HEADER.unpack_from, crc32c.crc32c, RECORD_HEADER.size
    got: list[bytes] = []
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        rest = b""
        while chunk := f.read(1 << 20):
            buf = rest + chunk
            pos = 0
            while pos + hsize <= len(buf):
                length, checksum = unpack(buf, pos)
                end = pos + hsize + length
                if end > len(buf):
                    break
                data = buf[pos + hsize:end]
                if crc(data) != checksum:
                    raise RuntimeError(f"corrupt record at {pos}")
                got.append(data)
                pos = end
            rest = buf[pos:]
    elapsed = time.perf_counter() - t0
    os.unlink(path)
    if len(got) != entries:
        raise RuntimeError(f"read {len(got)} records, wrote {entries}")
    return entries / elapsed


async def read_run(client: Any, entries: int) -> tuple[float, float]:
    """Entries/s reading a closed ledger of ``entries`` entries from start to end, and the
    process's CPU seconds per entry read."""
    lh = await client.create_ledger(*E3)
    payload = os.urandom(SIZE)
    await closed_loop(lambda: lh.append(payload), 1024, count=entries)
    await lh.close()
    rh = await client.open_ledger(lh.id)
    last = rh.last_add_confirmed
    if last != entries - 1:
        raise RuntimeError(f"ledger ends at {last}, wrote {entries}")
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for first in range(0, last + 1, 1000):
        batch = await rh.read(first, min(first + 999, last))
        n += len(batch)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    await rh.close()
    await client.delete_ledger(lh.id)
    if n != entries:
        raise RuntimeError(f"read {n} entries of {entries}")
    return n / elapsed, cpu / n


async def fsync_samples(target: str | RecordFile, duration: float) -> list[float]:
    """One 100 B write + fdatasync, repeated for ``duration`` s on a growing file (a path) or
    the round's preallocated file, half on this thread and half on a worker thread (as a
    bookie's sync thread does it): on this VM either can be several times the other."""
    pre = False if isinstance(target, str) else None
    here = fsync_latencies(target, SIZE, duration / 2, preallocate=pre)
    there = await asyncio.to_thread(fsync_latencies, target, SIZE, duration / 2,
                                    preallocate=pre)
    return min(here, there, key=lambda xs: percentile(xs, 0.5))


async def lone_writer(client: Any, duration: float, units: dict[str, str | RecordFile],
                      slices: int = 4,
                      floors: dict[str, list[str | RecordFile]] | None = None,
                      peer: Callable[[float], Awaitable[list[float]]] | None = None,
                      ) -> tuple[Run, dict[str, float]]:
    """A lone writer (1 in flight, E3/Qw2/Qa2) in ``slices`` slices of ``duration`` s in
    all, each followed by the fsync latency on each of ``units``' files, so both are
    measured in the same moments of a drifting disk. (run, {unit: p50 of its samples}).

    ``floors``: file treatment -> one file per replica of the ack quorum; after each slice
    also the replicas' sync floor on each treatment's files (``replica_sync_floor``: Qa write
    + fdatasyncs one after the other and all at once), reported as ``floor_serial_<kind>``
    and ``floor_concurrent_<kind>``.

    ``peer``: the simplest program doing a lone replicated write (``tcp_floor_servers``'
    ``measure``), run after each slice too, reported as ``peer``."""
    lh = await client.create_ledger(*E3)
    payload = os.urandom(SIZE)
    append = lh.append
    lat: list[float] = []
    samples: dict[str, list[float]] = {name: [] for name in units}
    for kind in floors or {}:
        samples[f"floor_serial_{kind}"], samples[f"floor_concurrent_{kind}"] = [], []
    if peer:
        samples["peer"] = []
    count, elapsed = 0, 0.0
    try:
        await closed_loop(lambda: append(payload), 1, 0.1)
        for _ in range(slices):
            run = await closed_loop(lambda: append(payload), 1, duration / slices)
            lat += run.latencies
            count += run.count
            elapsed += run.elapsed
            for name, target in units.items():
                samples[name] += await fsync_samples(target, min(0.2, duration / slices))
            for kind, files in (floors or {}).items():
                serial, both = await asyncio.to_thread(
                    replica_sync_floor, files, SIZE, min(0.2, duration / slices))
                samples[f"floor_serial_{kind}"] += serial
                samples[f"floor_concurrent_{kind}"] += both
            if peer:
                samples["peer"] += await peer(min(0.2, duration / slices))
    finally:
        await lh.close()
    p99s = {f"{k}_p99": percentile(v, 0.99) for k, v in samples.items()}
    return Run(count, elapsed, lat), {**{k: percentile(v, 0.5) for k, v in samples.items()},
                                      **p99s}
