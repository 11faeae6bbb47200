"""``sim.run(seed, ...)``: one simulated run, from seed to checked result.

A run is a pure function of its arguments: a :class:`~pybk.sim.loop.SimLoop` (virtual time),
a :class:`~pybk.sim.cluster.SimCluster` (real bookies on simulated disks, a memory metadata
store, the simulated network) and per-subsystem ``random.Random`` objects derived from the
seed. What the seed decides is a :class:`~pybk.sim.scenario.Scenario` (topology, bookie count,
configuration, workload, network fault rates and the schedule of faults); a scenario given
in its place (``scenario=``, a replay file, a shrunk failure) runs the same way. A run has
two phases (TigerBeetle's VOPR) (listed in docs/internals.md, "pybk/sim/runner.py").
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import shlex
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pybk.bookie.inspect import inspect_data_dir
from pybk.client.context import ClientConfig
from pybk.errors import BKError, status_of
from pybk.metadata.memory_watches import PolledDelivery
from pybk.ops.auditor import merged_ranges
from pybk.runtime import sometimes
from pybk.runtime.eventloop import gather, within
from pybk.sim.autorecovery import AutoRecoverySim
from pybk.sim.checker import Checker, Violation
from pybk.sim.cluster import DATA_DIR, SimBookie, SimCluster, derive_rng
from pybk.sim.configs import SimConfig
from pybk.sim.faults import FaultPlan, Faults
from pybk.sim.findings import LogFindings, is_expected
from pybk.sim.history import History
from pybk.sim.injectors import HANDLERS
from pybk.sim.logs import LogWorkload
from pybk.sim.loop import SimDeadlock, SimLoop, SimTimeLimit
from pybk.sim.net import NetConfig
from pybk.sim.racks import RackPlacementSim
from pybk.sim.scenario import Scenario, draw_schedule
from pybk.sim.tables import TableWorkload
from pybk.sim.tenancy import TenancySim
from pybk.sim.userapp import UserApp
from pybk.sim.workload import (
    PASSWORD,
    Deleter,
    Process,
    ProcessEnv,
    Reader,
    Recoverer,
    Registry,
    Workload,
    Writer,
)
from pybk.storage.store import LedgerStore
from pybk.testing.mutations import NO_MUTATIONS, Mutations
from pybk.wire import (
    AddBatchRequest,
    AddLike,
    AddOutcome,
    AddRequest,
    DigestManager,
    ListEntriesRequest,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    Request,
    Response,
    Status,
)

__all__ = ["EXTENSIONS", "PROCESSES", "SOMETIMES", "TOPOLOGIES", "Extension", "SimResult",
           "SimRun", "Stats", "run", "scenario_of"]

#: the prefix of coverage markers that count protocol code's sometimes points
SOMETIMES = "sometimes:"

TOPOLOGIES: tuple[tuple[int, int, int], ...] = ((3, 3, 2), (3, 2, 2), (5, 3, 2), (2, 2, 1),
                                                (4, 3, 3))

#: the ledger workload's processes: (the Workload field with their count, class, name prefix)
PROCESSES: list[tuple[str, type[Process], str]] = [
    ("writers", Writer, "w"),
    ("readers", Reader, "r"),
    ("recoverers", Recoverer, "rc"),
]


class Extension(Protocol):
    """A part of a run with processes, a liveness condition and invariants of its own (the
    log workload, :mod:`pybk.sim.logs`; auto-recovery, :mod:`pybk.sim.autorecovery`)."""

    name: str

    async def start(self) -> None:
        """After the bookies started: set up, spawn processes (``run.spawn``)."""

    async def settle(self) -> None:
        """Liveness phase, once faults stopped and the ledgers were recovered: wait for the
        extension's own progress (record failures with ``run.history.liveness``)."""

    def check(self) -> list[Violation]:
        """The extension's invariants over ``run.history``."""
        return []

    async def close(self) -> None:
        """At the end of the run, faults or not: stop what the extension started."""


#: extensions by name: a factory that returns None when the run's workload has no use for it
EXTENSIONS: dict[str, Callable[[SimRun], Extension | None]] = {
    "autorecovery": AutoRecoverySim.for_run,
    "logs": LogWorkload.for_run,
    "racks": RackPlacementSim.for_run,
    "tables": TableWorkload.for_run, "tenancy": TenancySim.for_run, "app": UserApp.for_run,
}


@dataclass
class Stats:
    virtual_seconds: float = 0.0
    wall_seconds: float = 0.0
    operations: int = 0
    messages: int = 0
    loop_steps: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    coverage: dict[str, int] = field(default_factory=dict)


