"""Backlog quota metrics: what each log writer last found (pybk.logs.backlog), for
Prometheus. An application registers one collector over the writers it holds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pybk.logs.backlog import BacklogStats

__all__ = ["BacklogCollector"]


class BacklogCollector(Collector):
    """One sample per log (label ``log``): ``instances()`` returns (name, BacklogStats)
    pairs, e.g. ``[(w.name, w.backlog) for w in writers]``."""

    def __init__(self, instances: Callable[[], Iterable[tuple[str, BacklogStats]]]) -> None:
        self.instances = instances

    def collect(self) -> Iterator[Metric]:
        behind = GaugeMetricFamily("pybk_log_backlog_bytes",
                                   "Bytes the slowest durable cursor is behind (last check)",
                                   labels=["log"])
        age = GaugeMetricFamily("pybk_log_backlog_seconds",
                                "Age of the oldest record a durable cursor has not consumed "
                                "(segment granularity; last check)", labels=["log"])
        refusing = GaugeMetricFamily("pybk_log_backlog_refusing",
                                     "1 while the backlog quota refuses appends",
                                     labels=["log"])
        refused = CounterMetricFamily("pybk_log_backlog_refused_appends",
                                      "Appends refused by the backlog quota", labels=["log"])
        segments = CounterMetricFamily("pybk_log_backlog_evicted_segments",
                                       "Segments the backlog quota evicted", labels=["log"])
        nbytes = CounterMetricFamily("pybk_log_backlog_evicted_bytes",
                                     "Bytes the backlog quota evicted", labels=["log"])
        for name, st in sorted(self.instances(), key=lambda pair: pair[0]):
            behind.add_metric([name], st.bytes)
            age.add_metric([name], st.seconds)
            refusing.add_metric([name], 0.0 if st.refusing is None else 1.0)
            refused.add_metric([name], st.refused_appends)
            segments.add_metric([name], st.evicted_segments)
            nbytes.add_metric([name], st.evicted_bytes)
        yield from (behind, age, refusing, refused, segments, nbytes)
