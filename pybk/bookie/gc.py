"""The bookie's garbage collector: deleted ledgers' space comes back without anyone asking.

A :class:`GarbageCollector` runs on the bookie's event loop, driven by loop time (the
simulator runs it like any other timer). Every ``gc_interval`` it deletes the bookie's
ledgers the metadata no longer has (each read twice, the second time right before the
deletion, rule R8; never on a failed or damaged answer, nor a ledger first seen less than
``gc_min_ledger_age`` ago), then compacts: wholly dead segments every run, minor and major
compaction by threshold and interval, rewrites paced at ``gc_compaction_rate`` bytes/s.
Disk pressure runs it at once. The steps and the defaults' reasons: docs/internals.md
("pybk/bookie/gc.py") and docs/operations.md ("Space").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from pybk.errors import NoSuchLedgerError
from pybk.runtime.eventloop import gather, within

if TYPE_CHECKING:
    from pybk.bookie.bookie import Bookie
    from pybk.metadata.base import LedgerMetadata

__all__ = ["GC_IGNORES_MIN_AGE", "GarbageCollector", "GcResult", "GcStats", "ReadsLedgers",
           "metadata_liveness"]

log = logging.getLogger(__name__)

#: disk pressure starts a run at most once per disk check (``disk_check_interval``), or this
#: often (seconds, loop time) when the disk has no timer: a disk full of live data must not
#: have the bookie compacting without pause
PRESSURE_RUN_GAP = 10.0

#: the threshold that picks only segments with no live byte (live < DEAD_ONLY x size)
DEAD_ONLY = 1e-12

#: mutation switch (a name in ``BookieConfig.mutations``): the collector considers ledgers
#: however recently it first saw them, so a metadata replica that has not yet learned of a
#: new ledger gets its data deleted
GC_IGNORES_MIN_AGE: Final = "gc_ignores_min_age"

#: ``is_live(ledger_id)``: True unless the metadata definitely no longer has the ledger
IsLive = Callable[[int], Awaitable[bool]]


class ReadsLedgers(Protocol):
    """What the liveness check reads: a metadata store, or a view of one."""

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata: ...


def metadata_liveness(store: ReadsLedgers) -> IsLive:
    """``is_live`` over a metadata store: only a definite NoSuchLedgerError says "gone";
    any other failure (unreachable, timed out, damaged metadata) says "live" (rule R8)."""

    async def is_live(ledger_id: int) -> bool:
        try:
            await store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return False
        except Exception as exc:  # transient or damaged: never a reason to delete
            log.info("gc: ledger %d kept, its metadata could not be read: %s", ledger_id, exc)
            return True
        return True

    return is_live


@dataclass
class GcResult:
    """What one collection did."""

    ledgers_removed: list[int] = field(default_factory=list)
    segments_compacted: list[int] = field(default_factory=list)
    bytes_reclaimed: int = 0
    entries_moved: int = 0
    compaction: str = ""  # "", "dead" (wholly dead segments only), "minor" or "major"
    skipped: str = ""  # why the collection step did not run ("" when it did)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"ledgers_removed": list(self.ledgers_removed),
                "segments_compacted": list(self.segments_compacted),
                "bytes_reclaimed": self.bytes_reclaimed, "entries_moved": self.entries_moved,
                "compaction": self.compaction, "skipped": self.skipped,
                "seconds": round(self.seconds, 6)}


@dataclass
class GcStats:
    """Totals since the bookie started (exported as metrics, answered as the status)."""

    runs: int = 0
    forced_runs: int = 0
    pressure_runs: int = 0
    failed_runs: int = 0
    skipped_runs: int = 0
    ledgers_removed: int = 0
    bytes_reclaimed: int = 0
    entries_moved: int = 0
    segments_compacted: int = 0
    minor_compactions: int = 0
    major_compactions: int = 0
    seconds: float = 0.0
    running: bool = False
    compacting: str = ""  # "minor" / "major" while a compaction runs
    last_run_at: float | None = None  # loop time the last run ended
    last_minor_at: float | None = None
    last_major_at: float | None = None
    last_result: GcResult | None = None


class GarbageCollector:
    """One bookie's collector (see the module docstring). ``start()`` arms its timer;
    ``run(force=...)`` is the same run, now (the CLI, the admin API and HTTP call it)."""

    def __init__(self, bookie: Bookie, is_live: IsLive,
                 list_ledgers: Callable[[], Awaitable[list[int]]]) -> None:
        self.bookie = bookie
        self.config = bookie.config
        self.is_live = is_live
        self.list_ledgers = list_ledgers
        self.stats = GcStats()
        self._ignores_min_age = GC_IGNORES_MIN_AGE in self.config.mutations
        #: told ``(ledger_id)`` right before a collected ledger is deleted (the simulator
        #: checks each against the metadata's history)
        self.on_collect: Callable[[int], None] | None = None
        #: awaited after every run (pybk.bookie.gcremote publishes the status)
        self.after_run: Callable[[], Awaitable[None]] | None = None
        self._first_seen: dict[int, float] = {}
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._started_at = 0.0
        self._stopping = asyncio.Event()

    # -- scheduling ----------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._started_at = loop.time()
        self.stats.last_minor_at = self.stats.last_major_at = self._started_at
        self._note_ledgers(self._started_at)
        if self.config.gc_interval > 0:
            self._arm(self.config.gc_interval)

    def stop(self) -> None:
        """No more runs; a run under way stops pacing (see :meth:`drain`)."""
        self._stopping.set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def drain(self) -> None:
        """Wait for a scheduled run under way to end (a clean stop lets a compaction finish
        its steps rather than cancel it between two; it no longer pauses for its pace)."""
        self.stop()
        task, self._task = self._task, None
        if task is not None:
            await gather(task, return_exceptions=True)

    def abandon(self) -> None:
        """Crash: cancel a run under way (its steps are crash-safe on disk)."""
        self.stop()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _pace(self, nbytes: int) -> None:
        """Compaction's throttle: ``nbytes`` at ``gc_compaction_rate``, cut short by a stop."""
        rate = self.config.gc_compaction_rate
        if rate > 0 and not self._stopping.is_set():
            try:
                await within(self._stopping.wait(), nbytes / rate)
            except TimeoutError:
                pass

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._scheduled())
            self._task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("bookie %s: garbage collection failed: %s", self.bookie.bookie_id,
                        task.exception())

    async def _scheduled(self) -> None:
        try:
            await self.run(pressure=self.under_pressure())
        finally:
            if (self.bookie.store is not None and self.config.gc_interval > 0
                    and not self._stopping.is_set()):
                self._arm(self.config.gc_interval)

    def disk_pressure(self) -> None:
        """The disk check saw pressure: run now, unless a run is under way or one ended less
        than a disk check ago (:data:`PRESSURE_RUN_GAP`)."""
        last = self.stats.last_run_at
        gap = self.config.disk_check_interval
        gap = gap if gap > 0 else PRESSURE_RUN_GAP
        if last is not None and asyncio.get_running_loop().time() - last < gap:
            return
        if (self._task is None or self._task.done()) and not self._stopping.is_set():
            self._fire()

    def under_pressure(self) -> bool:
        """The disk is at ``gc_disk_pressure`` or more, or the bookie is read-only for it."""
        if self.bookie.disk_full:
            return True
        try:
            free, total = self.bookie.disk_usage()
        except OSError:
            return False
        return total > 0 and 1.0 - free / total >= self.config.gc_disk_pressure

    # -- one run -------------------------------------------------------------------------

    async def run(self, *, force: bool = False, pressure: bool = False) -> GcResult:
        """Collect, then compact what is due (``force``: minor and major compaction both;
        ``pressure``: major, at once). One run at a time: a second caller waits its turn."""
        result = await self._run(force, pressure)
        if self.after_run is not None:
            await self.after_run()
        return result

    async def _run(self, force: bool, pressure: bool) -> GcResult:
        async with self._lock:
            loop = asyncio.get_running_loop()
            began = loop.time()
            st = self.stats
            st.running = True
            result = GcResult()
            try:
                await self._collect(result, began)
                await self._compact(result, began, force=force, pressure=pressure)
            except BaseException:
                st.failed_runs += 1
                raise
            finally:
                st.running = False
                result.seconds = loop.time() - began
                st.seconds += result.seconds
                st.last_run_at = loop.time()
            st.runs += 1
            st.forced_runs += force
            st.pressure_runs += pressure
            st.skipped_runs += bool(result.skipped)
            st.ledgers_removed += len(result.ledgers_removed)
            st.bytes_reclaimed += result.bytes_reclaimed
            st.entries_moved += result.entries_moved
            st.segments_compacted += len(result.segments_compacted)
            st.last_result = result
            if result.ledgers_removed or result.segments_compacted:
                log.info("bookie %s: gc removed %d ledgers, compacted %d segments "
                         "(%d bytes back, %d entries moved)", self.bookie.bookie_id,
                         len(result.ledgers_removed), len(result.segments_compacted),
                         result.bytes_reclaimed, result.entries_moved)
            self.bookie.check_disk()  # back to writable once below the low-water mark
            return result

    def _note_ledgers(self, now: float) -> list[int]:
        """The bookie's ledgers now; those not seen before are stamped ``now``."""
        store = self.bookie.store
        ids = store.ledger_ids() if store is not None else []
        seen = self._first_seen
        for lid in ids:
            seen.setdefault(lid, now)
        if len(seen) > 2 * len(ids) + 64:  # forget deleted ones
            keep = set(ids)
            self._first_seen = {k: v for k, v in seen.items() if k in keep}
        return ids

    async def _collect(self, result: GcResult, now: float) -> None:
        if self.bookie.journal_failed:
            result.skipped = "the journal failed: nothing is written until a restart"
            return
        min_age = 0.0 if self._ignores_min_age else self.config.gc_min_ledger_age
        local = [lid for lid in self._note_ledgers(now)
                 if now - self._first_seen[lid] >= min_age]
        if not local:
            return
        try:
            listed = set(await self.list_ledgers())
        except Exception as exc:  # transient: nothing is collected on it
            result.skipped = f"listing the metadata's ledgers failed: {exc}"
            log.info("bookie %s: gc skipped: %s", self.bookie.bookie_id, result.skipped)
            return
        candidates = [lid for lid in local if lid not in listed]
        for lid in candidates:
            if self._stopping.is_set():
                return
            if await self.is_live(lid) or await self.is_live(lid):  # rule R8: twice
                continue
            store = self.bookie.store
            if store is None:
                return
            if self.on_collect is not None:
                self.on_collect(lid)
            await store.delete_ledger(lid)
            result.ledgers_removed.append(lid)

    async def _compact(self, result: GcResult, now: float, *, force: bool,
                       pressure: bool) -> None:
        cfg, st = self.config, self.stats
        if self.bookie.journal_failed or self.bookie.store is None:
            return
        major_due = st.last_major_at is None or now - st.last_major_at >= cfg.gc_major_interval
        minor_due = st.last_minor_at is None or now - st.last_minor_at >= cfg.gc_minor_interval
        if force or pressure or (major_due and cfg.gc_major_interval > 0):
            kind, threshold = "major", cfg.gc_major_threshold
        elif minor_due and cfg.gc_minor_interval > 0:
            kind, threshold = "minor", cfg.gc_minor_threshold
        elif any(live == 0 for live, _ in self.bookie.store.segment_usage().values()):
            # wholly dead segments go on every run: nothing to rewrite, only files to drop
            kind, threshold = "dead", DEAD_ONLY
        else:
            return
        st.compacting = kind
        try:
            res = await self.bookie.store.compact(
                threshold, pace=None if pressure else self._pace)
        finally:
            st.compacting = ""
        result.compaction = kind
        result.segments_compacted = list(res.segments_compacted)
        result.bytes_reclaimed += res.bytes_freed
        result.entries_moved += res.entries_moved
        if kind == "dead":
            return
        # a major compaction does a minor's work too
        st.last_minor_at = now
        st.minor_compactions += 1
        if kind == "major":
            st.last_major_at = now
            st.major_compactions += 1

    # -- status --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The status (BookKeeper's gc_details names plus ours); times are seconds ago."""
        st = self.stats
        now = asyncio.get_running_loop().time()

        def ago(t: float | None) -> float | None:
            return None if t is None else round(now - t, 3)

        last = st.last_result
        return {
            "bookie": self.bookie.bookie_id,
            "running": st.running,
            "forceCompacting": st.running and st.forced_runs > 0,
            "majorCompacting": st.compacting == "major",
            "minorCompacting": st.compacting == "minor",
            "runs": st.runs, "failed_runs": st.failed_runs, "skipped_runs": st.skipped_runs,
            "pressure_runs": st.pressure_runs,
            "ledgers_removed": st.ledgers_removed, "bytes_reclaimed": st.bytes_reclaimed,
            "entries_moved": st.entries_moved, "seconds": round(st.seconds, 6),
            "majorCompactionCounter": st.major_compactions,
            "minorCompactionCounter": st.minor_compactions,
            "last_run_ago": ago(st.last_run_at),
            "lastMajorCompactionAgo": ago(st.last_major_at),
            "lastMinorCompactionAgo": ago(st.last_minor_at),
            "last_run": None if last is None else last.as_dict(),
            "interval": self.config.gc_interval,
            "next_run_in": (None if self._timer is None
                            else round(max(0.0, self._timer.when() - now), 3)),
        }
