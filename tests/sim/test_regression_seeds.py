"""Replay tests/sim/regression_seeds.txt: every seed that once failed stays fixed (or, with
its mutation on, stays caught by an invariant the switch breaks, and passes without it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mutations_kit import EXPECTED

from pybk.sim.faults import Faults
from pybk.sim.runner import run

SEEDS_FILE = Path(__file__).with_name("regression_seeds.txt")


def load() -> list[tuple[int, str, float, str]]:
    rows = []
    for raw in SEEDS_FILE.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        seed, faults, duration = int(parts[0]), parts[1], float(parts[2])
        rows.append((seed, faults, duration, parts[3] if len(parts) > 3 else ""))
    return rows


#: Seeds blocked by an open bug in another layer (strict: the test fails once it is fixed,
#: so the marker gets removed). See KNOWN_BUGS in test_ci_sweep.py.
BLOCKED: dict[int, str] = {}


def params() -> list[object]:
    out: list[object] = []
    for seed, faults, duration, mutation in load():
        marks = []
        if not mutation and seed in BLOCKED:
            marks.append(pytest.mark.xfail(strict=True, reason=BLOCKED[seed]))
        out.append(pytest.param(seed, faults, duration, mutation, marks=marks))
    return out


@pytest.mark.parametrize(("seed", "faults", "duration", "mutation"), params())
def test_regression_seed(seed: int, faults: str, duration: float, mutation: str) -> None:
    r = run(seed, duration=duration, faults=Faults.parse(faults),
            mutations=(mutation,) if mutation else ())
    if mutation:
        caught = {v.invariant for v in r.violations} & EXPECTED[mutation]
        assert caught, (f"seed {seed} no longer catches {mutation} by what it breaks "
                        f"({sorted(EXPECTED[mutation])}):\n{r.report()}")
        clean = run(seed, duration=duration, faults=Faults.parse(faults))
        assert clean.ok, f"seed {seed} fails without {mutation} too:\n{clean.report()}"
    else:
        assert r.ok, r.report()
