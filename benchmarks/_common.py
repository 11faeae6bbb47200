"""What the benchmarks share (one copy): peers, probes, event loops, driving a bookie directly.

The ceilings, drivers and percentiles live in :mod:`pybk.bench` (``pybk bench`` uses the same
ones); this module adds what only the scripts need: SQLite as a peer, a CPU-speed probe, running
a coroutine on each available event loop, adding to a bookie without the client, and settings
printed the same way everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from pybk.bench import (
    GroupCommitFile,
    LatencySummary,
    Run,
    closed_loop,
    frame_records,
    fsync_latencies,
    median,
    open_loop,
    percentile,
    plain_group_commit,
)
from pybk.runtime.eventloop import available_loops, run
from pybk.wire import DigestManager, master_key

__all__ = [
    "GroupCommitFile",
    "LatencySummary",
    "Run",
    "bookie_appender",
    "closed_loop",
    "config_diff",
    "cpu_probe",
    "floor_verdict",
    "frame_records",
    "fsync_latencies",
    "ledger_run",
    "loops_to_run",
    "median",
    "open_loop",
    "paired_cost",
    "pct",
    "percentile",
    "plain_group_commit",
    "run_on",
    "run_sqlite",
    "server_settings",
    "tcp_bookies",
]

T = TypeVar("T")


def paired_cost(ratios: list[float], worse: str = "dearer") -> tuple[float, str, str]:
    """A cost from paired rounds (each ratio: one round's A/B, above 1 worse for A, the two
    run back to back so a load that moves both moves their ratio less): (the median, the
    rounds' range, the verdict). Unchanged within 5%; within noise when at least a quarter
    of the rounds found A no worse; else ``worse``."""
    ratios = sorted(ratios)
    ratio = median(ratios)
    if ratio <= 1.05:
        say = "unchanged: met"
    elif ratios[(len(ratios) - 1) // 4] <= 1.0:
        say = "within noise: met"
    else:
        say = f"{ratio - 1:.0%} {worse}: not met"
    return ratio, f"{ratios[0]:.2f}-{ratios[-1]:.2f}", say


def pct(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (``pybk.bench.percentile``)."""
    return percentile(samples, q)


def floor_verdict(met: bool, limit: float, floor: float | None, unit: str = "",
                  unit_us: float | None = None) -> str:
    """A target's verdict beside the machine's floor for it, both in the target's unit: a
    latency target ``<= limit`` units (``unit_us``: one unit in microseconds) or a throughput
    target ``>= limit`` (``unit_us`` None). ``floor``: the least (latency) or the most
    (throughput) the machine allows whatever the product does. A target the floor already
    misses is said to be so: no product meets it here."""
    if met:
        return "met"
    if floor is None:
        return "NOT MET"
    if unit_us is not None:  # latency: lower is better
        if floor >= limit:
            return f"NOT MET; target UNDER the floor ({floor:.2f}{unit})"
        return f"NOT MET; the floor ({floor:.2f}{unit}) leaves {(limit - floor) * unit_us:.0f} us"
    if floor <= limit:  # throughput: higher is better
        return f"NOT MET; target ABOVE the ceiling ({floor:.2f}{unit})"
    return f"NOT MET; the ceiling ({floor:.2f}{unit}) is above it"


def run_sqlite(root: str, size: int, group: int, duration: float) -> float:
    """SQLite (stdlib), WAL mode, ``synchronous=FULL``, one transaction (one durable commit)
    per ``group`` rows of ``size`` bytes, for ``duration`` s. Rows/s."""
    path = os.path.join(root, f"sqlite-{size}-{group}-{os.getpid()}.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE log(id INTEGER PRIMARY KEY, payload BLOB)")
    payload = os.urandom(size)
    rows = [(payload,)] * group
    count = 0
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < duration:
            if group == 1:
                db.execute("INSERT INTO log(payload) VALUES (?)", rows[0])
            else:
                db.execute("BEGIN")
                db.executemany("INSERT INTO log(payload) VALUES (?)", rows)
                db.execute("COMMIT")
            count += group
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
    return count / (time.perf_counter() - start)


def cpu_probe(records: int = 100_000) -> float:
    """ns per record of the ceiling's framing loop with no I/O: a fixed piece of Python work,
    timed in each round. A pybk run is CPU-bound, the ceiling mostly fsync-bound, so when the
    (shared, virtual) host's CPU slows, pybk's ratio to the ceiling falls with the host, not
    the code; this figure says how fast the CPU was."""
    payload = bytes(100)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        frame_records(payload, records)
        best = min(best, time.perf_counter() - t0)
    return best / records * 1e9


def loops_to_run(choice: str) -> list[str]:
    """``--loop`` of a benchmark: ``asyncio``, ``uvloop`` or ``both`` (every loop installed)."""
    if choice == "both":
        return available_loops()
    return [choice]


def run_on(loop: str, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a new event loop of kind ``loop`` (``pybk.runtime.eventloop``)."""
    return run(coro, loop)


def bookie_appender(bookie: Any, ledger_id: int, size: int, *, batched: bool = False
                    ) -> Callable[[], asyncio.Future[None]]:
    """``append()`` adding the next entry of ``ledger_id`` to ``bookie`` directly, without the
    client, framed as the client frames them (CRC32C digest): the same bookie without the
    client in front.

    ``batched=False``: one ``Bookie.add_entry`` per append (the single-add callback path).
    ``batched=True`` (a bookie with ``add_batch``): the appends made in one pass of the loop
    go as one ``Bookie.add_batch``, as a batching client sends them, so a client that batches
    is compared with the bookie driven the same way."""
    dm = DigestManager(ledger_id)
    key = master_key(b"")
    payload = os.urandom(size)
    next_id = 0
    if not batched:
        add = bookie.add_entry

        def append() -> asyncio.Future[None]:
            nonlocal next_id
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def on_done(error: BaseException | None) -> None:
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(None)

            body = dm.frame(next_id, next_id - 1, 0, payload)
            add(ledger_id, next_id, key, body, on_done)
            next_id += 1
            return fut

        return append

    add_batch = bookie.add_batch
    ids: list[int] = []
    bodies: list[bytes] = []
    futs: list[asyncio.Future[None]] = []

    def flush() -> None:
        nonlocal ids, bodies, futs
        batch_futs = futs
        send_ids, send_bodies = ids, bodies
        ids, bodies, futs = [], [], []

        def on_done(outcome: Any) -> None:
            for i, fut in enumerate(batch_futs):
                error = outcome[i] if isinstance(outcome, list | tuple) else outcome
                if error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(None)

        add_batch(ledger_id, send_ids, send_bodies, key, on_done)

    def append_batched() -> asyncio.Future[None]:
        nonlocal next_id
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if not futs:
            loop.call_soon(flush)
        ids.append(next_id)
        bodies.append(dm.frame(next_id, next_id - 1, 0, payload))
        futs.append(fut)
        next_id += 1
        return fut

    return append_batched


def config_diff(a: Any, b: Any) -> list[str]:
    """The fields of two dataclass configs that differ, as ``name: a vs b``."""
    out = []
    for f in fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name, None)
        if va != vb:
            out.append(f"{f.name}: {va!r} vs {vb!r}")
    return out


def server_settings(preallocate: bool = True) -> Any:
    """The ``BookieConfig`` of a ``pybk bookie`` process (the same object it builds)."""
    from pybk.server.process import process_bookie_config

    return process_bookie_config(preallocate=preallocate)


@contextlib.asynccontextmanager
async def tcp_bookies(root: Path, count: int = 3, *, loop: str = "asyncio",
                      extra_args: Sequence[str] = ()) -> AsyncIterator[str]:
    """``count`` ``pybk bookie`` processes on loopback (free ports, SQLite metadata under
    ``root``), each on event loop ``loop``; yields the metadata URI; stops them by PID."""
    from pybk.server.processes import spawn_bookie, wait_ready

    metadata = f"sqlite://{root / 'metadata.db'}"
    args = ["--loop", loop, *extra_args]
    procs = [spawn_bookie(root, f"bookie-{i + 1}", metadata, extra_args=args)
             for i in range(count)]
    try:
        for i, p in enumerate(procs):
            await asyncio.to_thread(wait_ready, root, f"bookie-{i + 1}", p, 60.0)
        yield metadata
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.to_thread(p.wait, 30)
            except Exception:
                p.kill()
                p.wait()


async def ledger_run(client: Any, quorum: tuple[int, int, int], size: int, inflight: int,
                     duration: float, warmup: float = 0.2) -> Run:
    """A new ledger with ``quorum`` (E, Qw, Qa); ``warmup`` s of appends (connections,
    caches), then ``duration`` s with ``inflight`` appends of ``size`` bytes outstanding
    (``LedgerHandle.append``, the public API); the ledger is closed."""
    lh = await client.create_ledger(*quorum)
    payload = os.urandom(size)
    append = lh.append
    try:
        if warmup > 0:
            await closed_loop(lambda: append(payload), inflight, warmup)
        return await closed_loop(lambda: append(payload), inflight, duration)
    finally:
        await lh.close()
