"""Prometheus collector of a client's metrics (``Client(metrics=registry)``)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from pybk.runtime.prometheus import counter, histogram_family
from pybk.stats import ClientStats

__all__ = ["ClientCollector"]


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
            ("add_requests", "Add requests sent to bookies (one per bookie and batch)",
             s.add_requests),
            ("lac_messages", "Explicit LAC messages sent to bookies (one per bookie told)",
             s.lac_messages),
        ):
            yield counter(f"pybk_client_{name}", doc, value)
        yield histogram_family("pybk_client_add_latency_seconds",
                               "Append to acknowledgement (Qa durable, in order)",
                               s.add_latency)
        yield histogram_family("pybk_client_read_latency_seconds", "Read calls",
                               s.read_latency)
        yield histogram_family("pybk_client_recovery_latency_seconds", "Ledger recoveries",
                               s.recovery_latency)


