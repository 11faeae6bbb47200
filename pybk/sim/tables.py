"""The table workload: table servers and their clients under all faults, and the table
invariants (``Workload(table_clients=N)``; the swarm draws it in one seed of eight).

One table (namespace ``sim``, one range, so every server competes for the same range) is
made with the seed's topology. Each **table client** process is a table server of its own (a
:class:`pybk.tables.TablesEngine` on its own pybk client) that puts, increments and reads a
few keys: the servers take the range from each other all the time, through the range log's
writer fencing, while faults hit bookies, the network and the metadata store. Every call is
in the workload's history with its virtual call and return times; a write that failed has an
unknown outcome (it may be in the log). In the liveness phase a last server takes the range
over and reads every key.

Design notes: docs/internals.md, "pybk/sim/tables.py".
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pybk.errors import BKError
from pybk.runtime.eventloop import within
from pybk.sim.checker import Violation
from pybk.sim.loop import sleep
from pybk.sim.workload import Process, ProcessEnv
from pybk.tables.api import AsyncTable
from pybk.tables.catalog import TableInfo
from pybk.tables.engine import TablesEngine
from pybk.tables.errors import TableBadRequestError
from pybk.testing.linearizability import Op, check

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["TableClientProc", "TableWorkload"]

NAMESPACE = "sim"
TABLE = "simtable"
KEYS = (b"a", b"b", b"c")
#: a call's bound (virtual seconds); past it the outcome is unknown
_OP_BOUND = 10.0
#: operations per client process (bounds the linearizability search)
_OPS = 30


class TableWorkload:
    """The table extension of a run (see the module docstring)."""

    name = "tables"

    @classmethod
    def for_run(cls, run: SimRun) -> TableWorkload | None:
        return cls(run) if getattr(run.workload, "table_clients", 0) > 0 else None

    def __init__(self, run: SimRun) -> None:
        self.run = run
        self.history: dict[bytes, list[Op]] = {k: [] for k in KEYS}
        self.revisions: list[tuple[int, str]] = []  # (revision, who) of acknowledged puts
        self.info: TableInfo | None = None
        self.knobs: dict[str, Any] = {}

    def engine(self, client: Any, checkpoint_every: int) -> TablesEngine:
        return TablesEngine(client, log_knobs=self.knobs, checkpoint_every=checkpoint_every)

    async def start(self) -> None:
        run = self.run
        e, qw, qa = run.topology
        self.knobs = {"ensemble_size": e, "write_quorum": qw, "ack_quorum": qa}
        run.cover("workload_tables")
        admin = self.engine(run.cluster.client("table-admin"), 10)
        await admin.create_namespace(NAMESPACE)
        self.info = await admin.catalog.create_table(NAMESPACE, TABLE, 1)
        for _ in range(run.workload.table_clients):
            run.spawn(TableClientProc, "tc", self)

    async def settle(self) -> None:
        run = self.run
        assert self.info is not None
        engine = self.engine(run.cluster.client("table-final"), 10)
        table = AsyncTable(engine, self.info)
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            for k in KEYS:
                call = loop.time()
                kv = await within(table.get(k), run.liveness_bound)
                self.history[k].append(
                    Op("get", None, None if kv is None else kv.value, call, loop.time()))
        except Exception as exc:
            run.history.liveness("a table server takes the range over and reads", False,
                                 f"{type(exc).__name__}: {exc}")
            return
        finally:
            await engine.abandon()
        run.history.liveness("a table server takes the range over and reads", True,
                             f"{loop.time() - start:.3f}s")

    def check(self) -> list[Violation]:
        out = []
        for k, ops in self.history.items():
            try:
                ok = check(ops)
            except ValueError:  # too many unknown outcomes to search: no verdict
                continue
            if not ok:
                out.append(Violation("TB1", -1, -1, f"table key {k!r}: the history of its "
                                     f"{len(ops)} operations is not linearizable"))
        seen: dict[int, str] = {}
        for rev, who in self.revisions:
            if rev in seen:
                out.append(Violation("TB2", -1, -1, f"revision {rev} given to two "
                                     f"acknowledged writes ({seen[rev]}, {who})"))
            seen[rev] = who
        return out

    async def close(self) -> None:
        """Nothing to stop: the clients are the run's processes, cancelled with it."""


class TableClientProc(Process):
    """A table server and its client in one: writes and reads keys of the one range."""

    prefix = "tc"

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv,
                 ext: TableWorkload) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)

    async def run(self) -> None:
        ext = self.ext
        assert ext.info is not None
        engine = ext.engine(self.client, self.rng.choice((5, 20, 1000)))
        table = AsyncTable(engine, ext.info)
        loop = asyncio.get_running_loop()
        try:
            for _ in range(_OPS):
                if self.stopped():
                    return
                await sleep(self.rng.expovariate(2.0))
                key = self.rng.choice(KEYS)
                kind = self.rng.choice(("put", "put", "get", "get", "incr"))
                arg: Any = (b"%s-%d" % (self.name.encode(), self.ops) if kind == "put"
                            else self.rng.randrange(1, 4) if kind == "incr" else None)
                call = loop.time()
                self.ops += 1
                try:
                    if kind == "put":
                        rev = await within(table.put(key, arg), _OP_BOUND)
                        ext.revisions.append((rev, f"{self.name} put {arg!r}"))
                        out: Any = None
                    elif kind == "get":
                        kv = await within(table.get(key), _OP_BOUND)
                        out = None if kv is None else kv.value
                    else:
                        out = await within(table.increment(key, arg), _OP_BOUND)
                except TableBadRequestError:
                    out = "bad"
                except (BKError, TimeoutError) as exc:
                    self.log(f"{kind} {key!r}: {type(exc).__name__}")
                    if kind != "get":
                        ext.history[key].append(Op(kind, arg, None, call, None))
                    continue
                ext.history[key].append(Op(kind, arg, out, call, loop.time()))
        finally:
            await engine.abandon()
