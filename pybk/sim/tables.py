"""The table workload: table servers and their clients under all faults, and the table
invariants (``Workload(table_clients=N)``; the swarm draws it in one seed of eight).

One table (namespace ``sim``, one range, so every server competes for the same range) is
made with the seed's topology. Each **table server** process (a
:class:`pybk.tables.TablesEngine` on its own pybk client) serves two to four clients at
once, as a table server serves many gRPC clients: their calls (puts, increments, deletes and
reads of a few keys) come in bursts, half of them on one key, and run side by side on the
one engine. The servers take the range from each other all the time, through the range
log's writer fencing, while faults hit bookies, the network and the metadata store, and
table servers die (:mod:`pybk.sim.tablefaults`: a new one makes the dead one's remaining
calls). Every call is in the workload's history with its virtual call and return times; a
write that failed before it was appended did not happen, one that failed after has an
unknown outcome (it may be in the log), as has every write under way when its server died.
In the liveness phase a last server takes the range over and reads every key.

Design notes: docs/internals.md, "pybk/sim/tables.py".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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
#: operations per table server, over all its clients (bounds the linearizability search)
_OPS = 30
#: the calls a client makes, by weight (a delete lets the key be a counter or bytes again)
_KINDS = ("put", "put", "get", "get", "get", "incr", "incr", "incr", "delete")
#: how many clients a table server serves at once (drawn per server)
_CLIENTS = (2, 3, 4)


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
    """A table server and the clients it serves at once (as a table server serves many gRPC
    clients): each client writes and reads keys of the one range, one call at a time, all
    through the server's one engine."""

    prefix = "tc"

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv,
                 ext: TableWorkload, budget: int = _OPS) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        #: calls left to make (a server that takes a dead one's place makes the rest)
        self.budget = budget
        self.engine: TablesEngine | None = None
        #: called with what just happened after each answer (pybk.sim.tablefaults aims there)
        self.moments: list[Callable[[str], None]] = []
        #: its death under way (pybk.sim.tablefaults)
        self.dying: asyncio.Task[None] | None = None
        #: the calls under way: id -> (key, kind, arg, call time)
        self.calls: dict[int, tuple[bytes, str, Any, float]] = {}

    @property
    def respawn_args(self) -> tuple[Any, ...]:
        """(``run.respawn``) its clients go on with the server that takes its place."""
        return (self.ext, self.budget)

    def in_flight(self) -> int:
        """Commands this server appended that its log has not acknowledged yet."""
        return 0 if self.engine is None else sum(o.in_flight for o in self.engine.owned())

    async def run(self) -> None:
        ext = self.ext
        assert ext.info is not None
        engine = self.engine = ext.engine(self.client, self.rng.choice((5, 20, 1000)))
        table = AsyncTable(engine, ext.info)
        clients = self.rng.choice(_CLIENTS)
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Task[None]] = []
        killed = False
        try:
            while self.budget > 0 and not self.stopped():
                # calls come in bursts, about two a second in all: clients that fan out,
                # and clients that act on one event (half the bursts: one key)
                await sleep(self.rng.expovariate(2.0 / 1.75))
                one = self.rng.choice(KEYS) if self.rng.random() < 0.5 else None
                for _ in range(self.rng.choice((1, 1, 2, 3))):
                    if self.budget <= 0 or self.stopped() or len(self.calls) >= clients:
                        break  # (each of its clients has one call at a time)
                    self.budget -= 1
                    tasks.append(loop.create_task(
                        self._call(table, one or self.rng.choice(KEYS))))
                for t in tasks:
                    if t.done() and not t.cancelled():
                        t.result()  # (an exception no fault explains ends the server: X1)
                tasks = [t for t in tasks if not t.done()]
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:  # the process died (a crash): nothing completes
            killed = True
            raise
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for key, kind, arg, call in self.calls.values():  # (their outcome: unknown)
                if kind != "get":
                    ext.history[key].append(Op(kind, arg, None, call, None))
            self.calls.clear()
            if not killed:
                await engine.abandon()

    async def _call(self, table: AsyncTable, key: bytes) -> None:
        """One client's call, recorded in the workload's history."""
        ext = self.ext
        loop = asyncio.get_running_loop()
        kind = self.rng.choice(_KINDS)
        arg: Any = (b"%s-%d" % (self.name.encode(), self.ops) if kind == "put"
                    else self.rng.randrange(1, 4) if kind == "incr" else None)
        call = loop.time()
        self.ops += 1
        cid = self.ops
        # (the writes of the key under way when a read comes: answered before them, it ran
        # beside them)
        writes = [c for c, (k, w, _a, _t) in self.calls.items() if k == key and w != "get"]
        self.calls[cid] = (key, kind, arg, call)
        try:
            if kind == "get":
                kv = await within(table.get(key), _OP_BOUND)
                out: Any = None if kv is None else kv.value
            else:
                out = await self._write(table, key, kind, arg)
        except TableBadRequestError:
            out = "bad"
        except _NotApplied as exc:  # (never appended: it did not happen)
            del self.calls[cid]
            self.log(f"{kind} {key!r}: {type(exc.__cause__).__name__}, not appended")
            return
        except (BKError, TimeoutError) as exc:
            del self.calls[cid]
            self.log(f"{kind} {key!r}: {type(exc).__name__}")
            if kind != "get":
                ext.history[key].append(Op(kind, arg, None, call, None))
            return
        del self.calls[cid]
        ext.history[key].append(Op(kind, arg, out, call, loop.time()))
        if self.moments:
            beside = kind == "get" and any(c in self.calls for c in writes)
            what = "read_beside_write" if beside and self.in_flight() else "answer"
            for moment in list(self.moments):
                moment(what)

    async def _write(self, table: AsyncTable, key: bytes, kind: str, arg: Any) -> Any:
        """A put, incr or delete through the engine in its two steps (appended, applied), as
        the server's handler runs it: the first failing means it did not happen."""
        assert self.engine is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _OP_BOUND
        cmd = (kind, key) if kind == "delete" else (kind, key, arg)
        try:
            applied = await within(self.engine.submit(table.info, cmd), _OP_BOUND)
        except (BKError, TimeoutError) as exc:
            raise _NotApplied() from exc
        out = await within(applied, max(0.0, deadline - loop.time()))
        if kind == "put":
            self.ext.revisions.append((out, f"{self.name} put {arg!r}"))
            return None
        return bool(out) if kind == "delete" else out


class _NotApplied(Exception):
    """A write that failed before it was appended."""
