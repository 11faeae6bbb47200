"""A simulated cluster for users' own tests (the ``sim_cluster`` pytest fixture).

    def test_survives_a_bookie_crash(sim_cluster):
        async def scenario(cluster):
            client = cluster.client("app")
            lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            await lh.append(b"before")
            await cluster.crash_bookie("b0")          # kill -9 plus power cut
            cluster.network.block("app", "b1")        # and a partition
            await lh.append(b"after")                 # ensemble change, in virtual time
            return lh.id

        ledger_id = sim_cluster.run(scenario)

``run`` starts the bookies, awaits ``scenario(cluster)`` on a fresh virtual-time loop and
returns its result; the whole run is a pure function of ``seed`` (the ``--pybk-seed`` option).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pybk.sim.cluster import SimCluster
from pybk.sim.loop import SimLoop
from pybk.sim.net import NetConfig

__all__ = [
    "SimTestCluster",
    "assert_app_survives",
]

T = TypeVar("T")


@dataclass
class SimTestCluster:
    """Recipe for a simulated cluster; each :meth:`run` builds a fresh one on a fresh loop."""

    seed: int = 0
    bookies: int = 3
    net: NetConfig | None = None
    max_time: float = 86400.0
    start_bookies: bool = True

    def with_options(self, **changes: Any) -> SimTestCluster:
        """A copy with other options (``bookies=5``, ``seed=7``, ``net=NetConfig(drop=0.01)``)."""
        fields = {**self.__dict__, **changes}
        return SimTestCluster(**fields)

    def run(self, scenario: Callable[[SimCluster], Awaitable[T]]) -> T:
        """Run ``scenario(cluster)`` to completion in virtual time and return its result."""
        trace: list[str] = []
        loop = SimLoop(max_time=self.max_time)

        async def main() -> T:
            cluster = SimCluster(self.seed, self.bookies, net=self.net,
                                 log=lambda line: trace.append(f"{loop.time():11.6f} {line}"))
            self.last_cluster = cluster
            try:
                if self.start_bookies:
                    await cluster.start()
                return await scenario(cluster)
            finally:
                await cluster.close()

        try:
            return loop.run_main(main())
        finally:
            self.trace = trace
            loop.shutdown()


def assert_app_survives(app: Callable[..., Awaitable[None]],
                        check: Callable[[list[Any]], list[str]], seeds: Any = range(50),
                        **options: Any) -> None:
    """``pybk.sim.check`` as a test assertion: AssertionError naming each failing seed, its
    violations and the call that reproduces it. ``options``: ``faults``, ``duration``,
    ``bookies``, ``workers`` (see :func:`pybk.sim.check`)."""
    from pybk.sim.userapp import check as sim_check

    report = sim_check(app, check, seeds, **options)
    if report.failing:
        lines = [f"{len(report.failing)} of {report.seeds} seeds failed:"]
        for f in report.failing[:10]:
            lines.append(f"  seed {f.seed}: {'; '.join(f.violations)}")
            lines.append(f"    reproduce: {f.command}")
        raise AssertionError("\n".join(lines))
