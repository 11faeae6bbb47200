"""Prometheus exposition of what the bookie, the client and auto-recovery record.

Collectors (``prometheus_client`` custom collectors) read the plain stats objects of
:mod:`pybk.stats` and :class:`~pybk.ops.config.AutoRecoveryStats` when scraped, plus a few
gauges taken live from the objects themselves (a bookie's state, disk usage, journal queue,
parked long polls). Recording stays a field increment on the hot path; the cost of building
metric families is paid per scrape. Names are ``pybk_<component>_<what>`` with units in the
name (``_seconds``, ``_bytes``), counters ending in ``_total``.

Register them in any ``CollectorRegistry``: ``pybk bookie`` registers a bookie's (and its
auto-recovery's) in the registry its ``/metrics`` endpoint serves; ``Client(metrics=reg)``
registers the client's in ``reg``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pybk.ops.config import AutoRecoveryStats
from pybk.stats import BookieStats, ClientStats, Histogram

__all__ = ["AutoRecoveryCollector", "BookieCollector", "ClientCollector", "histogram_family"]

_STATES = ("writable", "read-only", "stopped")


def histogram_family(name: str, doc: str, hist: Histogram,
                     labels: dict[str, str] | None = None) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), hist.cumulative(), hist.sum)
    return family


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class BookieCollector(Collector):
    """Bookies' metrics: requests, latency, journal batches and fsyncs, queue depth, state,
    disk usage, parked long polls, ledgers held; one sample per bookie (label ``bookie``).

    ``bookies()`` returns the :class:`pybk.bookie.Bookie` objects to report (called per
    scrape: restarted bookies are new objects); a bookie whose ``stats`` is None reports
    only the live gauges."""

    def __init__(self, bookies: Callable[[], Iterable[Any]]) -> None:
        self.bookies = bookies

    def collect(self) -> Iterator[Metric]:
        bookies = sorted(self.bookies(), key=lambda b: b.bookie_id)
        gauges = {name: GaugeMetricFamily(name, doc, labels=["bookie"]) for name, doc in (
            ("pybk_bookie_writable", "1 while the bookie accepts adds"),
            ("pybk_bookie_disk_free_bytes", "Free bytes on the data directory's disk"),
            ("pybk_bookie_disk_total_bytes", "Size of the data directory's disk"),
            ("pybk_bookie_long_polls_waiting", "Long-poll reads parked now"),
            ("pybk_journal_queue_records", "Records waiting for the next journal batch"),
            ("pybk_journal_queue_bytes", "Bytes waiting for the next journal batch"),
            ("pybk_bookie_ledgers", "Ledgers this bookie holds"),
        )}
        state = GaugeMetricFamily("pybk_bookie_state", "1 for the bookie's current state",
                                  labels=["bookie", "state"])
        counters = {name: CounterMetricFamily(f"pybk_{name}", doc, labels=["bookie"])
                    for name, doc, _ in _BOOKIE_COUNTERS}
        histograms = {name: HistogramMetricFamily(f"pybk_{name}", doc, labels=["bookie"])
                      for name, doc, _ in _BOOKIE_HISTOGRAMS}
        for bookie in bookies:
            bid = [bookie.bookie_id]
            for name in _STATES:
                state.add_metric([*bid, name], 1.0 if bookie.state == name else 0.0)
            gauges["pybk_bookie_writable"].add_metric(
                bid, 1.0 if bookie.state == "writable" else 0.0)
            try:
                free, total = bookie.disk_usage()
            except OSError:
                free = total = -1
            gauges["pybk_bookie_disk_free_bytes"].add_metric(bid, free)
            gauges["pybk_bookie_disk_total_bytes"].add_metric(bid, total)
            gauges["pybk_bookie_long_polls_waiting"].add_metric(bid, len(bookie._polls))
            store = bookie.store
            if store is not None:
                records, nbytes = store.journal.backlog
                gauges["pybk_journal_queue_records"].add_metric(bid, records)
                gauges["pybk_journal_queue_bytes"].add_metric(bid, nbytes)
                gauges["pybk_bookie_ledgers"].add_metric(bid, len(store.ledger_ids()))
            stats: BookieStats | None = bookie.stats
            if stats is None:
                continue
            for name, _, attr in _BOOKIE_COUNTERS:
                counters[name].add_metric(bid, getattr(stats, attr))
            for name, _, attr in _BOOKIE_HISTOGRAMS:
                hist: Histogram = getattr(stats, attr)
                histograms[name].add_metric(bid, hist.cumulative(), hist.sum)
        yield state
        yield from gauges.values()
        yield from counters.values()
        yield from histograms.values()


#: (metric name after ``pybk_``, help, BookieStats attribute)
_BOOKIE_COUNTERS = (
    ("bookie_adds", "Adds stored (acknowledged)", "adds"),
    ("bookie_add_bytes", "Bytes of adds stored", "add_bytes"),
    ("bookie_add_errors", "Adds refused or failed", "add_errors"),
    ("bookie_recovery_adds", "Recovery adds stored (recovery, re-replication)",
     "recovery_adds"),
    ("bookie_reads", "Entry reads answered", "reads"),
    ("bookie_read_bytes", "Bytes of entries read", "read_bytes"),
    ("bookie_read_errors", "Entry reads that failed (absent entries included)", "read_errors"),
    ("bookie_long_polls", "Long-poll reads answered", "long_polls"),
    ("bookie_fences", "Fencing requests", "fences"),
    ("journal_batches", "Journal batches written and synced", "journal_batches"),
)
_BOOKIE_HISTOGRAMS = (
    ("bookie_add_latency_seconds", "Add requests, arrival to answer (fsync included)",
     "add_latency"),
    ("bookie_read_latency_seconds", "Entry reads", "read_latency"),
    ("journal_batch_records", "Records per journal batch", "journal_batch_records"),
    ("journal_batch_bytes", "Bytes per journal batch", "journal_batch_bytes"),
    ("journal_sync_latency_seconds", "Journal fsync (fdatasync) latency",
     "journal_sync_latency"),
)


def _gauge(name: str, doc: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _labelled_counter(name: str, doc: str, labels: dict[str, str],
                      value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


class ClientCollector(Collector):
    """A client's metrics (``Client(metrics=registry)``)."""

    def __init__(self, stats: ClientStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        for name, doc, value in (
            ("adds", "Appends acknowledged (one per append / append_many call)", s.adds),
            ("add_errors", "Appends that failed", s.add_errors),
            ("reads", "Reads (one per read call)", s.reads),
            ("read_entries", "Entries read", s.read_entries),
            ("read_errors", "Reads that failed", s.read_errors),
            ("ensemble_changes", "Ensemble changes made by writers", s.ensemble_changes),
            ("recoveries", "Ledger recoveries completed", s.recoveries),
            ("recovery_errors", "Ledger recoveries that failed", s.recovery_errors),
            ("speculative_reads", "Reads sent to another replica because one was slow",
             s.speculative_reads),
            ("ledgers_created", "Ledgers created", s.ledgers_created),
        ):
            yield _counter(f"pybk_client_{name}", doc, value)
        yield histogram_family("pybk_client_add_latency_seconds",
                               "Append to acknowledgement (Qa durable, in order)",
                               s.add_latency)
        yield histogram_family("pybk_client_read_latency_seconds", "Read calls",
                               s.read_latency)
        yield histogram_family("pybk_client_recovery_latency_seconds", "Ledger recoveries",
                               s.recovery_latency)


class AutoRecoveryCollector(Collector):
    """Auto-recovery's metrics: what the auditor found, what the workers copied; one sample
    per instance (label ``instance``). ``instances()`` returns (name, stats) pairs."""

    def __init__(self, instances: Callable[[], Iterable[tuple[str, AutoRecoveryStats]]]) -> None:
        self.instances = instances

    def collect(self) -> Iterator[Metric]:
        under = GaugeMetricFamily("pybk_autorecovery_under_replicated_ledgers",
                                  "Ledgers marked under-replicated, as last counted",
                                  labels=["instance"])
        leading = GaugeMetricFamily("pybk_autorecovery_auditor",
                                    "1 while this instance is the auditor", labels=["instance"])
        counters = {attr: CounterMetricFamily(f"pybk_autorecovery_{name}", doc,
                                              labels=["instance"])
                    for name, doc, attr in _RECOVERY_COUNTERS}
        durations = GaugeMetricFamily("pybk_autorecovery_check_seconds",
                                      "Duration of the last check", labels=["instance", "check"])
        for name, stats in sorted(self.instances(), key=lambda pair: pair[0]):
            under.add_metric([name], stats.under_replicated)
            leading.add_metric([name], 1.0 if stats.leading else 0.0)
            for attr, family in counters.items():
                family.add_metric([name], getattr(stats, attr))
            for check, seconds in sorted(stats.durations.items()):
                durations.add_metric([name, check], seconds)
        yield under
        yield leading
        yield from counters.values()
        yield durations


_RECOVERY_COUNTERS = (
    ("audits", "Bookie checks run as the auditor", "bookie_checks"),
    ("ledger_checks", "Checks of every ledger's replicas", "ledger_checks"),
    ("ledgers_marked", "Marks added as the auditor", "ledgers_marked"),
    ("ledgers_repaired", "Marked ledgers repaired (or found clean or deleted)",
     "ledgers_repaired"),
    ("repairs_failed", "Repairs that failed (retried after a backoff)", "repairs_failed"),
    ("repairs_deferred", "Repairs deferred for an open ledger's grace period",
     "repairs_deferred"),
    ("entries_copied", "Entries copied by re-replication", "entries_copied"),
    ("bytes_copied", "Bytes copied by re-replication", "bytes_copied"),
    ("slots_replaced", "Ensemble slots moved to another bookie", "slots_replaced"),
)
