"""``sim.run(seed, ...)``: one simulated run, from seed to checked result.

A run is a pure function of its arguments: a :class:`~pybk.sim.loop.SimLoop` (virtual time),
a :class:`~pybk.sim.cluster.SimCluster` (real bookies on simulated disks, a memory metadata
store, the simulated network) and per-subsystem ``random.Random`` objects derived from the
seed. What the seed decides is a :class:`~pybk.sim.scenario.Scenario` (topology, bookie count,
configuration, workload, network fault rates and the schedule of faults); a scenario given
in its place (``scenario=``, a replay file, a shrunk failure) runs the same way. A run has
two phases (TigerBeetle's VOPR) (listed in docs/internals.md, "pybk/sim/runner.py"): the
second is :mod:`pybk.sim.liveness`; what the run sees of bookies is :mod:`pybk.sim.observer`.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from pybk.client.context import ClientConfig
from pybk.metadata.memory_watches import PolledDelivery
from pybk.runtime import sometimes
from pybk.sim import tablefaults
from pybk.sim.autorecovery import AutoRecoverySim
from pybk.sim.checker import Checker, Violation
from pybk.sim.cluster import SimBookie, SimCluster, derive_rng
from pybk.sim.configs import SimConfig
from pybk.sim.faults import Faults
from pybk.sim.findings import LogFindings, is_expected
from pybk.sim.history import History
from pybk.sim.injectors import HANDLERS
from pybk.sim.ledger_modes import LedgerModes
from pybk.sim.liveness import liveness_phase
from pybk.sim.logs import LogWorkload
from pybk.sim.loop import SimDeadlock, SimLoop, SimTimeLimit
from pybk.sim.net import NetConfig
from pybk.sim.observer import RunObserver
from pybk.sim.racks import RackPlacementSim
from pybk.sim.result import SimResult, Stats
from pybk.sim.scenario import Scenario, draw_schedule
from pybk.sim.tables import TableWorkload
from pybk.sim.tenancy import TenancySim
from pybk.sim.tenancy_gate import TenancyGateSim
from pybk.sim.userapp import UserApp
from pybk.sim.workload import (
    Deleter,
    Process,
    ProcessEnv,
    Reader,
    Recoverer,
    Registry,
    Workload,
    Writer,
)
from pybk.testing.mutations import NO_MUTATIONS, Mutations
from pybk.wire import Request

__all__ = ["EXTENSIONS", "PROCESSES", "SOMETIMES", "TOPOLOGIES", "Extension", "SimResult",
           "SimRun", "Stats", "run", "scenario_of"]

#: what the cluster counts that is coverage (a path run), not a fault injected
_CLUSTER_COVERAGE = frozenset({"bookie_refused_start", "scrubber_found_damage"})

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
    "ledger_modes": LedgerModes.for_run,
    "logs": LogWorkload.for_run,
    "racks": RackPlacementSim.for_run,
    "tables": TableWorkload.for_run, "tenancy": TenancySim.for_run, "app": UserApp.for_run,
    "tenancy_gate": TenancyGateSim.for_run,
}


def scenario_of(seed: int, *, bookies: int | None = None, duration: float = 30.0,
                faults: Faults | None = None, workload: Workload | None = None,
                topology: tuple[int, int, int] | None = None,
                mutations: tuple[str, ...] = ()) -> Scenario:
    """What ``seed`` draws: topology, bookies, configuration, fault plan and schedule."""
    faults = faults if faults is not None else Faults.all()
    rng = derive_rng(seed, "runner")
    topo = topology or rng.choice([t for t in TOPOLOGIES if bookies is None or t[0] <= bookies])
    n = bookies if bookies is not None else topo[0] + rng.choice((0, 1, 1, 2))
    plan = faults.swarm(derive_rng(seed, "swarm"), lambda name: derive_rng(seed, name))
    wl = workload or Workload.draw(derive_rng(seed, "workload"),
                                   lambda name: derive_rng(seed, name))
    events = draw_schedule(plan, seed, duration)
    if wl.table_clients and tablefaults.KIND in faults.kinds:  # (the tables' own stream)
        events = tablefaults.merge(events, tablefaults.table_events(seed, duration))
    return Scenario(seed=seed, duration=duration, topology=topo, bookies=n,
                    config=SimConfig.draw(seed), workload=wl, plan=plan, events=events,
                    faults_spec=faults.spec(), mutations=tuple(mutations))


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
        if scenario.plan.polled_watches:
            self.coverage["config_watches_polled"] += 1
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
        #: seconds added to the virtual time for the wall clock the logs read (clock jumps)
        self.wall_offset = 0.0
        #: the adds sent, the bookies' answers, the ledgers deleted (``observer.deleted``)
        self.observer = RunObserver(self.history, self.cover)
        self.env = ProcessEnv(
            history=self.history, registry=self.registry, cover=self.cover,
            topology=self.topology, workload=self.workload,
            batched_adds=self.config.batched_adds,
            was_sent=self.observer.was_sent,
            wall_clock=self.wall_clock,
        )
        net = NetConfig(drop=self.plan.drop, duplicate=self.plan.duplicate,
                        reorder=self.plan.reorder, corrupt=self.plan.corrupt,
                        reset=self.plan.reset)
        self.cluster = SimCluster(self.seed, self.n, net=net, log=self.log,
                                  count=self.count_fault, client_config=self.client_config(),
                                  bookie_config=self.config.bookie_config(mutations),
                                  watch_delivery=self._watch_delivery())
        self.observer.watch(self.cluster)
        self.cluster.network.on_handler_error = self._handler_error
        self.extensions: list[Extension] = [
            ext for ext in (make(self) for _name, make in sorted(EXTENSIONS.items()))
            if ext is not None]

    def _watch_delivery(self) -> PolledDelivery | None:
        """How metadata watches arrive: at once, or (the plan's switch) as real backends
        deliver them, with a poll interval and an establishment delay drawn from a stream
        of their own (the other draws of the seed stay as they were). The run's mutation
        switches go with it (``watch_baseline_at_first_poll``)."""
        if not self.plan.polled_watches:
            return None
        rng = derive_rng(self.seed, "watches")
        return PolledDelivery(
            poll_interval=rng.choice((0.02, 0.05, 0.2)),
            establish_delay=rng.choice((0.0, 0.05, 0.3)), rng=rng, mutations=self.mutations)

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
        if kind.startswith("bookie_state_") or kind in _CLUSTER_COVERAGE:
            self.coverage[kind] += 1
        else:
            self.fault_counts[kind] += 1

    def cover(self, marker: str) -> None:
        self.coverage[marker] += 1

    def fault(self, target: str, kind: str, detail: str = "") -> None:
        self.fault_counts[kind] += 1
        self.history.fault(target, kind, detail)

    def client_config(self) -> ClientConfig:
        """What every simulated client of the run gets (writers, auto-recovery, the admin):
        timeouts on the virtual clock's scale and the seed's drawn client knobs."""
        return ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.5,
                            long_poll_timeout=1.0, explicit_lac_interval=0.5,
                            long_poll_parallel=self.config.parallel_long_polls,
                            immediate_lac=self.config.immediate_lac,
                            immediate_lac_delay=self.config.lac_delay, mutations=self.mutations)

    # -- observing from the outside (errors; the bookies' answers: pybk.sim.observer) --------

    def _handler_error(self, bookie: str, request: Request, exc: BaseException) -> None:
        import traceback

        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.history.exception(bookie, f"handling {type(request).__name__}", exc, tb)

    def _logged_error(self, logger: str, exc: BaseException, text: str) -> None:
        self.history.exception(logger, "logged", exc, text)

    # -- what fault handlers use (pybk.sim.injectors) -------------------------------------------

    async def audit(self, sb: SimBookie, how: str) -> None:
        """Does the bookie hold every entry it acknowledged? (:meth:`RunObserver.audit`)"""
        await self.observer.audit(sb, how)

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
        """Live writers of the ledger workload (of its registry: not another tenant's)."""
        return [p for p in self.processes
                if isinstance(p, Writer) and not p.stopping and p.reg is self.registry]

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
        for ext in self.extensions:  # (checks of the safety phase still under way: bounded)
            pending = getattr(ext, "before_liveness", None)
            if pending is not None:
                await pending()
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
        """The second phase (:func:`pybk.sim.liveness.liveness_phase`)."""
        await liveness_phase(self)

    def unhandled_findings(self, loop: SimLoop) -> None:
        """Exceptions that escaped a callback or that no one retrieved from a task (the
        loop's exception handler saw them): findings unless injected faults explain them."""
        for message, exc in loop.unhandled:
            if exc is None or is_expected(exc):
                continue
            self.history.exception("loop", message, exc)


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
