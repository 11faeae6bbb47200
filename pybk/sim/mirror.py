"""The mirror workload (opt in: ``Workload(mirror=True)``): a log of the run's cluster, written
under all the seed's faults, mirrored into a log of a second simulated cluster (its own
bookies, metadata store and network) by a mirror process that crashes itself at random
moments and restarts from the target's truth, as :class:`pybk.ops.MirrorService` would.

Invariants: MR1, after every crash of the mirror, the target's copies name strictly
increasing source positions (never reordered or doubled) and each carries the bytes the
source acknowledged at that position; MR2, at the end the target is exactly a prefix of the
source (no record missing between two copies), read back from both clusters; in the liveness
phase a last mirror copies the whole source within the bound.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pybk.errors import BKError
from pybk.logs.mirror import LogMirror, unframe
from pybk.runtime.eventloop import wait, within
from pybk.sim.checker import Violation
from pybk.sim.cluster import SimCluster
from pybk.sim.loop import sleep
from pybk.sim.runner import EXTENSIONS
from pybk.sim.workload import Process, ProcessEnv

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["MirrorSim"]

NAMESPACE = "sim"
LOG = "mirrored"
_Pos = tuple[int, int, int]


async def _read_all(log: Any, bound: float) -> list[Any]:
    last = await within(log.last_position(), bound)
    if last is None:
        return []
    out: list[Any] = []
    async with log.reader(stop_at=last) as reader:
        while batch := await within(reader.read_batch(1000), bound):
            out.extend(batch)
    return out


class MirrorSim:
    """The mirror extension of a run (see the module docstring)."""

    name = "mirror"

    @classmethod
    def for_run(cls, run: SimRun) -> MirrorSim | None:
        return cls(run) if getattr(run.workload, "mirror", False) else None

    def __init__(self, run: SimRun) -> None:
        self.run = run
        self.target: SimCluster | None = None
        #: source position -> bytes, for every record the source writer saw acknowledged
        self.acked: dict[_Pos, bytes] = {}
        self.violations: list[Violation] = []
        self.checks = 0
        self.mirror_crashes = 0
        self._reported: set[tuple[str, int, _Pos]] = set()  # each finding once

    async def start(self) -> None:
        run = self.run
        e, qw, qa = run.topology
        self.target = SimCluster(run.seed + 1_000_003, 3, log=lambda line: run.log(f"T {line}"),
                                 bookie_config=run.cluster.bookie_config,
                                 client_config=run.cluster.client_config)
        await self.target.start()
        await run.cluster.client("mirror-admin").namespace(NAMESPACE).create_log(
            LOG, ensemble_size=e, write_quorum=qw, ack_quorum=qa, roll_entries=6)
        await self.target.client("mirror-admin").namespace(NAMESPACE).create_log(
            LOG, ensemble_size=3, write_quorum=2, ack_quorum=2, roll_entries=5)
        run.spawn(MirrorSourceWriter, "ms", self)
        run.spawn(MirrorProc, "mr", self)

    def target_log_client(self, name: str) -> Any:
        assert self.target is not None
        return self.target.client(name)

    async def check_target(self, when: str) -> list[Any]:
        """MR1 over the target as it stands (read from the unfaulted target cluster)."""
        self.checks += 1
        client = self.target_log_client(f"mirror-check-{self.checks}")
        try:
            log = await client.namespace(NAMESPACE).open_log(LOG)
            records = await _read_all(log, self.run.liveness_bound)
        finally:
            await client.close()
        last: _Pos | None = None
        for i, rec in enumerate(records):
            copy = unframe(rec.data)
            pos = (copy.source_position.segment, copy.source_position.entry,
                   copy.source_position.slot)
            if last is not None and pos <= last and ("order", i, pos) not in self._reported:
                self._reported.add(("order", i, pos))
                self._violate("MR1", f"{when}: target record {i} copies source position "
                              f"{pos} after {last} (reordered or doubled)")
            known = self.acked.get(pos)
            if known is not None and known != copy.data and ("data", i, pos) not in \
                    self._reported:
                self._reported.add(("data", i, pos))
                self._violate("MR1", f"{when}: target record {i} holds {copy.data!r} for "
                              f"source position {pos}, which holds {known!r}")
            last = pos
        return records

    def _violate(self, kind: str, text: str) -> None:
        self.run.log(f"VIOLATION {kind} {text}")
        self.violations.append(Violation(kind, -1, -1, text))

    async def settle(self) -> None:
        run = self.run
        loop = asyncio.get_running_loop()
        start = loop.time()
        src_client = run.cluster.client("mirror-final")
        dst_client = self.target_log_client("mirror-final")
        what = "a last mirror copies the whole source"
        try:
            src = await src_client.namespace(NAMESPACE).open_log(LOG)
            dst = await dst_client.namespace(NAMESPACE).open_log(LOG)
            await within(LogMirror(src, dst, label="mirror-final").drain(), run.liveness_bound)
            source = await _read_all(src, run.liveness_bound)
            target = await self.check_target("final")
        except (BKError, TimeoutError) as exc:
            run.history.liveness(what, False, f"{type(exc).__name__}: {exc}")
            return
        finally:
            await src_client.close()
            await dst_client.close()
        copies = [unframe(r.data) for r in target]
        for i, (s, t) in enumerate(zip(source, copies, strict=False)):
            if (s.position, s.data) != (t.source_position, t.data):
                self._violate("MR2", f"target record {i} copies {t.source_position} "
                              f"{t.data!r}; the source's record {i} is {s.position} {s.data!r}")
                break
        if len(copies) > len(source):
            self._violate("MR2", f"the target holds {len(copies)} records, the source "
                          f"{len(source)}")
        ok = len(copies) == len(source)
        run.history.liveness(what, ok, f"{len(copies)} of {len(source)} records, "
                             f"{self.mirror_crashes} mirror crashes, "
                             f"{loop.time() - start:.3f}s")

    def check(self) -> list[Violation]:
        return list(self.violations)

    async def close(self) -> None:
        if self.target is not None:
            await self.target.close()


class MirrorSourceWriter(Process):
    """Appends unique records to the source log (faults and all); reopens on failure."""

    prefix = "ms"

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv,
                 ext: MirrorSim) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)
        self.seq = 0

    async def run(self) -> None:
        while not self.stopping:
            try:
                log = await self.client.namespace(NAMESPACE).open_log(LOG)
                w = await log.writer(label=self.name)
            except Exception as exc:
                if not self.expected(exc, "open the mirrored log's writer"):
                    return
                await sleep(0.5)
                continue
            try:
                while not self.stopping and w.error is None:
                    await sleep(self.rng.expovariate(self.w.log_rate))
                    n = self.rng.choice((1, 1, 1, 3))
                    payloads = [f"{self.name}:{self.seq + i}".encode() for i in range(n)]
                    self.seq += n
                    self.ops += n
                    fut = w.append_many(payloads)
                    fut.add_done_callback(lambda f, p=payloads: self._acked(p, f))
            except Exception as exc:
                if not self.expected(exc, "append to the mirrored log"):
                    return
            await w.abort()
            await sleep(0.2)

    def _acked(self, payloads: list[bytes], fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        for pos, data in zip(fut.result(), payloads, strict=True):
            self.ext.acked[(pos.segment, pos.entry, pos.slot)] = data


class MirrorProc(Process):
    """One mirror (one LogMirror, as a service keeps it) run and crashed at random moments;
    after each crash the target is checked (MR1)."""

    prefix = "mr"

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv,
                 ext: MirrorSim) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)

    async def run(self) -> None:
        target_client = self.ext.target_log_client(self.name)
        mirror: LogMirror | None = None
        while not self.stopping:
            try:
                if mirror is None:
                    src = await self.client.namespace(NAMESPACE).open_log(LOG)
                    dst = await target_client.namespace(NAMESPACE).open_log(LOG)
                    mirror = LogMirror(src, dst, batch_records=self.rng.choice((1, 4, 50)),
                                       window=self.rng.choice((1, 4)), label=self.name)
                task = asyncio.get_running_loop().create_task(mirror.run())
                if self.rng.random() < 0.5:  # a crash at any moment
                    await wait({task}, timeout=self.rng.expovariate(0.5))
                else:  # a crash just after a batch was acknowledged (the next in flight)
                    copied = mirror.stats.records
                    for _ in range(200):
                        if task.done() or mirror.stats.records > copied:
                            break
                        await sleep(0.05)
                    await wait({task}, timeout=self.rng.uniform(0.0, 0.01))
                if not task.done():
                    task.cancel()
                    self.ext.mirror_crashes += 1
                try:
                    await task
                except asyncio.CancelledError:
                    if not task.cancelled():
                        raise
                except Exception as exc:
                    if not self.expected(exc, "mirror"):
                        return
                self.ops += 1
                await self.ext.check_target(f"after mirror run {self.ops}")
            except Exception as exc:
                if not self.expected(exc, "mirror process"):
                    return
            await sleep(self.rng.expovariate(4.0))


EXTENSIONS["mirror"] = MirrorSim.for_run
