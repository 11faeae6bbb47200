"""Prometheus collector of auto-recovery's metrics (the auditor's findings, the workers'
copies)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pybk.ops.config import AutoRecoveryStats

__all__ = ["AutoRecoveryCollector"]


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
