"""Shrinking a failing run to a minimal scenario that still violates the same invariant.

``shrink(scenario, invariant)`` is a delta-debugging loop (Zeller's ddmin) over what a run is
made of, each candidate run from scratch on the simulator (a run is a pure function of its
scenario, so "still fails" is a fact, not a guess):

1. the fault schedule: ddmin over its events (each keeps the targets it resolved in the
   original run, so the events left do the same thing), then each event alone;
2. the network's fault rates: each one set to zero;
3. the workload and configuration: fewer processes of each kind, no deleter, no truncations,
   single adds, no frequent checkpoints, plain segments, a serial journal;
4. the duration: cut to just after the last fault, then halved while it still fails;
5. the schedule once more (fewer processes may need fewer faults);
6. the fault plan and spec narrowed to the faults left (:func:`remaining_faults`), so the
   report's header and the file name only those.

The result is a :class:`~pybk.sim.scenario.Scenario` with ``expect`` set to the invariant:
``Scenario.save(path)`` writes it, ``pybk simulate --replay path`` runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pybk.sim.faults import NET_KINDS, FaultPlan
from pybk.sim.scenario import FaultEvent, Scenario

__all__ = ["ShrinkResult", "ddmin", "remaining_faults", "shrink"]

T = TypeVar("T")


@dataclass
class ShrinkResult:
    scenario: Scenario
    invariant: str
    runs: int
    events_before: int
    #: one line per accepted step ("events 23 -> 4", "drop rate -> 0", ...)
    steps: list[str] = field(default_factory=list)

    @property
    def events_after(self) -> int:
        return len(self.scenario.events)


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool]) -> list[T]:
    """A smallest-found sublist of ``items`` for which ``fails`` holds (``fails(items)`` is
    assumed): Zeller's ddmin, then single removals until no one item can go."""
    current = list(items)
    if fails([]):
        return []
    n = 2
    while len(current) >= 2:
        size = -(-len(current) // n)
        chunks = [current[i:i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if len(chunk) < len(current) and fails(chunk):
                current, n = chunk, max(n - 1, 2)
                break
        else:
            for i in range(len(chunks)):
                rest = [x for j, c in enumerate(chunks) if j != i for x in c]
                if rest and len(rest) < len(current) and fails(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(len(current), 2 * n)
    changed = True
    while changed and current:
        changed = False
        for i in range(len(current)):
            rest = current[:i] + current[i + 1:]
            if fails(rest):
                current, changed = rest, True
                break
    return current


def shrink(
    scenario: Scenario,
    invariant: str,
    *,
    max_runs: int = 400,
    on_step: Callable[[str], None] | None = None,
    run_fn: Callable[[Scenario], set[str]] | None = None,
) -> ShrinkResult:
    """Shrink ``scenario`` (a failing run's, its events resolved) while it still violates
    ``invariant``. ``run_fn(scenario)`` gives the invariants a run violates (default: a
    simulator run); at most ``max_runs`` runs are made."""
    from pybk.sim.runner import run

    def simulate(sc: Scenario) -> set[str]:
        return {v.invariant for v in run(sc.seed, scenario=sc).violations}

    runner = run_fn or simulate
    result = ShrinkResult(scenario.copy(), invariant, 0, len(scenario.events))
    seen: dict[str, bool] = {}

    def fails(sc: Scenario) -> bool:
        key = sc.to_json()
        if key in seen:
            return seen[key]
        if result.runs >= max_runs:
            return False
        result.runs += 1
        ok = invariant in runner(sc.copy())
        seen[key] = ok
        return ok

    def note(text: str) -> None:
        result.steps.append(text)
        if on_step is not None:
            on_step(text)

    def try_change(label: str, **changes: object) -> bool:
        candidate = result.scenario.copy(**changes)
        if fails(candidate):
            result.scenario = candidate
            note(label)
            return True
        return False

    def only_what_remains() -> None:
        plan, spec = remaining_faults(result.scenario)
        if plan != result.scenario.plan or spec != result.scenario.faults_spec:
            try_change(f"faults -> {spec}", plan=plan, faults_spec=spec)

    def shrink_events() -> None:
        before = len(result.scenario.events)

        def events_fail(events: list[FaultEvent]) -> bool:
            return fails(result.scenario.copy(events=[e.fresh() for e in events]))

        kept = ddmin(result.scenario.events, events_fail)
        result.scenario = result.scenario.copy(events=[e.fresh() for e in kept])
        if len(kept) != before:
            note(f"fault events {before} -> {len(kept)}")

    if not fails(result.scenario):
        raise ValueError(f"the scenario does not violate {invariant} (nothing to shrink)")
    shrink_events()
    plan = result.scenario.plan
    for rate in ("drop", "duplicate", "reorder", "corrupt", "reset"):
        if getattr(plan, rate):
            zero: dict[str, Any] = {rate: 0.0}
            try_change(f"{rate} rate -> 0", plan=dataclasses.replace(result.scenario.plan, **zero))
    wl = result.scenario.workload
    for name in ("readers", "recoverers", "log_readers", "writers", "log_writers",
                 "adv_writers", "deferred_writers"):
        while getattr(result.scenario.workload, name) > 0:
            fewer: dict[str, Any] = {name: getattr(result.scenario.workload, name) - 1}
            if not try_change(f"{name} -> {fewer[name]}", workload=dataclasses.replace(
                    result.scenario.workload, **fewer)):
                break
    simpler: list[tuple[str, Any]] = [("deletes", False), ("log_truncates", False)]
    for name, value in simpler:
        if getattr(wl, name) != value:
            off: dict[str, Any] = {name: value}
            try_change(f"{name} -> {value}",
                       workload=dataclasses.replace(result.scenario.workload, **off))
    cfg = result.scenario.config
    simpler = [("batched_adds", False), ("checkpoints", False), ("preallocate", False),
               ("journal", "serial")]
    for name, value in simpler:
        if getattr(cfg, name) != value:
            off = {name: value}
            try_change(f"{name} -> {value}",
                       config=dataclasses.replace(result.scenario.config, **off))
    last = max((e.at for e in result.scenario.events), default=0.0)
    duration = result.scenario.duration
    cut = round(last + 2.0, 3)
    if cut < duration and try_change(f"duration -> {cut:g}s", duration=cut):
        duration = cut
    while duration > max(2.0, last + 0.5):
        half = round(max(duration / 2, last + 0.5), 3)
        if half >= duration or not try_change(f"duration -> {half:g}s", duration=half):
            break
        duration = half
    shrink_events()
    only_what_remains()
    result.scenario = result.scenario.copy(expect=invariant)
    return result


def remaining_faults(scenario: Scenario) -> tuple[FaultPlan, str]:
    """``scenario``'s fault plan and spec narrowed to the faults it still injects: the event
    kinds left in its schedule (their weights kept) and the network faults whose rates are
    not zero (what a report header and ``--faults`` should name for a shrunk scenario)."""
    plan = scenario.plan
    kinds = {e.kind for e in scenario.events}
    events = [k for k in plan.events if k in kinds] + sorted(kinds - set(plan.events))
    narrowed = dataclasses.replace(plan, events=events,
                                   weights={k: plan.weights.get(k, 1) for k in events})
    spec = ",".join([k for k in NET_KINDS if getattr(plan, k)] + events) or "none"
    return narrowed, spec + (",beyond" if plan.beyond_tolerance else "")
