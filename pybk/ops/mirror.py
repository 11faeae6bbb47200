"""A log mirror run as a service: restarted after every failure it may heal, its lag exported.

Why: a mirror's run ends at the first failure of either cluster (a bookie, the network, a
takeover of the target's writer). Restarting is always safe, because a run resumes from the
target's last record (:mod:`pybk.logs.mirror`), so the service only restarts, after a backoff
with jitter from an injected random (loop time; the simulator can drive it). Failures a
restart cannot heal end it: refused credentials (MirrorAccessError), a target that is not a
mirror's, a source truncated past the copy, bad input.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pybk.errors import AlreadyTruncatedError, BKError
from pybk.logs.log import Log
from pybk.logs.mirror import LogMirror, MirrorAccessError, MirrorError, MirrorStats
from pybk.logs.position import Position

__all__ = ["MirrorCollector", "MirrorService"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class MirrorService:
    """Keeps a :class:`~pybk.logs.mirror.LogMirror` of ``source`` into ``target`` running:
    ``await service.run()`` until cancelled (or the source's stream ended and everything is
    copied). A failure is logged and the mirror restarts after ``min_backoff`` doubling to
    ``max_backoff`` seconds (times a jitter in [0.5, 1)); refused credentials
    (MirrorAccessError: no TLS, a certificate failing verification, a token missing or
    refused), a target that is not a mirror's (MirrorError), a source truncated past the
    copy (AlreadyTruncatedError) and bad input (a record too large for the target included)
    are not retried: ``run`` and ``drain`` raise them."""

    def __init__(
        self,
        source: Log,
        target: Log,
        *,
        rng: random.Random | None = None,
        min_backoff: float = 0.1,
        max_backoff: float = 10.0,
        name: str = "",
        **mirror_options: object,
    ) -> None:
        if not 0 < min_backoff <= max_backoff:
            raise ValueError(
                f"need 0 < min_backoff <= max_backoff, got {min_backoff}, {max_backoff}")
        self.name = name or f"{source.namespace}/{source.name}"
        self.stats = MirrorStats()
        self.mirror = LogMirror(source, target, stats=self.stats, **mirror_options)  # type: ignore[arg-type]
        self._rng = rng if rng is not None else random.Random()
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        #: failures the service restarted after
        self.failures = 0

    async def run(self, *, stop_at: Position | None = None,
                  on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Run the mirror, restarting after failures, until cancelled, until the source's
        stream ended, or past ``stop_at``."""
        await self._retrying(lambda: self.mirror.run(stop_at=stop_at), on_failure)

    async def _retrying(self, op: Callable[[], Awaitable[T]],
                        on_failure: Callable[[BaseException], None] | None = None) -> T:
        backoff = self.min_backoff
        while True:
            try:
                return await op()
            except (MirrorAccessError, MirrorError, AlreadyTruncatedError, TypeError,
                    ValueError):
                raise  # retrying cannot help: the credentials, the target or the source
            except (BKError, OSError, TimeoutError) as exc:
                self.failures += 1
                log.warning("mirror %s failed (%s: %s); restarting in about %.2f s",
                            self.name, type(exc).__name__, exc, backoff)
                if on_failure is not None:
                    on_failure(exc)
            await asyncio.sleep(backoff * (0.5 + self._rng.random() / 2))
            backoff = min(backoff * 2, self.max_backoff)

    async def drain(self) -> Position | None:
        """Copy up to the source's last record as of now, restarting after failures (the
        failover step); the last source position the target holds."""
        last = await self._retrying(self.mirror.source_position)
        if last is not None:
            await self.run(stop_at=last)
        return await self._retrying(self.mirror.resume_position)


class MirrorCollector(Collector):
    """Mirrors' metrics, one sample per mirror (label ``mirror``): ``instances()`` returns
    (name, MirrorStats) pairs."""

    def __init__(self, instances: Callable[[], Iterable[tuple[str, MirrorStats]]]) -> None:
        self.instances = instances

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "pybk_log_mirror_lag_seconds",
            "Seconds since the target last held every record the source held (0: caught up)",
            labels=["mirror"])
        records = CounterMetricFamily("pybk_log_mirror_records",
                                      "Records copied and acknowledged on the target",
                                      labels=["mirror"])
        nbytes = CounterMetricFamily("pybk_log_mirror_bytes",
                                     "Bytes of records copied to the target", labels=["mirror"])
        starts = CounterMetricFamily("pybk_log_mirror_starts",
                                     "Times the mirror started from the target's last record",
                                     labels=["mirror"])
        for name, st in sorted(self.instances(), key=lambda pair: pair[0]):
            lag.add_metric([name], st.lag_seconds)
            records.add_metric([name], st.records)
            nbytes.add_metric([name], st.bytes)
            starts.add_metric([name], st.starts)
        yield lag
        yield records
        yield nbytes
        yield starts

