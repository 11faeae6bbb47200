"""The offload service in the log workload: in half the seeds that offload (a stream of its
own, ``offload-service``), a process runs production's :class:`pybk.ops.OffloadService`
rounds over the simulated log now and then, beside its writer's own offloads, the readers,
the cursor and the sweep. The writer faults aim at it too (a paused service is a zombie
offloader; a crashed one stops its tier calls where they are). A third of them take over
other offloaders' attempts at once, as an offload by hand does; the others leave recent ones
to the writer. What it must keep is what
every offload keeps, TS1 and TS2 (:mod:`pybk.sim.tier`)."""

from __future__ import annotations

import asyncio
from typing import Any

from pybk.sim.workload import Process, ProcessEnv

__all__ = ["OffloadServiceProc"]


class OffloadServiceProc(Process):
    """Runs offload service rounds every 0.5 to 4 s (see the module docstring); ``ext`` is
    the log workload (its ``namespace``)."""

    is_writer = True  # (the writer faults, pause and crash, aim at it too)
    prefix = "os"

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv, ext: Any) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)

    async def run(self) -> None:
        from pybk.ops.offloader import OffloadService

        # (0: it takes over at once, as `pybk log offload` by hand does, racing the writer)
        service = OffloadService(self.client, [self.ext.namespace], interval=1.0,
                                 clock=self.env.wall_clock, tiers=self.tiers(),
                                 take_over_after=self.rng.choice((0.0, 5.0, 5.0)))
        while not self.stopping:
            await asyncio.sleep(self.rng.uniform(0.5, 4.0))
            try:
                done = await service.run_once()
            except Exception as exc:
                if not self.expected(exc, "offload service"):
                    return
                continue
            self.ops += 1
            self.cover("offload_service_rounds")
            if done:
                self.cover("offload_service_offloaded")
                self.log(f"offload service offloaded {done} segments")
