"""Prometheus collector of bookies' metrics (``pybk bookie``'s ``/metrics``, LocalCluster's
``metrics=`` registry)."""

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

from pybk.stats import BookieStats, Histogram

__all__ = ["BookieCollector"]

_STATES = ("writable", "read-only", "stopped")


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
        gc_counters = {name: CounterMetricFamily(f"pybk_{name}", doc, labels=["bookie"])
                       for name, doc, _ in _GC_COUNTERS}
        gc_running = GaugeMetricFamily("pybk_bookie_gc_running",
                                       "1 while the garbage collector runs", labels=["bookie"])
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
            gc = getattr(bookie, "gc", None)
            if gc is not None:  # (kept by the collector itself: no BookieStats needed)
                for name, _, attr in _GC_COUNTERS:
                    gc_counters[name].add_metric(bid, getattr(gc.stats, attr))
                gc_running.add_metric(bid, 1.0 if gc.stats.running else 0.0)
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
        yield from gc_counters.values()
        yield gc_running


#: the garbage collector's: (metric name after ``pybk_``, help, GcStats attribute)
_GC_COUNTERS = (
    ("bookie_gc_runs", "Garbage collector runs", "runs"),
    ("bookie_gc_failed_runs", "Garbage collector runs that failed", "failed_runs"),
    ("bookie_gc_ledgers_removed", "Ledgers the garbage collector deleted", "ledgers_removed"),
    ("bookie_gc_reclaimed_bytes", "Journal bytes compaction gave back", "bytes_reclaimed"),
    ("bookie_gc_entries_moved", "Live entries compaction re-appended", "entries_moved"),
    ("bookie_gc_seconds", "Time the garbage collector spent (loop time)", "seconds"),
)

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


