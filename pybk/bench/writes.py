"""``pybk bench``'s measurement: appends to a fresh ledger, and the same-run ceiling beside it.

Like BookKeeper's ``bin/benchmark writes``: a ledger with the given quorums takes appends of
``size`` bytes for ``duration`` seconds (after ``warmup``), either ``inflight`` kept
outstanding (closed loop) or at a fixed ``rate`` (open loop, latency from when each append was
due); then, on the same disk when the cluster is local (or on ``ceiling_dir``), the
single-file group-commit ceiling (:class:`pybk.bench.GroupCommitFile`, one CRC-framed record
per entry, one write + fdatasync per batch, the file treated as the bookies' segments are)
under the same load, and the latency of one small write + fdatasync. The ledger is deleted
afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pybk.bench.ceiling import GroupCommitFile, fsync_latencies
from pybk.bench.drive import Run, closed_loop, open_loop
from pybk.bench.stats import LatencySummary, percentile
from pybk.runtime.gctune import GcTuning

__all__ = ["WriteBench", "WriteReport", "run_write_bench"]


@dataclass
class WriteBench:
    """What to measure (``pybk bench``'s options)."""

    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    size: int = 100
    #: appends outstanding (closed loop); ignored when ``rate`` is set
    inflight: int = 1024
    #: appends per second (open loop), or None
    rate: float | None = None
    duration: float = 5.0
    warmup: float = 1.0
    #: measure the ceiling after pybk (local clusters: in their directory)
    ceiling: bool = True
    #: where a remote cluster's ceiling is measured (None: no ceiling for a remote cluster)
    ceiling_dir: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.ack_quorum <= self.write_quorum <= self.ensemble:
            raise ValueError("need 1 <= ack quorum <= write quorum <= ensemble, got "
                             f"{self.ensemble}/{self.write_quorum}/{self.ack_quorum}")
        if self.size < 1 or self.inflight < 1:
            raise ValueError(f"size and inflight must be >= 1, got {self.size}, {self.inflight}")
        if self.duration <= 0 or self.warmup < 0:
            raise ValueError(f"duration must be > 0 and warmup >= 0, got {self.duration}, "
                             f"{self.warmup}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")

    def load(self) -> str:
        if self.rate is not None:
            return f"open loop at {self.rate:,.0f} appends/s"
        return f"{self.inflight} in flight"


@dataclass
class WriteReport:
    """What was measured."""

    setup: str
    #: bytes per entry
    entry_size: int
    pybk: Run
    ceiling: Run | None = None
    #: what the ceiling's file was (appended / preallocated) and where
    ceiling_setup: str = ""
    #: records per fsync of the ceiling
    ceiling_group: float = 0.0
    #: p50 of one ``size``-byte write + fdatasync on the ceiling's disk (seconds)
    fsync_p50: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        """pybk's entries/s over the ceiling's, under the same load."""
        return self.pybk.rate / self.ceiling.rate if self.ceiling else None

    def as_dict(self) -> dict[str, Any]:
        def run(r: Run) -> dict[str, Any]:
            return {"entries": r.count, "seconds": r.elapsed, "entries_per_s": r.rate,
                    "latency_ms": LatencySummary.of(r.latencies).ms(),
                    **({"target_rate": r.target_rate, "behind": r.behind}
                       if not math.isnan(r.target_rate) else {})}

        return {"setup": self.setup, "entry_size": self.entry_size, "pybk": run(self.pybk),
                "ceiling": run(self.ceiling) if self.ceiling else None,
                "ceiling_setup": self.ceiling_setup or None,
                "ceiling_records_per_fsync": self.ceiling_group or None,
                "fsync_p50_ms": self.fsync_p50 * 1e3 if self.fsync_p50 is not None else None,
                "pybk_over_ceiling": self.ratio, "notes": self.notes}


async def _drive(append: Callable[[], asyncio.Future[Any]], spec: WriteBench) -> Run:
    if spec.warmup > 0:
        await closed_loop(append, min(spec.inflight, 64) if spec.rate else spec.inflight,
                          spec.warmup)
    if spec.rate is not None:
        return await open_loop(append, spec.rate, spec.duration)
    return await closed_loop(append, spec.inflight, spec.duration)


async def _ledger_run(client: Any, spec: WriteBench) -> Run:
    lh = await client.create_ledger(spec.ensemble, spec.write_quorum, spec.ack_quorum)
    payload = os.urandom(spec.size)
    append = lh.append
    try:
        return await _drive(lambda: append(payload), spec)
    finally:
        try:
            await lh.close()
        finally:
            await client.delete_ledger(lh.id)


async def _ceiling_run(directory: str, preallocate: bool, spec: WriteBench
                       ) -> tuple[Run, float, str]:
    path = os.path.join(directory, f"pybk-bench-ceiling-{os.getpid()}.log")
    log = GroupCommitFile(path, preallocate=preallocate)
    payload = os.urandom(spec.size)
    try:
        syncs, records = log.syncs, log.records
        run = await _drive(lambda: log.append(payload), spec)
        group = (log.records - records) / max(1, log.syncs - syncs)
        return run, group, log.file.describe()
    finally:
        await log.close()


GC_NOTE = ("garbage collector tuned as a bookie process tunes it (pybk.runtime.gctune: heap frozen "
           "after start-up, gen-0 threshold 50,000)")


@contextlib.asynccontextmanager
async def _local_cluster(root: str | None, bookies: int, bookie_config: Any, tune_gc: bool
                         ) -> AsyncIterator[tuple[Any, str]]:
    from pybk.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="pybk-bench-", dir=root) as tmp:
        async with LocalCluster(tmp, bookies, bookie_config=bookie_config,
                                tune_gc=tune_gc) as cluster:
            yield cluster.client(), tmp


