"""Tiered storage as an operations service: offloads what each log's triggers say is due, and
deletes the bookies' copies once the deletion lag has passed, for the logs of some namespaces,
whether or not a writer holds them; with per-log progress and Prometheus metrics.

A log's writer offloads its own log on its housekeeping rounds; a log nobody writes to (the
usual fate of an old log) has no such rounds, so its closed segments would stay on the bookies
for good. Pulsar's broker offloads topics it owns; pybk has no broker, so this service plays
that part: ``pybk log offload-service`` runs one. Beside a live writer it defers: a segment
whose offload another offloader started recently is left to it, so two offloaders never
keep replacing each other's attempts; attempts are recorded by compare-and-set either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pybk.errors import BKError
from pybk.logs.meta import BOOKIES, BOTH, COMPLETED
from pybk.logs.tier_access import TierOpener

__all__ = ["LogOffloadStats", "OffloadCollector", "OffloadService"]

log = logging.getLogger(__name__)


@dataclass
class LogOffloadStats:
    """What the service did for one log, and what it found at its last look."""

    #: segments offloaded (verified and recorded complete)
    offloaded_segments: int = 0
    #: rounds in which this log's offload or housekeeping failed (tried again next round)
    failures: int = 0
    #: completed segments only on the bookies, and segments in both tiers (their bookie
    #: copies waiting for the deletion lag), at the last look
    bookies_only: int = 0
    both_tiers: int = 0
    #: wall-clock time of the last segment offloaded (None: none yet)
    last_offload: float | None = None
    last_error: str | None = None


class OffloadService:
    """Offloads the logs of ``namespaces`` of ``client`` every ``interval`` seconds (see the
    module docstring). ``run_once()`` is one round; ``run()`` goes on until cancelled.
    ``clock`` is the wall clock the logs' ages and deletion lags are judged by; ``tiers``
    opens the logs' tiers (``client.namespace(tiers=)``; None: fsspec). A segment whose
    offload someone else (the log's writer) started less than ``take_over_after`` seconds
    ago is left to them: the service never preempts a live offloader, and takes over an
    abandoned attempt after that long."""

    def __init__(self, client: Any, namespaces: Sequence[str], *, interval: float = 60.0,
                 clock: Callable[[], float] = time.time,
                 tiers: TierOpener | None = None, take_over_after: float = 600.0) -> None:
        if not namespaces:
            raise ValueError("give at least one namespace")
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, not {interval!r}")
        self.client = client
        self.namespaces = list(namespaces)
        self.interval = interval
        self.clock = clock
        self.tiers = tiers
        self.take_over_after = take_over_after
        #: (namespace, log) -> its stats
        self.logs: dict[tuple[str, str], LogOffloadStats] = {}
        self.rounds = 0
        self.round_seconds = 0.0

    async def run(self) -> None:
        """A round every ``interval`` seconds until cancelled (a failed round is logged)."""
        while True:
            try:
                await self.run_once()
            except (BKError, OSError, TimeoutError) as exc:
                log.warning("offload round failed (%s: %s); next in %.1f s",
                            type(exc).__name__, exc, self.interval)
            await asyncio.sleep(self.interval)

    async def run_once(self) -> int:
        """One round over every log of the namespaces; the segments offloaded."""
        began = asyncio.get_running_loop().time()
        total = 0
        for ns_name in self.namespaces:
            ns = self.client.namespace(ns_name, clock=self.clock, tiers=self.tiers)
            for name in await ns.list_logs():
                total += await self._one(ns, ns_name, name)
        self.rounds += 1
        self.round_seconds = asyncio.get_running_loop().time() - began
        return total

    async def _one(self, ns: Any, ns_name: str, name: str) -> int:
        stats = self.logs.setdefault((ns_name, name), LogOffloadStats())
        done: list[int] = []
        try:
            lg = await ns.open_log(name)
            md = await lg.metadata()
            if md.config.offload_url is None:
                self._count(stats, md)
                return 0
            due = await lg.offload_due()
            if due is not None:
                done = await lg.offload(due, take_over_after=self.take_over_after)
            md = await lg.metadata()
            if any(s.tier == BOTH for s in md.live_segments):
                await lg.apply_retention()  # (the deletion lag; the log's retention too)
                md = await lg.metadata()
            self._count(stats, md)
        except (BKError, OSError, TimeoutError, ValueError) as exc:
            stats.failures += 1
            stats.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("offload of log %s/%s failed (%s); tried again next round",
                        ns_name, name, stats.last_error)
        if done:
            stats.offloaded_segments += len(done)
            stats.last_offload = self.clock()
            log.info("log %s/%s: segments %s offloaded", ns_name, name, done)
        return len(done)

    def _count(self, stats: LogOffloadStats, md: Any) -> None:
        live = md.live_segments
        stats.bookies_only = sum(1 for s in live if s.state == COMPLETED
                                 and s.last_entry >= 0 and s.tier == BOOKIES)
        stats.both_tiers = sum(1 for s in live if s.tier == BOTH)

    def progress(self) -> dict[str, dict[str, Any]]:
        """Per log (``namespace/log``): its stats as a dict (for logs and status pages)."""
        return {f"{ns}/{name}": vars(st).copy() for (ns, name), st in sorted(self.logs.items())}


class OffloadCollector(Collector):
    """The offload services' metrics, one sample per log (labels ``namespace``, ``log``)
    and per service (label ``instance``); ``instances()`` returns (name, service) pairs."""

    def __init__(self, instances: Callable[[], Iterable[tuple[str, OffloadService]]]) -> None:
        self.instances = instances

    def collect(self) -> Iterator[Metric]:
        labels = ["instance", "namespace", "log"]
        segments = CounterMetricFamily("pybk_offload_segments",
                                       "Segments offloaded by the service", labels=labels)
        failures = CounterMetricFamily("pybk_offload_failures",
                                       "Rounds in which a log's offload failed", labels=labels)
        pending = GaugeMetricFamily("pybk_offload_pending_segments",
                                    "Completed segments only on the bookies (last look)",
                                    labels=labels)
        both = GaugeMetricFamily("pybk_offload_both_tiers_segments",
                                 "Offloaded segments whose bookie copy waits for the deletion "
                                 "lag (last look)", labels=labels)
        last = GaugeMetricFamily("pybk_offload_last_success_timestamp_seconds",
                                 "When a segment of the log was last offloaded", labels=labels)
        rounds = CounterMetricFamily("pybk_offload_rounds", "Rounds done",
                                     labels=["instance"])
        took = GaugeMetricFamily("pybk_offload_round_seconds", "Duration of the last round",
                                 labels=["instance"])
        for inst, service in sorted(self.instances(), key=lambda pair: pair[0]):
            rounds.add_metric([inst], service.rounds)
            took.add_metric([inst], service.round_seconds)
            for (ns, name), st in sorted(service.logs.items()):
                key = [inst, ns, name]
                segments.add_metric(key, st.offloaded_segments)
                failures.add_metric(key, st.failures)
                pending.add_metric(key, st.bookies_only)
                both.add_metric(key, st.both_tiers)
                if st.last_offload is not None:
                    last.add_metric(key, st.last_offload)
        yield from (segments, failures, pending, both, last, rounds, took)
