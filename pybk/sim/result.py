"""What one simulated run returns (:func:`pybk.sim.runner.run`): its verdict (the invariants
violated), its trace and the trace's hash, its counts (:class:`Stats`), everything it was made
of (the scenario) and the commands that replay and shrink it. Apart from the runner:
reports, sweeps and shrinking read results without running anything.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from pybk.sim.checker import Violation
from pybk.sim.configs import SimConfig
from pybk.sim.faults import FaultPlan
from pybk.sim.scenario import Scenario

__all__ = ["SimResult", "Stats"]


@dataclass
class Stats:
    """What a run did: virtual and wall time, operations, messages, loop steps, faults
    injected by kind, coverage markers reached."""

    virtual_seconds: float = 0.0
    wall_seconds: float = 0.0
    operations: int = 0
    messages: int = 0
    loop_steps: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    coverage: dict[str, int] = field(default_factory=dict)


@dataclass
class SimResult:
    """One run's outcome (``ok``: no invariant violated) and how to run it again."""

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