async def run_write_bench(spec: WriteBench, *, client: Any = None, root: str | None = None,
                          bookies: int = 3, server_settings: bool = False,
                          sync_thread: bool = False, tune_gc: bool = False,
                          progress: Callable[[str], None] = lambda _msg: None) -> WriteReport:
    """Measure pybk, then the ceiling (see the module doc).

    With ``client`` (a started :class:`pybk.Client` of a remote cluster) the ledger goes
    there; without, an embedded :class:`pybk.LocalCluster` of ``bookies`` bookies is started
    in a temporary directory under ``root`` (None: the system's), with ``pybk bookie``'s
    settings when ``server_settings`` (preallocated segments, overlapped syncs), else
    LocalCluster's defaults, and removed afterwards; ``sync_thread``: its journals sync on a
    thread of this process instead of a helper process each (to compare; not with
    ``server_settings``, whose overlapped syncs need the helper). ``tune_gc``: this process's
    garbage collector as a bookie process sets it (:mod:`pybk.runtime.gctune`) for the
    measurement."""
    quorum = f"E{spec.ensemble}/Qw{spec.write_quorum}/Qa{spec.ack_quorum}"
    what = f"{quorum}, {spec.size} B entries, {spec.load()}, {spec.duration:g} s"
    if client is not None:
        progress("appending")
        tuning = GcTuning()
        if tune_gc:
            tuning.apply()
        try:
            report = WriteReport(f"remote cluster, {what}", spec.size,
                                 await _ledger_run(client, spec))
        finally:
            tuning.restore()
        directory, preallocate = spec.ceiling_dir, True
        if directory is None:
            report.notes.append("no ceiling: the bookies' disks are not on this machine "
                                "(--ceiling-dir DIR measures one on a local disk)")
        else:
            report.notes.append(f"ceiling measured on this machine's {directory}, not on "
                                "the bookies' disks")
        if tune_gc:
            report.notes.append(GC_NOTE)
        return await _with_ceiling(report, directory, preallocate, spec, progress)
    from pybk.bookie import BookieConfig
    from pybk.server.process import process_bookie_config

    if sync_thread and server_settings:
        raise ValueError("overlapped syncs (server settings) need the sync helper process; "
                         "a sync thread is for LocalCluster's defaults")
    config = process_bookie_config() if server_settings else BookieConfig(
        journal_sync_process=not sync_thread)
    settings = ("pybk bookie's settings (preallocated segments, overlapped syncs)"
                if server_settings else "LocalCluster defaults (appended segments, " + (
                    "syncs on a thread of this process)" if sync_thread
                    else "syncs through a helper process per bookie)"))
    async with _local_cluster(root, bookies, config, tune_gc) as (local_client, directory):
        progress("appending")
        report = WriteReport(f"local cluster of {bookies} in-process bookies under "
                             f"{directory}, {settings}; {what}", spec.size,
                             await _ledger_run(local_client, spec))
        if tune_gc:
            report.notes.append(GC_NOTE)
        if spec.ceiling:
            await _with_ceiling(report, directory, config.journal_preallocate, spec, progress)
    return report


async def _with_ceiling(report: WriteReport, directory: str | None, preallocate: bool,
                        spec: WriteBench, progress: Callable[[str], None]) -> WriteReport:
    if directory is None or not spec.ceiling:
        return report
    progress("measuring the ceiling")
    report.ceiling, report.ceiling_group, how = await _ceiling_run(directory, preallocate, spec)
    report.ceiling_setup = (f"one asyncio writer task, CRC-framed records, one write + "
                            f"fdatasync per batch, file {how}, in {directory}")
    progress("measuring the fsync latency")
    lat = await asyncio.to_thread(
        fsync_latencies, os.path.join(directory, f"pybk-bench-fsync-{os.getpid()}.log"),
        spec.size, min(spec.duration, 1.0), preallocate=preallocate)
    report.fsync_p50 = percentile(lat, 0.5)
    return report