@dataclass
class SimResult:
    seed: int
    ok: bool
    violations: list[Violation]
    trace: list[str]
    trace_hash: str
    stats: Stats
    topology: tuple[int, int, int]
    bookies: int
    plan: FaultPlan
    faults_spec: str
    duration: float
    mutations: tuple[str, ...] = ()
    error: str | None = None
    #: the bookie count was given by the caller rather than drawn from the seed
    bookies_given: bool = False
    #: the configuration the bookies and writers ran (drawn per seed)
    config: SimConfig | None = None
    #: everything the run was made of, faults with the targets they resolved: save it
    #: (``Scenario.save``) and ``pybk simulate --replay FILE`` runs it again
    scenario: Scenario | None = None
    #: the run replayed a scenario (a file, a shrunk failure) rather than a seed's draw
    replayed: bool = False
    #: every event of the run, when asked for (``run(keep_history=True)``: reports)
    history: list[Any] | None = None

    def command(self) -> str:
        """The shell command that replays this run. ``--bookies`` appears only when the run
        was given one: a count drawn from the seed is drawn again (passing it explicitly
        changes what the seed draws, so the run would differ). A replayed scenario is run
        again from the file it came from (saved first, if it has none)."""
        mutation = f" --mutation {','.join(self.mutations)}" if self.mutations else ""
        if self.replayed:
            source = self.scenario.source if self.scenario is not None else ""
            if not source:
                return ("pybk simulate --replay PATH --verbose, PATH a file the run's "
                        "scenario was saved to (SimResult.scenario.save(PATH))")
            return f"pybk simulate --replay {shlex.quote(source)}{mutation} --verbose"
        extra = f" --bookies {self.bookies}" if self.bookies_given else ""
        extra += mutation
        return (f"pybk simulate --seed {self.seed} --faults {self.faults_spec} "
                f"--duration {self.duration:g}{extra} --verbose")

    def report(self) -> str:
        head = (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} topology "
                f"E,Qw,Qa={self.topology} bookies={self.bookies} "
                f"{self.config.describe() if self.config else ''} {self.plan.describe()}")
        lines = [head]
        if self.error:
            lines.append(f"  run error: {self.error}")
        for v in self.violations:
            lines.append(v.render(self.trace))
        if not self.ok:
            lines.append(f"  reproduce: {self.command()}")
            if not self.replayed:
                lines.append(f"  shrink:    pybk simulate --seed {self.seed} --faults "
                             f"{self.faults_spec} --duration {self.duration:g}"
                             + (f" --mutation {','.join(self.mutations)}"
                                if self.mutations else "") + " --shrink")
                lines.append(f"  pictures:  {self.command().removesuffix(' --verbose')} "
                             f"--report sim-report-{self.seed}")
        return "\n".join(lines)


def scenario_of(seed: int, *, bookies: int | None = None, duration: float = 30.0,
                faults: Faults | None = None, workload: Workload | None = None,
                topology: tuple[int, int, int] | None = None,
                mutations: tuple[str, ...] = ()) -> Scenario:
    """What ``seed`` draws: topology, bookies, configuration, fault plan and schedule."""
    faults = faults if faults is not None else Faults.all()
    rng = derive_rng(seed, "runner")
    topo = topology or rng.choice([t for t in TOPOLOGIES if bookies is None or t[0] <= bookies])
    n = bookies if bookies is not None else topo[0] + rng.choice((0, 1, 1, 2))
    plan = faults.swarm(derive_rng(seed, "swarm"))
    return Scenario(seed=seed, duration=duration, topology=topo, bookies=n,
                    config=SimConfig.draw(seed),
                    workload=workload or Workload.draw(derive_rng(seed, "workload")), plan=plan,
                    events=draw_schedule(plan, seed, duration), faults_spec=faults.spec(),
                    mutations=tuple(mutations))


