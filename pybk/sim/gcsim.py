"""The bookies' own garbage collector in every simulated run: each collection goes into the
history (the checker's I16: only ledgers the metadata deleted before), and how often it ran
and compacted into the coverage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybk.sim.runner import EXTENSIONS

if TYPE_CHECKING:
    from pybk.sim.checker import Violation
    from pybk.sim.runner import SimRun

__all__ = ["GcSim"]


class GcSim:
    """Watches every bookie's collector of one run (the collector runs in every seed: the
    simulated bookies' configuration, :meth:`pybk.sim.configs.SimConfig.bookie_config`)."""

    name = "gc"

    @classmethod
    def for_run(cls, run: SimRun) -> GcSim:
        return cls(run)

    def __init__(self, run: SimRun) -> None:
        self.run = run
        run.cluster.on_gc_collect.append(self._collected)

    def _collected(self, bookie: str, ledger: int) -> None:
        self.run.cover("bookie_gc_collected")
        self.run.history.gc_collect(bookie, ledger)

    async def start(self) -> None:
        pass

    async def settle(self) -> None:
        """Count what the collectors of the bookies up now did (coverage)."""
        for sb in self.run.cluster.bookies.values():
            gc = sb.bookie.gc if sb.status == "up" and sb.bookie is not None else None
            if gc is not None:
                for name, value in (("gc_runs", gc.stats.runs),
                                    ("gc_segments_compacted", gc.stats.segments_compacted)):
                    if value:
                        self.run.coverage[name] += value

    async def close(self) -> None:
        pass

    def check(self) -> list[Violation]:
        return []  # (I16 is the checker's: it reads the history like the other invariants)


EXTENSIONS["gc"] = GcSim.for_run
