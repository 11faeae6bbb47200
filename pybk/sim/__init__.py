"""Deterministic simulation: whole clusters with injected faults from a seed, and a checker.

    from pybk import sim
    result = sim.run(seed=1234, bookies=5, duration=30.0, faults=sim.Faults.all())
    result.ok, result.violations, result.trace, result.trace_hash, result.stats
    result.scenario.save("run.json"); sim.run(0, scenario=sim.Scenario.load("run.json"))
    sim.shrink(result.scenario, "L1")      # a failing run, cut down to what it needs

See docs/simulation.md. A user's own tests get a simulated cluster from
:class:`pybk.testing.SimTestCluster` (the ``sim_cluster`` pytest fixture).
"""

from pybk.sim.checker import Checker, Violation
from pybk.sim.cluster import SimCluster
from pybk.sim.configs import SimConfig
from pybk.sim.faults import FaultPlan, Faults
from pybk.sim.gcsim import GcSim  # (registers itself among the runner's EXTENSIONS)
from pybk.sim.history import History
from pybk.sim.loop import SimDeadlock, SimLoop, SimTimeLimit
from pybk.sim.mirror import MirrorSim  # (registers itself among the runner's EXTENSIONS)
from pybk.sim.net import NetConfig, SimNetwork, SimTransport
from pybk.sim.result import SimResult, Stats
from pybk.sim.runner import TOPOLOGIES, run
from pybk.sim.scenario import FaultEvent, Scenario
from pybk.sim.shrink import ShrinkResult, shrink
from pybk.sim.userapp import CheckReport, Failure, Record, check, run_app
from pybk.sim.workload import Workload

__all__ = [
    "TOPOLOGIES",
    "CheckReport",
    "Checker",
    "Failure",
    "FaultEvent",
    "FaultPlan",
    "Faults",
    "GcSim",
    "History",
    "MirrorSim",
    "NetConfig",
    "Record",
    "Scenario",
    "ShrinkResult",
    "SimCluster",
    "SimConfig",
    "SimDeadlock",
    "SimLoop",
    "SimNetwork",
    "SimResult",
    "SimTimeLimit",
    "SimTransport",
    "Stats",
    "Violation",
    "Workload",
    "check",
    "run",
    "run_app",
    "shrink",
]