class SimRun:
    """State of one run: the cluster, the processes, the trace, the history, the phases."""

    def __init__(self, scenario: Scenario, liveness_bound: float,
                 mutations: Mutations = NO_MUTATIONS) -> None:
        self.scenario = scenario
        self.seed = scenario.seed
        #: broken behaviours handed to every bookie and client of the run (checker tests)
        self.mutations = mutations
        self.rng = derive_rng(self.seed, "liveness")
        self.topology = scenario.topology
        self.n = scenario.bookies
        self.duration = scenario.duration
        self.plan = scenario.plan
        self.config = scenario.config
        self.workload = scenario.workload
        self.liveness_bound = liveness_bound
        self.trace: list[str] = []
        self.fault_counts: Counter[str] = Counter()
        self.coverage: Counter[str] = Counter(scenario.config.coverage())
        self.loop: SimLoop | None = None
        self.history = History(log=self.log, now=self.now, trace=self.trace)
        self.registry = Registry()
        self.faulty: list[str] = []  # fault atlas: bookies whose data was damaged
        self.processes: list[Process] = []
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.heal_tasks: list[asyncio.Task[Any]] = []
        #: called when faults stop (a fault armed for later disarms itself here)
        self.on_liveness: list[Callable[[], None]] = []
        self.spawned: Counter[str] = Counter()
        #: ledger entries some client sent an AddRequest for (ever)
        self.sent_adds: set[tuple[int, int]] = set()
        #: ledgers whose metadata was deleted (by anyone: the deleter, a log truncation)
        self.deleted: set[int] = set()
        #: seconds added to the virtual time for the wall clock the logs read (clock jumps)
        self.wall_offset = 0.0
        self._digests: dict[int, DigestManager] = {}
        self._served: set[tuple[str, int, int, bytes]] = set()
        self._bodies: set[tuple[str, int, int, bytes]] = set()
        self.env = ProcessEnv(
            history=self.history, registry=self.registry, cover=self.cover,
            topology=self.topology, workload=self.workload,
            batched_adds=self.config.batched_adds,
            was_sent=lambda lid, entry: (lid, entry) in self.sent_adds,
            wall_clock=self.wall_clock,
        )
        net = NetConfig(drop=self.plan.drop, duplicate=self.plan.duplicate,
                        reorder=self.plan.reorder, corrupt=self.plan.corrupt,
                        reset=self.plan.reset)
        self.cluster = SimCluster(self.seed, self.n, net=net, log=self.log,
                                  count=self.count_fault, client_config=self._client_config(),
                                  bookie_config=self.config.bookie_config(mutations),
                                  watch_delivery=self._watch_delivery())
        self.cluster.on_bookie_started.append(self._audit_restart)
        self.cluster.on_meta_applied.append(self._meta_applied)
        #: ledger -> the ensembles its metadata named when last recorded in the history
        self._ensembles_seen: dict[int, Mapping[int, tuple[str, ...]]] = {}
        network = self.cluster.network
        network.add_observers.append(self._observe_add)
        network.reply_observers.append(self._observe)
        network.send_observers.append(self._sent)
        network.on_handler_error = self._handler_error
        self.extensions: list[Extension] = [
            ext for ext in (make(self) for _name, make in sorted(EXTENSIONS.items()))
            if ext is not None]

    def _watch_delivery(self) -> PolledDelivery | None:
        """How metadata watches arrive: at once, or (the plan's switch) as real backends
        deliver them, with a poll interval and an establishment delay drawn from a stream
        of their own (the other draws of the seed stay as they were)."""
        if not self.plan.polled_watches:
            return None
        rng = derive_rng(self.seed, "watches")
        return PolledDelivery(
            poll_interval=rng.choice((0.02, 0.05, 0.2)),
            establish_delay=rng.choice((0.0, 0.05, 0.3)), rng=rng)

    # -- trace -------------------------------------------------------------------------------

    def now(self) -> float:
        return self.loop.time() if self.loop is not None else 0.0

    def rng_for(self, name: str) -> Any:
        """A generator of this run's own, for ``name`` (an extension's draws)."""
        return derive_rng(self.seed, name)

    def wall_clock(self) -> float:
        """The wall clock of the simulated machines (for log segment dates): a fixed epoch
        plus virtual time plus the clock jumps so far."""
        return 1_700_000_000.0 + self.now() + self.wall_offset

    def log(self, text: str) -> int:
        return self.history.trace_line(text)

    def count_fault(self, kind: str) -> None:
        if kind.startswith("bookie_state_") or kind == "bookie_refused_start":
            self.coverage[kind] += 1
        else:
            self.fault_counts[kind] += 1

    def cover(self, marker: str) -> None:
        self.coverage[marker] += 1

    def fault(self, target: str, kind: str, detail: str = "") -> None:
        self.fault_counts[kind] += 1
        self.history.fault(target, kind, detail)

    def _client_config(self) -> ClientConfig:
        return ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.5,
                            long_poll_timeout=1.0, explicit_lac_interval=0.5,
                            long_poll_parallel=self.config.parallel_long_polls,
                            immediate_lac=self.config.immediate_lac, mutations=self.mutations)

    # -- observing from the outside -----------------------------------------------------------

    def _sent(self, client: str, bookie: str, req: Request) -> None:
        kind = type(req)
        if kind is AddRequest:
            self.sent_adds.add((req.ledger_id, req.entry_id))  # type: ignore[union-attr]
        elif kind is AddBatchRequest:  # (a writer's batch: one request, its entries)
            lid = req.ledger_id  # type: ignore[union-attr]
            self.sent_adds.update((lid, e) for e in req.entry_ids)  # type: ignore[union-attr]

    def _meta_applied(self, op: str, key: object) -> None:
        if op in ("create_ledger", "write_ledger") and isinstance(key, int):
            try:
                md = self.cluster.store.peek_ledger(key)
            except (KeyError, BKError):
                return
            ens = md.ensembles
            if self._ensembles_seen.get(key) != ens:  # (most writes change other things)
                self._ensembles_seen[key] = ens
                self.history.ensembles(key, md.ensemble_size, md.write_quorum, ens)
            return
        if op == "delete_ledger" and isinstance(key, int) and key not in self.deleted:
            self.deleted.add(key)
            self.history.delete("meta", key, "applied")

    def _handler_error(self, bookie: str, request: Request, exc: BaseException) -> None:
        import traceback

        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.history.exception(bookie, f"handling {type(request).__name__}", exc, tb)

    def _logged_error(self, logger: str, exc: BaseException, text: str) -> None:
        self.history.exception(logger, "logged", exc, text)

    def _observe_add(self, bookie: str, client: str, req: AddLike, outcome: AddOutcome) -> None:
        """A bookie answered an add (a batch: entry by entry, as the single adds it is made
        of): an OK is a durability promise, even if the answer is lost on its way."""
        lid = req.ledger_id
        ids = (req.entry_id,) if type(req) is AddRequest else req.entry_ids  # type: ignore[union-attr]
        whole = outcome is None or isinstance(outcome, BaseException)
        for i, entry in enumerate(ids):
            result = outcome if whole else outcome[i]  # type: ignore[index]
            if result is None:
                self.history.bookie_acked(bookie, lid, entry, req.recovery)
                if req.recovery:
                    self.cover("recovery_write_back")
            elif status_of(result) == Status.FENCED:  # type: ignore[arg-type]
                self.cover("add_rejected_by_fenced_bookie")

    def _observe(self, bookie: str, client: str, req: Request, resp: Response) -> None:
        """A bookie answered a request other than an add (a batched read: entry by entry,
        as the single reads it stands for)."""
        kind = type(req)
        if kind is ReadRequest:
            if req.previous_lac is not None:  # type: ignore[union-attr]
                return
            if req.fence:  # type: ignore[union-attr]
                self.cover("fencing_read")
            self._observe_read(bookie, req.ledger_id, req.entry_id,  # type: ignore[union-attr]
                               resp.status, getattr(resp, "body", None), "read")
        elif kind is ReadBatchRequest:
            lid = req.ledger_id  # type: ignore[union-attr]
            if type(resp) is not ReadBatchResponse or resp.status != Status.OK:
                status = resp.status
                for entry in req.entry_ids:  # type: ignore[union-attr]
                    self._observe_read(bookie, lid, entry, status, None, "read")
                return
            for entry, status, body in resp.entries:
                self._observe_read(bookie, lid, entry, status, body, "read")

    def _observe_read(self, bookie: str, lid: int, entry: int, status: Status,
                      body: bytes | None, how: str) -> None:
        if status == Status.OK:
            if body is None:
                return
            bodies = self._bodies
            known = len(bodies)
            bodies.add((bookie, lid, entry, body))
            if len(bodies) == known:
                return  # (the same bytes from the same bookie again: nothing new to check)
            digest = self._digests.get(lid)
            if digest is None:  # (CRC32C: the password plays no part)
                digest = self._digests[lid] = DigestManager(lid, "CRC32C", PASSWORD)
            expected = entry if entry >= 0 else None
            good = digest.crc_checked(body, expected)  # (the common case: no object made)
            if good is not None:
                entry_id, payload = good[0], good[3]
            else:
                try:
                    dec = digest.verify(body, expected)
                except Exception:
                    self.history.bookie_served(bookie, lid, entry, None, how)
                    return
                entry_id, payload = dec.entry_id, dec.payload
            served = self._served
            known = len(served)
            served.add((bookie, lid, entry_id, payload))
            if len(served) == known:
                return  # (the same bytes again: nothing new for the checker)
            self.history.bookie_served(bookie, lid, entry_id, payload, how)
        elif status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
            if entry >= 0:
                self.history.bookie_absent(bookie, lid, entry, f"{how} {status.name}")
        elif status in (Status.IO_ERROR, Status.CORRUPT, Status.UNKNOWN_LEDGER_STATE):
            self.cover(f"bookie_read_{status.name.lower()}")

    async def _audit_restart(self, sb: SimBookie) -> None:
        """After a restart, before the bookie is reachable: does it hold what it acked?"""
        if sb.incarnation > 1:
            self.cover("bookie_restarted")
            if sb.fs.counters.get("truncate", 0) > getattr(sb, "_truncates", 0):
                self.cover("journal_tail_truncated")
            sb._truncates = sb.fs.counters.get("truncate", 0)  # type: ignore[attr-defined]
        await self.audit(sb, "restart")

    async def audit(self, sb: SimBookie, how: str) -> None:
        """Ask a bookie whether it holds every entry it acknowledged (the ledgers not deleted
        since); read back a sample (all of it on a damaged bookie: a scrubber's pass)."""
        bookie = sb.bookie
        if bookie is None:
            return
        acked: dict[int, list[int]] = {}
        for ev in self.history.acks.get(sb.bookie_id, ()):
            if ev.ledger not in self.deleted:
                acked.setdefault(ev.ledger, []).append(ev.entry)
        for lid in sorted(acked):
            entries = sorted(set(acked[lid]))
            resp = await bookie.handle(ListEntriesRequest(lid))
            if resp.status == Status.OK:
                for e in _not_held(entries, getattr(resp, "ranges", ())):
                    self.history.bookie_absent(sb.bookie_id, lid, e, f"{how} audit list")
                if how != "final" and not sb.damaged:
                    continue
            sample = entries if sb.damaged else entries[-3:]
            for e in sample:
                r = await bookie.handle(ReadRequest(lid, e))
                self._observe_read(sb.bookie_id, lid, e, r.status, getattr(r, "body", None),
                                   f"{how} audit")

    # -- what fault handlers use (pybk.sim.injectors) -------------------------------------------

    def atlas_allows_damage(self, bid: str) -> bool:
        if bid in self.faulty:
            return True
        # Recoverable regime: at most Qa-1 damaged bookies (every acknowledged entry keeps a
        # good copy) and never more than the spares (a damaged bookie may refuse to start for
        # good, and recovery needs a full ensemble of live bookies to write back).
        if self.plan.beyond_tolerance:
            budget = self.topology[1]
        else:
            budget = min(self.topology[2] - 1, self.n - self.topology[0])
        return len(self.faulty) < budget

    def down_limit(self) -> int:
        return max(1, self.n - self.topology[0]) if not self.plan.beyond_tolerance else self.n

    def later(self, delay: float, coro_fn: Any, *args: Any) -> None:
        """Run ``coro_fn(*args)`` after ``delay`` (cancelled when the liveness phase starts)."""
        async def go() -> None:
            await asyncio.sleep(delay)
            await coro_fn(*args)
        self.heal_tasks.append(asyncio.get_running_loop().create_task(go()))

    def clients(self) -> list[str]:
        return [p.name for p in self.processes if not p.stopping]

    def writers(self) -> list[Process]:
        """Live writer processes of any kind (ledger writers, log writers)."""
        return [p for p in self.processes if getattr(p, "is_writer", False) and not p.stopping]

    def ledger_writers(self) -> list[Writer]:
        return [p for p in self.processes if isinstance(p, Writer) and not p.stopping]

    def recoverers(self) -> list[Recoverer]:
        return [p for p in self.processes if isinstance(p, Recoverer) and not p.stopping]

    def recovery_targets(self) -> dict[str, list[str]]:
        """What a recovery can be aimed at now: ``L<id>`` (a ledger being written, recovered
        by a recoverer) or a process's own target (a log: taken over by a new writer), each
        with the ensemble its last entries went to."""
        out: dict[str, list[str]] = {}
        if self.recoverers():
            for w in self.ledger_writers():
                if w.current is not None:
                    out[f"L{w.current.id}"] = list(w.current.metadata.last_ensemble)
        for p in self.writers():
            target = getattr(p, "recovery_target", None)
            found = target() if target is not None else None
            if found is not None:
                out[found[0]] = found[1]
        return out

    async def trigger_recovery(self, target: str) -> None:
        if target.startswith("L"):
            recoverers = self.recoverers()
            if recoverers:
                self.later(0.0, recoverers[0].recover, int(target[1:]))
            return
        for ext in self.extensions:
            trigger = getattr(ext, "trigger_recovery", None)
            if trigger is not None and await trigger(target):
                return

    def block(self, kind: str, links: list[tuple[str, str]], hold: float) -> None:
        self.fault(";".join(f"{a}->{b}" for a, b in links), kind)
        for a, b in links:
            self.cluster.network.block(a, b)

        async def heal() -> None:
            for a, b in links:
                self.cluster.network.unblock(a, b)
        self.later(hold, heal)

    async def unclog(self, b: str) -> None:
        net = self.cluster.network
        for a, d in net.blocked_links():
            if b in (a, d):
                net.unblock(a, d)

    async def restart(self, b: str) -> None:
        """Start a crashed bookie; one retry when a transient fault (a pending fsync EIO)
        made it refuse, as an operator would. Damaged bookies may refuse for good."""
        sb = self.cluster.bookies[b]
        for _attempt in range(2):
            if sb.status == "refused" and b not in self.faulty:
                sb.status = "down"
            if sb.status != "down":
                return
            if await self.cluster.start_bookie(b):
                return
            if sb.damaged:
                self.cover("damaged_bookie_refused_start")
                return

    async def bounce(self, b: str) -> None:
        """Restart a bookie whose journal may have failed (the operator's move)."""
        sb = self.cluster.bookies[b]
        if sb.status == "up":
            await self.cluster.crash_bookie(b, "drop")
            await self.restart(b)

    async def restore_capacity(self, b: str) -> None:
        self.cluster.bookies[b].fs.set_capacity(1 << 40)

    async def restore_sync(self, b: str) -> None:
        self.cluster.bookies[b].fs.sync_delay = self.config.sync_delay

    async def reregister(self) -> None:
        for bid in self.cluster.up_bookies():
            bookie = self.cluster.bookies[bid].bookie
            read_only = bookie is not None and bookie.state != "writable"
            await self.cluster.admin.register_bookie(self.cluster.registration(bid, read_only))

    async def restore_cas(self) -> None:
        self.cluster.meta_cas_rate = 0.0

    async def resume(self, name: str) -> None:
        self.cluster.network.resume(name)

    # -- processes -----------------------------------------------------------------------------

    def spawn(self, cls: type[Process], prefix: str, *args: Any) -> Process:
        """Start a process of ``cls`` named ``<prefix><n>`` with a client of its own."""
        self.spawned[prefix] += 1
        name = f"{prefix}{self.spawned[prefix]}"
        proc = cls(name, self.cluster.client(name), derive_rng(self.seed, name), self.env,
                   *args)
        self.processes.append(proc)
        self.tasks[name] = asyncio.get_running_loop().create_task(self._guard(proc))
        return proc

    async def _guard(self, proc: Process) -> None:
        try:
            await proc.run()  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if is_expected(exc):
                self.log(f"{proc.name} stopped: {type(exc).__name__}: {exc}")
            else:
                proc.unexpected(exc, "died")

    async def kill_process(self, proc: Process) -> None:
        """The process dies: it stops, its connections go, its metadata session ends."""
        proc.stop()
        self.cluster.network.kill_client(proc.name)
        await proc.client.store.close()  # its metadata session dies with it
        task = self.tasks.get(proc.name)
        if task is not None:
            task.cancel()

    async def respawn(self, proc: Process) -> None:
        """A new process of the same kind takes a dead one's place."""
        self.spawn(type(proc), getattr(proc, "prefix", proc.name.rstrip("0123456789")),
                   *getattr(proc, "respawn_args", ()))

    # -- phases ----------------------------------------------------------------------------------

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        c = self.cluster
        for sb in c.bookies.values():
            sb.fs.sync_delay = self.config.sync_delay
        self.log(f"seed {self.seed} topology E,Qw,Qa={self.topology} bookies={self.n} "
                 f"{self.config.describe()} plan: {self.plan.describe()}"
                 + (f" mutations={','.join(sorted(self.mutations))}" if self.mutations else ""))
        await c.start()
        wl = self.workload
        for count_field, cls, prefix in PROCESSES:
            for _ in range(getattr(wl, count_field)):
                self.spawn(cls, prefix)
        if wl.deletes:
            self.spawn(Deleter, "d")
        for ext in self.extensions:
            await ext.start()
        safety_end = loop.time() + self.duration
        await self.inject(safety_end)
        await asyncio.sleep(max(0.0, safety_end - loop.time()))
        self.log("=== liveness phase: faults stop, network heals")
        await self.liveness()

    async def inject(self, until: float) -> None:
        """Inject the scheduled faults, each at its time (or at once, if a slow handler
        before it ran late)."""
        loop = asyncio.get_running_loop()
        for ev in self.scenario.events:
            await asyncio.sleep(max(0.0, ev.at - loop.time()))
            if loop.time() >= until:
                return
            handler = HANDLERS.get(ev.kind)
            if handler is None:
                raise ValueError(f"no handler for fault kind {ev.kind!r}")
            await handler(self, ev)

    async def liveness(self) -> None:
        loop = asyncio.get_running_loop()
        c = self.cluster
        for t in self.heal_tasks:
            t.cancel()
        for disarm in self.on_liveness:
            disarm()
        net = c.network
        net.config = net.config.quiet()
        net.heal()
        c.meta_stall_until = 0.0
        c.meta_cas_rate = 0.0
        await self.reregister()
        for sb in c.bookies.values():
            sb.fs.set_capacity(1 << 40)
            sb.fs.sync_delay = self.config.sync_delay
            sb.fs.fault_hook = None  # (a timed crash still armed)
            # Injected fsync failures that never met an fsync must not outlive the safety
            # phase (MemFileSystem has no public way to withdraw them yet).
            pending_eio = getattr(sb.fs, "_fsync_failures", None)
            if isinstance(pending_eio, list):
                pending_eio.clear()
        for p in self.processes:
            p.stop()
            if not getattr(p, "winds_down", True):  # (a reader has nothing to finish)
                task = self.tasks.get(p.name)
                if task is not None:
                    task.cancel()
        self._count_store_coverage()
        # Bookies: restart the ones that can; bounce the up ones (journal may have failed).
        for bid, sb in c.bookies.items():
            if sb.status == "up" and sb.bookie is not None and sb.bookie.state != "writable":
                await c.crash_bookie(bid, "drop")
            if sb.status in ("down", "refused"):
                await self.restart(bid)
        for bid, sb in c.bookies.items():
            if sb.status != "up" and bid not in self.faulty:
                self.history.liveness(f"restart {bid}", False,
                                      f"undamaged bookie will not start: {sb.last_error}")
        down = [b for b, sb in c.bookies.items() if sb.status != "up"]
        tolerance = self.topology[2] - 1
        spare = [b for b in c.up_bookies() if b not in self.faulty]
        # Keep one more bookie down when the atlas allows it and spares remain to replace it
        # (recovery writes back; with no replacement it cannot finish, as in BookKeeper). A
        # damaged bookie is no spare: auto-recovery moves its damaged slots to a healthy
        # bookie outside the ensemble, so the healthy ones left must still fill an ensemble.
        if not self.plan.beyond_tolerance and len(set(down) | set(self.faulty)) < tolerance \
                and spare and self.n - len(set(down) | set(self.faulty)) - 1 >= self.topology[0] \
                and self.rng.random() < 0.3:
            b = self.rng.choice(spare)
            await c.crash_bookie(b, "drop")
            down.append(b)
        self.log(f"liveness: bookies down {sorted(down)} faulty {sorted(self.faulty)}")
        # Let the workload wind down, then stop it for good.
        tasks = list(self.tasks.values())
        _done, pending = await asyncio.wait(tasks, timeout=10.0) if tasks else ((), ())
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        start = loop.time()
        await self._ledgers_live(start)
        for ext in self.extensions:
            await ext.settle()
        for sb in c.bookies.values():
            if sb.status == "up":
                await self.audit(sb, "final")
            if sb.status == "up" and not sb.damaged:
                self._inspect(sb)

    def _count_store_coverage(self) -> None:
        """Did the configuration's paths run? (overlapped batches, splits, inline syncs,
        preallocated segments, rotations, checkpoints, delta chains loaded)."""
        for sb in self.cluster.bookies.values():
            store = sb.bookie.store if sb.status == "up" and sb.bookie is not None else None
            if store is None:
                continue
            for stat, marker in (("overlapped", "batches_overlapped"),
                                 ("splits", "batches_splits"),
                                 ("inline_syncs", "inline_syncs"),
                                 ("preallocated", "segments_preallocated"),
                                 ("rotations", "segments_rotations")):
                if store.journal.stats[stat]:
                    self.coverage[f"journal_{marker}"] += store.journal.stats[stat]
            for kind in ("bases", "deltas"):  # index checkpoints, and chains loaded
                if store.checkpoint_stats[kind]:
                    self.coverage[f"checkpoint_{kind}"] += store.checkpoint_stats[kind]
            if store.report.checkpoint_deltas:
                self.coverage["checkpoint_deltas_loaded"] += store.report.checkpoint_deltas

    async def _ledgers_live(self, start: float) -> None:
        """Every ledger recovers and reads back; a new ledger takes writes."""
        loop = asyncio.get_running_loop()
        c = self.cluster
        final = Recoverer("final", c.client("final"), derive_rng(self.seed, "final"), self.env)
        for lid in list(self.registry.ledgers):
            if lid in self.registry.deleted:
                continue
            remaining = self.liveness_bound - (loop.time() - start)
            last = await final.recover(lid, how="final", final=True,
                                       bound=max(1.0, remaining))
            if last is None:
                self.history.liveness(f"recover L{lid}", False, "recovery did not complete")
        w = Writer("final-w", final.client, derive_rng(self.seed, "final-w"), self.env)
        ok = True
        try:
            # As wide as the live bookies allow (a wiped bookie stays out for good).
            e = min(self.topology[0], len(c.up_bookies()))
            qw = min(self.topology[1], e)
            qa = min(self.topology[2], qw)
            lh = await within(final.client.create_ledger(
                ensemble_size=e, write_quorum=qw, ack_quorum=qa, digest_type="CRC32C",
                password=PASSWORD), self.liveness_bound)
            self.registry.ledgers.append(lh.id)
            self.history.create("final-w", lh.id, qa=qa)
            futs = []
            for i in range(5):
                payload = f"final-w:{lh.id}:{i}".encode()
                fut = lh.append(payload)
                self.history.add_invoke("final-w", lh.id, lh.last_add_pushed, payload)
                fut.add_done_callback(lambda f, e=lh.last_add_pushed, lid=lh.id:
                                      w._done(lid, e, f))
                futs.append(fut)
            await within(gather(*futs), self.liveness_bound)
            await w._close(lh, lh.id)
            await final.recover(lh.id, how="final", final=True, bound=self.liveness_bound)
        except Exception as exc:
            ok = False
            final.expected(exc, "liveness: new ledger")
            self.history.liveness("new ledger accepts writes", False,
                                  f"{type(exc).__name__}: {exc}")
        if ok:
            self.history.liveness("new ledger accepts writes", True,
                                  f"{loop.time() - start:.3f}s after heal")

    def _inspect(self, sb: SimBookie) -> None:
        """I14: the bookie's checkpoint chain and journal agree with its segments (a bookie
        that never wrote nor loaded a checkpoint has no chain to compare: skipped)."""
        store = sb.bookie.store if sb.bookie is not None else None  # (the journal engine's)
        if not isinstance(store, LedgerStore) or not (
                store.report.checkpoint_loaded or any(store.checkpoint_stats.values())):
            return
        report = inspect_data_dir(sb.fs, DATA_DIR)
        self.cover("data_dir_inspected")
        for st in store.index.ledgers.values():
            if st.entries.holes:  # (striped ensembles leave ids out of a bookie's dense run)
                self.cover("index_ledgers_with_holes")
            if st.entries.sparse:  # (ids far off the run: recovery adds, re-replication)
                self.cover("index_ledgers_with_sparse_ids")
        if report.checkpoint.state == "ok" and report.checkpoint.deltas:
            self.cover("data_dir_inspected_with_deltas")
        if report.checkpoint.detail.startswith(("disagrees", "replay after", "its entries live")):
            self.history.index_mismatch(sb.bookie_id, report.checkpoint.detail)

    def unhandled_findings(self, loop: SimLoop) -> None:
        """Exceptions that escaped a callback or that no one retrieved from a task (the
        loop's exception handler saw them): findings unless injected faults explain them."""
        for message, exc in loop.unhandled:
            if exc is None or is_expected(exc):
                continue
            self.history.exception("loop", message, exc)


