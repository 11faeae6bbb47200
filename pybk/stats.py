"""Counters and histograms the bookie, the journal and the client keep when asked to.

They are plain Python objects: the code that records into them runs on one event loop (no
locks), pays a list increment and a ``bisect`` per observation, and imports nothing else.
Nobody records unless a stats object was handed in (``Bookie(stats=...)``,
``Client(metrics=...)``): without one, the hot paths skip the timing altogether. Prometheus
exposition lives in the collectors beside each part (``pybk.bookie.metrics``,
``pybk.client.metrics``, ``pybk.ops.metrics``), which read these objects when scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Final

__all__ = [
    "BATCH_BUCKETS",
    "BYTES_BUCKETS",
    "LATENCY_BUCKETS",
    "BookieStats",
    "ClientStats",
    "Histogram",
]

#: seconds: 50 us .. 10 s
LATENCY_BUCKETS: Final = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                          0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: records per journal batch
BATCH_BUCKETS: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
                        2048.0, 4096.0, 8192.0)
#: bytes per journal batch: 256 B .. 16 MiB
BYTES_BUCKETS: Final = tuple(float(256 << (2 * i)) for i in range(8))


class Histogram:
    """Cumulative-bucket histogram (Prometheus' shape): ``counts[i]`` observations fell in
    ``(bounds[i-1], bounds[i]]``, the last slot counts those above every bound."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram bounds must be increasing, got {bounds!r}")
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``n`` observations of ``value`` (a batch of equal ones costs one call)."""
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound as Prometheus writes it, cumulative count), ``+Inf`` last."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile ``q`` (0 when empty)."""
        if not self.count:
            return 0.0
        rank = q * self.count
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            if total >= rank:
                return bound
        return float("inf")


class BookieStats:
    """What a bookie records: requests by kind, their latency, the journal's batches.

    Every add request is timed once, from its arrival at the bookie to its answer (the
    journal's fsync included); a batched add (``AddBatchRequest``, what writers send) counts
    its entries and observes that latency with their weight, so the cost is per request,
    not per entry. Journal batches are recorded once per batch (records, bytes, how long the
    fsync took)."""

    def __init__(self) -> None:
        self.adds = 0
        self.add_bytes = 0
        self.add_errors = 0
        self.recovery_adds = 0
        self.add_latency = Histogram()
        self.reads = 0
        self.read_bytes = 0
        self.read_errors = 0
        self.read_latency = Histogram()
        self.long_polls = 0
        self.fences = 0
        self.journal_batches = 0
        self.journal_batch_records = Histogram(BATCH_BUCKETS)
        self.journal_batch_bytes = Histogram(BYTES_BUCKETS)
        self.journal_sync_latency = Histogram()

    def journal_batch(self, records: int, nbytes: int, sync_seconds: float) -> None:
        self.journal_batches += 1
        self.journal_batch_records.observe(records)
        self.journal_batch_bytes.observe(nbytes)
        self.journal_sync_latency.observe(sync_seconds)


class ClientStats:
    """What a client records: add and read latency (per call of ``append`` /
    ``append_many`` / ``read``), ensemble changes, recoveries, speculative reads."""

    def __init__(self) -> None:
        self.adds = 0
        self.add_errors = 0
        self.add_latency = Histogram()
        self.reads = 0
        self.read_entries = 0
        self.read_errors = 0
        self.read_latency = Histogram()
        self.ensemble_changes = 0
        self.recoveries = 0
        self.recovery_errors = 0
        self.recovery_latency = Histogram()
        self.speculative_reads = 0
        self.ledgers_created = 0
        #: requests a writer sent: add batches (one per bookie and batch), explicit LACs
        #: (one per bookie told, immediate or periodic)
        self.add_requests = 0
        self.lac_messages = 0
