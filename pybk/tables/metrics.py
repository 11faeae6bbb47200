"""What a table server measures, and its Prometheus collector: operations and their
latencies (per kind), failures (per status), checkpoint and recovery times, ranges owned.
Recording is a field increment; families are built per scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from pybk.runtime.prometheus import gauge, histogram_family, labelled_counter
from pybk.stats import Histogram

__all__ = ["TableCollector", "TableStats"]


class TableStats:
    """Counters and histograms of one table server."""

    def __init__(self) -> None:
        self.ops: dict[str, int] = {}
        self.latency: dict[str, Histogram] = {}
        self.failures: dict[str, int] = {}
        self.checkpoint_seconds = Histogram()
        self.recovery_seconds = Histogram()

    def op(self, kind: str, seconds: float) -> None:
        self.ops[kind] = self.ops.get(kind, 0) + 1
        hist = self.latency.get(kind)
        if hist is None:
            hist = self.latency[kind] = Histogram()
        hist.observe(seconds)

    def failure(self, code: str) -> None:
        self.failures[code] = self.failures.get(code, 0) + 1

    def event(self, name: str, seconds: float) -> None:
        """The engine's hook (``on_event``): checkpoint and recovery times."""
        if name == "checkpoint_seconds":
            self.checkpoint_seconds.observe(seconds)
        elif name == "recovery_seconds":
            self.recovery_seconds.observe(seconds)


class TableCollector:
    """Prometheus collector over :class:`TableStats` and the number of ranges owned."""

    def __init__(self, stats: TableStats, ranges_owned: Callable[[], int]) -> None:
        self._stats = stats
        self._owned = ranges_owned

    def collect(self) -> Iterator[Any]:
        s = self._stats
        for kind, n in sorted(s.ops.items()):
            yield labelled_counter("pybk_table_ops", "Table operations served.",
                                   {"op": kind}, n)
            yield histogram_family("pybk_table_op_seconds", "Table operation latency.",
                                   s.latency[kind], {"op": kind})
        for code, n in sorted(s.failures.items()):
            yield labelled_counter("pybk_table_failures", "Table operations that failed.",
                                   {"code": code}, n)
        yield histogram_family("pybk_table_checkpoint_seconds", "Range checkpoint time.",
                               s.checkpoint_seconds)
        yield histogram_family("pybk_table_recovery_seconds",
                               "Range recovery time (checkpoint + replay).",
                               s.recovery_seconds)
        yield gauge("pybk_table_ranges_owned", "Ranges this server owns.", {}, self._owned())