def _not_held(entries: list[int], held: Any) -> list[int]:
    """The entries (ascending) that no range ``(first, last)`` of ``held`` covers: one walk
    over both, the ranges sorted and merged first (a bookie's list may come in any order)."""
    merged = merged_ranges(held)
    out = []
    i = 0
    for e in entries:
        while i < len(merged) and merged[i][1] < e:
            i += 1
        if i == len(merged) or e < merged[i][0]:
            out.append(e)
    return out


# -- running one seed ---------------------------------------------------------------------------

#: the collector's youngest-generation threshold during a run (the default is 700)
_GC_THRESHOLD = 50_000



def run(
    seed: int,
    bookies: int | None = None,
    duration: float = 30.0,
    faults: Faults | None = None,
    workload: Workload | None = None,
    *,
    topology: tuple[int, int, int] | None = None,
    mutations: tuple[str, ...] | list[str] = (),
    liveness_bound: float = 60.0,
    max_steps: int = 400_000,
    scenario: Scenario | None = None,
    keep_history: bool = False,
) -> SimResult:
    """Run one seed and check it. See the module docstring; API.md has the contract.

    ``scenario`` runs a :class:`~pybk.sim.scenario.Scenario` (a replay file, a shrunk
    failure) instead of what ``seed`` draws; the other arguments then say nothing, except
    ``mutations`` when given (else the scenario's own)."""
    replayed = scenario is not None
    if scenario is None:
        scenario = scenario_of(seed, bookies=bookies, duration=duration, faults=faults,
                               workload=workload, topology=topology, mutations=tuple(mutations))
    else:
        scenario = scenario.copy()
        if mutations:
            scenario.mutations = tuple(mutations)
    switches = Mutations.of(scenario.mutations)
    r = SimRun(scenario, liveness_bound, switches)
    loop = SimLoop(max_time=scenario.duration + 10 * liveness_bound + 600.0, max_steps=max_steps)
    r.loop = loop
    r.history.now = loop.time  # (the run's clock, without a call through the run per event)
    findings = LogFindings(r._logged_error)
    findings.install()
    wall = time.perf_counter()
    error: str | None = None
    # A run makes and drops a few hundred thousand objects, few of them in cycles: the
    # collector's youngest generation would walk them about once per 700 allocations (a
    # thousand and more collections per run). Rarer here; the collection at the end of the
    # run (``SimLoop.shutdown``) still finalizes everything the run left in cycles.
    thresholds = gc.get_threshold()
    gc.set_threshold(_GC_THRESHOLD, *thresholds[1:])
    try:
        with sometimes.recording() as reached:
            loop.run_main(r.main())
        r.coverage.update({f"{SOMETIMES}{name}": n for name, n in reached.items()})
    except (SimDeadlock, SimTimeLimit) as exc:
        error = f"{type(exc).__name__}: {exc}"
        r.log(f"RUN ERROR {error}")
    finally:
        for ext in r.extensions:
            ending = ext.close()
            try:
                loop.run_until_complete(ending)
            except Exception:
                ending.close()
        closing = r.cluster.close()
        try:
            loop.run_until_complete(closing)
        except Exception:
            closing.close()
        loop.shutdown()
        findings.remove()
        gc.set_threshold(*thresholds)
    r.unhandled_findings(loop)
    checker = Checker(r.history, beyond_tolerance=r.plan.beyond_tolerance)
    violations = checker.run()
    for ext in r.extensions:
        violations.extend(ext.check())
    if error is not None and not r.plan.beyond_tolerance:
        violations.append(Violation("I12", -1, -1, f"the run did not finish: {error}",
                                    (len(r.trace) - 1,)))
    trace_hash = hashlib.sha256("\n".join(r.trace).encode()).hexdigest()
    ops = sum(p.ops for p in r.processes)
    stats = Stats(virtual_seconds=loop.time(), wall_seconds=time.perf_counter() - wall,
                  operations=ops, messages=r.cluster.network.messages, loop_steps=loop.steps,
                  faults=dict(sorted(r.fault_counts.items())),
                  coverage=dict(sorted(r.coverage.items())))
    result = SimResult(seed=scenario.seed, ok=not violations, violations=violations,
                       trace=r.trace, trace_hash=trace_hash, stats=stats,
                       topology=scenario.topology, bookies=scenario.bookies, plan=scenario.plan,
                       faults_spec=scenario.faults_spec, duration=scenario.duration,
                       mutations=tuple(scenario.mutations), error=error,
                       bookies_given=bookies is not None, config=scenario.config,
                       scenario=scenario, replayed=replayed,
                       history=list(r.history.events) if keep_history else None)
    # The run's objects sit in reference cycles (the run, its loop, its tasks): left alone,
    # the next run's end-of-run collection walks and frees all of them. The history is most
    # of them and nothing reads it once checked (the result keeps the trace, not the events):
    # dropped here, its events go by reference counting, at a fraction of the cost (the
    # collection's garbage goes from about 9,500 objects a seed to 4,500, its time by 40%).
    r.history.events.clear()
    r.history.acks.clear()
    return result


#: (the run's state object, before it had a public name)
_Run = SimRun
