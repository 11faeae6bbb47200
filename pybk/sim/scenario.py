"""A run's fault schedule, and the scenario file that replays a run (and a shrunk one).

A seed's faults are drawn up front as a **schedule**: a list of :class:`FaultEvent` (when,
what kind, and a seed of its own from which the event draws its targets). While the run goes,
each event records what it resolved (which bookie, which crash mode, how long it held) in its
``params``; given again, those params are used as they are. So a schedule can be replayed,
edited by hand, or cut down by the shrinker (:mod:`pybk.sim.shrink`) without the remaining
events changing their minds.

A :class:`Scenario` is everything a run is made of: seed, topology, bookies, duration, the
configuration (:class:`~pybk.sim.configs.SimConfig`), the workload, the fault plan (the
network's fault rates, the kinds the seed allowed and their weights) and the schedule, plus
the mutation switches and, for a shrunk failure, the invariant it violates.
``Scenario.save(path)`` writes it as JSON; ``pybk simulate --replay FILE`` runs it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from pybk.sim.cluster import derive_rng
from pybk.sim.configs import SimConfig
from pybk.sim.faults import FaultPlan
from pybk.sim.workload import Workload

__all__ = ["FORMAT", "FaultEvent", "Scenario", "draw_schedule"]

#: what a scenario file says it is
FORMAT = "pybk-sim-scenario"
_VERSION = 1
T = TypeVar("T")


@dataclass
class FaultEvent:
    """One scheduled fault: at virtual time ``at``, of kind ``kind``; ``params`` are the
    targets it resolved (filled in while it runs, drawn from ``seed`` when absent)."""

    at: float
    kind: str
    seed: int
    params: dict[str, Any] = field(default_factory=dict)
    _rng: random.Random | None = field(default=None, repr=False, compare=False)

    @property
    def rng(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(f"pybk-sim-fault:{self.seed}")
        return self._rng

    def pick(self, name: str, options: Sequence[T]) -> T:
        """The ``name`` target: as recorded, else drawn from ``options`` (and recorded). A
        recorded target may no longer be among the options (a shrunk schedule): the caller
        checks it still makes sense."""
        if name in self.params:
            return self.params[name]  # type: ignore[no-any-return]
        value = self.rng.choice(list(options))
        self.params[name] = value
        return value

    def draw(self, name: str, make: Callable[[random.Random], T]) -> T:
        """A drawn quantity (a duration, a mode), recorded like :meth:`pick`."""
        if name in self.params:
            return self.params[name]  # type: ignore[no-any-return]
        value = make(self.rng)
        self.params[name] = value
        return value

    def describe(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"@{self.at:.3f} {self.kind} {args}".rstrip()

    def to_doc(self) -> dict[str, Any]:
        return {"at": self.at, "kind": self.kind, "seed": self.seed, "params": self.params}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> FaultEvent:
        return cls(float(doc["at"]), str(doc["kind"]), int(doc["seed"]),
                   dict(doc.get("params", {})))

    def fresh(self) -> FaultEvent:
        """A copy to run again (its params copied, its generator restarted)."""
        return FaultEvent(self.at, self.kind, self.seed, json.loads(json.dumps(self.params)))


def draw_schedule(plan: FaultPlan, seed: int, until: float) -> list[FaultEvent]:
    """The scheduled faults of a seed's safety phase: exponential gaps of the plan's mean
    interval, kinds by the plan's weights, a seed of its own per event."""
    if not plan.events:
        return []
    rng = derive_rng(seed, "faults")
    weights = [plan.weights[k] for k in plan.events]
    out: list[FaultEvent] = []
    t = 0.0
    while True:
        t += rng.expovariate(1.0 / plan.mean_interval)
        if t >= until:
            return out
        out.append(FaultEvent(round(t, 6), rng.choices(plan.events, weights)[0],
                              rng.getrandbits(32)))


@dataclass
class Scenario:
    """Everything one run is made of (see the module docstring)."""

    seed: int
    duration: float
    topology: tuple[int, int, int]
    bookies: int
    config: SimConfig
    workload: Workload
    plan: FaultPlan
    events: list[FaultEvent]
    faults_spec: str = "all"
    mutations: tuple[str, ...] = ()
    #: the invariant a shrunk failure violates ("" for a plain run)
    expect: str = ""
    note: str = ""
    #: the file it was loaded from or last saved to ("" if none; not part of the file):
    #: what a replay's "reproduce" command names
    source: str = field(default="", compare=False)

    def to_doc(self) -> dict[str, Any]:
        plan = asdict(self.plan)
        return {
            "format": FORMAT, "version": _VERSION, "seed": self.seed,
            "duration": self.duration, "topology": list(self.topology),
            "bookies": self.bookies, "config": self.config.to_doc(),
            "workload": asdict(self.workload), "plan": plan,
            "events": [e.to_doc() for e in self.events], "faults": self.faults_spec,
            "mutations": list(self.mutations), "expect": self.expect, "note": self.note,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Scenario:
        if doc.get("format") != FORMAT:
            raise ValueError(f"not a scenario file (format {doc.get('format')!r}, "
                             f"expected {FORMAT!r})")
        if doc.get("version") != _VERSION:
            raise ValueError(f"scenario format version {doc.get('version')!r} is not "
                             f"{_VERSION}")
        wl_fields = {f.name for f in fields(Workload)}
        wl: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                              for k, v in doc["workload"].items() if k in wl_fields}
        events = [FaultEvent.from_doc(e) for e in doc["events"]]
        plan = FaultPlan(**doc["plan"])
        return cls(
            seed=int(doc["seed"]), duration=float(doc["duration"]),
            topology=(int(doc["topology"][0]), int(doc["topology"][1]),
                      int(doc["topology"][2])),
            bookies=int(doc["bookies"]), config=SimConfig.from_doc(doc["config"]),
            workload=Workload(**wl), plan=plan, events=events,
            faults_spec=str(doc.get("faults", "all")),
            mutations=tuple(doc.get("mutations", ())), expect=str(doc.get("expect", "")),
            note=str(doc.get("note", "")),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Scenario:
        return cls.from_doc(json.loads(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())
        self.source = str(path)

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        out = cls.from_json(Path(path).read_text())
        out.source = str(path)
        return out

    def copy(self, **changes: Any) -> Scenario:
        """A copy to run again (events made fresh), with ``changes`` applied."""
        doc = self.to_doc()
        out = Scenario.from_doc(json.loads(json.dumps(doc)))
        out.source = self.source
        for name, value in changes.items():
            setattr(out, name, value)
        return out
