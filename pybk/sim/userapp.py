"""Simulating your own application: pybk sweeps seeds over it the way it sweeps itself.

``sim.check(app, check, seeds=range(100))`` runs ``await app(cluster, record)`` in each seed's
simulated cluster, with the faults that seed draws (bookie crashes, partitions, disk faults,
and the crash or pause of the application process itself, which then starts again: ``app`` is
called anew). ``record(*values)`` notes what the application wants judged; once the faults
stop, ``app`` runs a last time with ``cluster.final`` set (to read back what it kept), and
``check(history)`` (a list of :class:`Record`) returns the violations it finds.
"""

from __future__ import annotations

import asyncio
import contextvars
import multiprocessing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pybk.sim.checker import Violation
from pybk.sim.faults import Faults
from pybk.sim.findings import EXPECTED
from pybk.sim.workload import Process, Workload

if TYPE_CHECKING:
    from pybk.sim.result import SimResult
    from pybk.sim.runner import SimRun

__all__ = ["AppCluster", "CheckReport", "Failure", "Record", "UserApp", "check", "run_app"]

#: the record a user's ``check`` reads: virtual time, the process incarnation, its values
@dataclass(frozen=True)
class Record:
    time: float
    process: str
    values: tuple[Any, ...]


App = Callable[["AppCluster", Callable[..., None]], Awaitable[None]]
Check = Callable[[list[Record]], list[str]]

#: the application of the runs made in this context (set by :func:`run_app`)
_current: contextvars.ContextVar[tuple[App, Check] | None] = contextvars.ContextVar(
    "pybk_sim_app", default=None)

#: the load of a user's run: no ledger or log workload of pybk's own, only the application
APP_WORKLOAD = Workload(writers=0, readers=0, recoverers=0, deletes=False, log_writers=0,
                        log_readers=0)


class AppCluster:
    """What the application is handed: the simulated cluster, through its own client."""

    def __init__(self, process: AppProcess, final: bool) -> None:
        self._process = process
        #: True in the last run, after the faults stopped: read back, record, return
        self.final = final

    @property
    def name(self) -> str:
        """This incarnation of the application process (``app1``, ``app2`` after a crash)."""
        return self._process.name

    @property
    def stopping(self) -> bool:
        """The run wants the application to return (faults stopped)."""
        return self._process.stopping

    def client(self) -> Any:
        """This process's :class:`pybk.Client` on the simulated bookies."""
        return self._process.client

    def namespace(self, name: str = "default") -> Any:
        """Logs of a namespace (:class:`pybk.Namespace`) through this process's client."""
        return self._process.client.namespace(name)

    async def wal(self, name: str = "wal") -> Any:
        """A :class:`pybk.AsyncWAL` named ``name`` on the simulated bookies, opened (it fences
        an earlier incarnation's); close it with ``await wal.close()``."""
        from pybk.wal import AsyncWAL

        return await AsyncWAL(name=name, client=self._process.client).open()


class AppProcess(Process):
    """One incarnation of the user's application in a run."""

    is_writer = True  # (the writer faults, pause and crash, aim at it too)
    prefix = "app"

    def __init__(self, name: str, client: Any, rng: Any, env: Any, ext: UserApp,
                 final: bool = False) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.final = final
        self.respawn_args = (ext,)

    def record(self, *values: Any) -> None:
        self.ext.records.append(Record(asyncio.get_running_loop().time(), self.name, values))

    async def run(self) -> None:
        try:
            await self.ext.app(AppCluster(self, self.final), self.record)
        except EXPECTED as exc:  # a fault the application could not get past
            self.log(f"ended: {type(exc).__name__}: {exc}")
        except Exception as exc:
            self.unexpected(exc, "application")


class UserApp:
    """The run's extension that runs the application and judges its records."""

    name = "app"

    @classmethod
    def for_run(cls, run: SimRun) -> UserApp | None:
        current = _current.get()
        return cls(run, *current) if current is not None else None

    def __init__(self, run: SimRun, app: App, check: Check) -> None:
        self.run = run
        self.app = app
        self.check_fn = check
        self.records: list[Record] = []
        self.final_done = False

    async def start(self) -> None:
        self.run.spawn(AppProcess, "app", self)

    async def settle(self) -> None:
        proc = self.run.spawn(AppProcess, "final", self, True)
        task = self.run.tasks[proc.name]
        done, _ = await asyncio.wait({task}, timeout=self.run.liveness_bound)
        self.final_done = bool(done)
        self.run.history.liveness("application's final run", self.final_done,
                                  "" if done else "did not return")

    def check(self) -> list[Violation]:
        try:
            problems = self.check_fn(list(self.records))
        except Exception as exc:  # the user's check is code too
            problems = [f"check raised {type(exc).__name__}: {exc}"]
        return [Violation("U1", -1, -1, p) for p in problems]

    async def close(self) -> None:
        pass


@dataclass
class Failure:
    """A seed whose application check failed, with what reproduces it."""

    seed: int
    violations: list[str]
    command: str
    report: str


@dataclass
class CheckReport:
    """What :func:`check` found over its seeds."""

    seeds: int = 0
    failing: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failing


def run_app(app: App, check_fn: Check, seed: int, *, faults: str = "all",
            duration: float = 30.0, bookies: int = 5, keep_history: bool = False) -> SimResult:
    """One seed of the application (what :func:`check` runs per seed). ``bookies``: enough
    for the application's ensembles plus spares (a bookie lost for good is decommissioned,
    which needs somewhere to move its ledgers)."""
    from pybk.sim.runner import run

    token = _current.set((app, check_fn))
    try:
        return run(seed, bookies=bookies, duration=duration, faults=Faults.parse(faults),
                   workload=APP_WORKLOAD, keep_history=keep_history)
    finally:
        _current.reset(token)


def _describe(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _one(args: tuple[App, Check, int, str, float, int]) -> tuple[int, bool, list[str], str]:
    app, check_fn, seed, faults, duration, bookies = args
    r = run_app(app, check_fn, seed, faults=faults, duration=duration, bookies=bookies)
    return seed, r.ok, [f"{v.invariant} {v.message}" for v in r.violations], r.report()


def check(app: App, check_fn: Check, seeds: Iterable[int] = range(100), *,
          faults: str = "all", duration: float = 30.0, bookies: int = 5,
          workers: int = 1) -> CheckReport:
    """Run ``app`` in each seed's simulated cluster and judge it with ``check_fn`` (see the
    module doc); ``workers`` > 1 runs seeds in worker processes (``app`` and ``check_fn``
    must then be module-level functions)."""
    Faults.parse(faults)  # (a bad spec is refused before any run)
    jobs = [(app, check_fn, s, faults, duration, bookies) for s in seeds]
    if workers > 1:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers) as pool:
            results = pool.map(_one, jobs)
    else:
        results = [_one(job) for job in jobs]
    out = CheckReport(seeds=len(results))
    for seed, ok, violations, report in results:
        if not ok:
            command = (f"pybk.sim.check({_describe(app)}, {_describe(check_fn)}, "
                       f"seeds=[{seed}], faults={faults!r}, duration={duration:g}, "
                       f"bookies={bookies})")
            out.failing.append(Failure(seed, violations, command, report))
    return out

