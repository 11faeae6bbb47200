"""A bookie server's event counters and gauges, as prometheus sees them at scrape time
(:class:`ServerStats`, kept by :class:`pybk.transport.server.BookieServer`)."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["ServerStats"]


class ServerStats:
    """Event counters (``stats["frame_too_large"]``...), exported to prometheus at scrape time.

    Counting is a dict increment (it happens per request on the hot path); the prometheus
    view is a collector registered in the server's registry that reads the dict when scraped:
    ``pybk_server_events_total{event=...}``, ``pybk_server_connections``,
    ``pybk_server_unauthenticated_connections``, ``pybk_server_bytes_in_flight`` and
    ``pybk_server_long_polls``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.open_connections = 0
        self.gauges: Callable[[], dict[str, float]] = dict
        registry.register(self)

    def incr(self, event: str, n: int = 1) -> None:
        self.counts[event] += n

    def set_open(self, n: int) -> None:
        self.open_connections = n

    def __getitem__(self, event: str) -> int:
        return self.counts[event]

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "pybk_server_events", "Connection and frame events", labels=["event"]
        )
        for event, count in sorted(self.counts.items()):
            events.add_metric([event], count)
        yield events
        yield GaugeMetricFamily(
            "pybk_server_connections", "Open connections", value=self.open_connections
        )
        for name, value in sorted(self.gauges().items()):
            yield GaugeMetricFamily(f"pybk_server_{name}", name.replace("_", " "), value=value)
