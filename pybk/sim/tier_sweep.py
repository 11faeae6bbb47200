"""The tier's orphan sweep in the log workload (``Workload(log_tier_sweep=True)``; the swarm
draws it, from a stream of its own, in half the seeds that offload): a **sweeper** process
runs production's :meth:`pybk.logs.Log.sweep_tier` now and then, beside the offloads, the
readers and the cursor, with a grace drawn per run (0, 1 or 5 s of wall clock), its
deletions watched; in the liveness phase a last sweep runs once faults have stopped.

What the sweep promises, checked at its instant (``tier_check`` events, as TS1/TS2):

* **TS3** the sweep never deletes an object that the log's metadata references, nor one an
  offload attempt recorded afterwards refers to: checked at each of its deletions against
  the metadata as stored then, and at the end against every segment's recorded attempt (no
  read of an offloaded segment can fail because the sweep removed its objects);
* **TS4** after the last sweep no orphan older than the grace remains: no object the
  metadata (read just before it) names no attempt of, last modified a grace or more before
  it started, and no abandoned multipart upload of such an attempt begun a grace or more
  before it (the sweep aborts them; an abort is checked as TS3 checks a deletion).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pybk.logs.tier_store import attempt_base
from pybk.sim.workload import Process, ProcessEnv

if TYPE_CHECKING:
    from pybk.sim.tier import SimObjectStore

__all__ = ["SweepWatch", "TierSweepProc"]


class SweepWatch:
    """The sweeps' invariants TS3/TS4 over one run's log (see the module docstring)."""

    def __init__(self, run: Any, store: SimObjectStore, key: str, namespace: str,
                 log: str) -> None:
        self.run = run
        self.store = store
        self.key = key
        self.namespace = namespace
        self.log = log
        self.grace = run.rng_for("tier-sweep-config").choice((0.0, 1.0, 5.0))
        #: attempts (object bases) some sweep deleted an object of
        self.swept: set[str] = set()
        store.before_sweep_delete = self._deleting

    async def _metadata(self) -> Any:
        from pybk.logs.meta import LogMetadata

        value = await self.run.cluster.admin.read_value(self.key)
        return LogMetadata.from_bytes(value.value, value.version)

    def _named(self, md: Any) -> set[str]:
        """The attempts the metadata names (complete or not, truncated segments too)."""
        return {f"{self.namespace}/{self.log}/{s.seq}-{s.ledger_id}-{s.offload.uid}"
                for s in md.segments if s.offload is not None}

    async def _deleting(self, name: str) -> None:
        """TS3 at the instant a sweep deletes ``name``."""
        base = attempt_base(name) or name
        self.swept.add(base)
        self.run.cover("tier_orphans_swept")
        try:
            md = await self._metadata()
        except Exception:  # (the log deleted: never here, it lives for the run)
            return
        ok = base not in self._named(md)
        self.run.history.tier_check("TS3", ok, f"the sweep deletes {name}: "
                                    + ("no attempt recorded names it" if ok
                                       else "the log's metadata names its attempt"))

    async def final_sweep(self, client: Any) -> None:
        """Liveness: a last sweep once faults have stopped; then TS3 over the log's last
        metadata and TS4 (see the module docstring)."""
        run = self.run
        before = self._named(await self._metadata())
        start = run.wall_clock()
        ns = client.namespace(self.namespace, clock=run.wall_clock,
                              tiers=self.store.open_sweeping)
        log = await ns.open_log(self.log)
        await log.sweep_tier(grace=self.grace)
        md = await self._metadata()
        for s in md.segments:
            o = s.offload
            base = f"{self.namespace}/{self.log}/{s.seq}-{s.ledger_id}-{o.uid}" if o else ""
            if o is not None and base in self.swept:
                run.history.tier_check("TS3", False, f"segment {s.seq} (L{s.ledger_id}) "
                                       f"names attempt {o.uid}, whose objects a sweep deleted")
        left = sorted(n for n, t in self.store.mtimes.items()
                      if attempt_base(n) not in before and t <= start - self.grace - 0.01)
        left += sorted(f"{n} (upload {u})" for (n, u), (_, t) in self.store.uploads.items()
                       if attempt_base(n) not in before and t <= start - self.grace - 0.01)
        for name in left[:5]:
            run.history.tier_check("TS4", False, f"{name} is an orphan older than the grace "
                                   f"({self.grace}s) after the last sweep")
        if not left:
            run.history.tier_check("TS4", True, "no orphan older than the grace after the "
                                   "last sweep")


class TierSweepProc(Process):
    """Sweeps the log's tier now and then (see the module docstring); ``ext`` is the log
    workload (its ``sweep_watch``, ``tier``, ``namespace`` and ``log_name``)."""

    prefix = "ts"
    winds_down = False  # (stopped at once when faults stop: the last sweep is the liveness's)

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv, ext: Any) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)

    async def run(self) -> None:
        watch: SweepWatch = self.ext.sweep_watch
        while not self.stopping:
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
            try:
                ns = self.client.namespace(self.ext.namespace, clock=self.env.wall_clock,
                                           tiers=self.ext.tier.open_sweeping)
                log = await ns.open_log(self.ext.log_name)
                gone = await log.sweep_tier(grace=watch.grace)
            except Exception as exc:
                if not self.expected(exc, "tier sweep"):
                    return
                continue
            self.ops += 1
            self.cover("tier_sweeps")
            if gone:
                self.log(f"swept {len(gone)} orphaned attempts")
