"""A seed gives the same trace on every supported Python (3.11, 3.12, 3.13): a failing seed
found in CI replays on a developer's machine whatever CPython it has.

The other interpreters come from ``PYBK_OTHER_PYTHONS`` (space-separated executables, each
with pybk's dependencies installed): ``make test`` sets it to the venvs ``make test-matrix``
made. Each runs this very pybk (a copy of the package imported here, first on its path), so
the comparison is between interpreters, not between builds. Without other interpreters the
test is skipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pybk
from pybk.sim.sweep import sweep

pytestmark = pytest.mark.slow

SEEDS = range(200)
DURATION = 10.0
#: absolute: they run from another directory (make passes paths relative to the checkout)
OTHERS = [os.path.abspath(p) for p in os.environ.get("PYBK_OTHER_PYTHONS", "").split()]

SCRIPT = """
import json, sys
import pybk
from pybk.sim.sweep import sweep
assert pybk.__file__.startswith(sys.argv[1]), pybk.__file__
r = sweep(range(int(sys.argv[2])), faults="all", duration=float(sys.argv[3]), workers=2)
print(json.dumps({"version": sys.version.split()[0],
                  "hashes": {str(s.seed): s.trace_hash for s in r.seeds}}))
"""


def hashes_here() -> dict[str, str]:
    r = sweep(SEEDS, faults="all", duration=DURATION, workers=2)
    return {str(s.seed): s.trace_hash for s in r.seeds}


@pytest.mark.skipif(not OTHERS, reason="no other interpreter given (PYBK_OTHER_PYTHONS)")
@pytest.mark.timeout(900)  # (three interpreters x 200 seeds: ~160 s alone, more in the suite)
def test_a_few_hundred_seeds_give_the_same_traces_on_every_interpreter(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(Path(pybk.__file__).parent, src / "pybk",
                    ignore=shutil.ignore_patterns("__pycache__"))
    here = hashes_here()
    assert len(here) == len(SEEDS)
    mine = sys.version.split()[0]
    for python in OTHERS:
        out = subprocess.run(
            [python, "-c", SCRIPT, str(src), str(len(SEEDS)), str(DURATION)],
            env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True,
            timeout=900, cwd=src.parent)  # (not the checkout: `-c` puts the cwd first on the path)
        assert out.returncode == 0, out.stderr[-2000:]
        there = json.loads(out.stdout.splitlines()[-1])
        differ = [s for s in here if here[s] != there["hashes"].get(s)]
        assert not differ, (f"{len(differ)} of {len(here)} seeds give another trace on Python "
                            f"{there['version']} than on {mine}: {differ[:20]}")
