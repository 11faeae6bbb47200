"""Percentiles (nearest rank) and a latency summary, in seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LatencySummary", "median", "percentile"]


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank ``q`` quantile (0 <= q <= 1) of ``samples``; NaN when there are none."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q!r}")
    if not samples:
        return math.nan
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def median(xs: Sequence[float]) -> float:
    """The middle value (the upper one of an even count); NaN for none."""
    if not xs:
        return math.nan
    return sorted(xs)[len(xs) // 2]


@dataclass(frozen=True)
class LatencySummary:
    """p50/p90/p99/p99.9/max of a list of latencies (seconds) and how many there were."""

    count: int
    p50: float
    p90: float
    p99: float
    p999: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> LatencySummary:
        s = sorted(samples)
        return cls(len(s), percentile(s, 0.5), percentile(s, 0.9), percentile(s, 0.99),
                   percentile(s, 0.999), s[-1] if s else math.nan)

    def ms(self) -> dict[str, float]:
        """The percentiles in milliseconds, by name (for printing and JSON)."""
        return {"p50": self.p50 * 1e3, "p90": self.p90 * 1e3, "p99": self.p99 * 1e3,
                "p99.9": self.p999 * 1e3, "max": self.max * 1e3}
