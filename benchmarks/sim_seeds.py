"""Simulator throughput: CPU seconds per seed (30 virtual seconds, all faults), and what
10,000 seeds would take on N cores.

Each seed runs as in a sweep's worker process (``pybk simulate --workers N``): everything
loaded first, then frozen out of the collector's way (``--plain``: without that).
CPU time of this process (``time.process_time``), not wall time: on a machine others share, a
seed's wall time grows with their load while its CPU time barely does. Seeds run in this
process one after another (no worker pool), each a whole ``sim.run``: safety phase, liveness
phase, audits and the checker.

The seeds run with the ``pybk`` package of the checkout this script is in (not whichever
``pybk`` the interpreter has installed: a worktree measures its own code). ``--compare DIR``
also runs the same seeds with the ``pybk`` package found in DIR (another checkout, e.g. ``git
worktree add /tmp/base <commit>``), alternating rounds, so both figures come from the same
minutes of the machine; it prints the ratio.

    python benchmarks/sim_seeds.py [--seeds 0..39] [--rounds 2] [--compare /tmp/base]

The interpreter's build counts as much as a round of cuts: the same seeds cost about 0.88x
the CPU on Debian's CPython 3.11 (libpython linked into the executable) as on a pyenv
build with a shared libpython. The figures of docs/simulation.md say which ran them.

The long run the issue asks for (10,000 seeds, all faults, 2 workers), best on a quiet
machine:

    time pybk simulate --seeds 0..9999 --faults all --workers 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

_CHILD = textwrap.dedent("""
    import gc, json, logging, sys, time
    logging.getLogger("pybk").setLevel(logging.CRITICAL)
    from pybk import sim
    import pybk.sim.runner
    if sys.argv[2] == "worker":  # as a sweep's worker process: everything loaded, frozen
        gc.collect()
        gc.freeze()
    seeds = json.loads(sys.argv[1])
    t0 = time.process_time()
    messages = steps = 0
    for s in seeds:
        r = sim.run(s, faults=sim.Faults.all())
        messages += r.stats.messages
        steps += r.stats.loop_steps
        if not r.ok:
            print("FAILED", s, sorted({v.invariant for v in r.violations}), file=sys.stderr)
    cpu = time.process_time() - t0
    import os, pybk
    where = os.path.dirname(os.path.dirname(os.path.abspath(pybk.__file__)))
    print(json.dumps({"cpu": cpu, "messages": messages, "steps": steps, "pybk": where}))
""")


def measure(seeds: list[int], path: str | None, mode: str = "worker") -> dict[str, Any]:
    import json

    env = dict(os.environ, PYTHONHASHSEED="0")
    if path is not None:
        env["PYTHONPATH"] = path
    # (run from the checkout compared, or from elsewhere: ``python -c`` puts the working
    # directory first on the path, ahead of PYTHONPATH and this install)
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(seeds), mode], env=env,
                         cwd=path or tempfile.gettempdir(), check=True, capture_output=True,
                         text=True)
    if out.stderr.strip():
        print(out.stderr.strip(), file=sys.stderr)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


#: the checkout this script belongs to (its ``pybk`` is the one measured as "this")
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from pybk.sim.sweep import parse_seeds

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0..39")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cores", type=int, default=2, help="for the 10,000-seed estimate")
    parser.add_argument("--compare", default=None, help="a checkout whose pybk to compare")
    parser.add_argument("--plain", action="store_true",
                        help="seeds in a plain process (the collector walks every module's "
                        "objects), not as a sweep's worker (everything loaded is frozen first)")
    args = parser.parse_args()
    mode = "plain" if args.plain else "worker"
    seeds = parse_seeds(args.seeds)
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "compare": []}
    for _ in range(args.rounds):
        runs["this"].append(measure(seeds, CHECKOUT, mode))
        if args.compare:
            runs["compare"].append(measure(seeds, args.compare, mode))
    rows = []
    for name, results in runs.items():
        if not results:
            continue
        per_seed = min(r["cpu"] for r in results) / len(seeds)
        msgs = results[0]["messages"] / len(seeds)
        steps = results[0]["steps"] / len(seeds)
        rows.append((name, per_seed))
        minutes = 10_000 * per_seed / args.cores / 60
        print(f"{name:8s} {len(seeds)} seeds: {per_seed:.3f} CPU s/seed (best of {len(results)}), "
              f"{60 * args.cores / per_seed:.0f} seeds/min on {args.cores} cores, 10,000 seeds in "
              f"{minutes:.1f} min; {msgs:.0f} messages, {steps:.0f} loop turns per seed; "
              f"pybk of {results[0]['pybk']}")
    if len(rows) == 2:
        print(f"ratio this/compare: {rows[0][1] / rows[1][1]:.2f}")
    # (the interpreter's build matters: Debian's python3.11 runs a seed in about 0.88x the
    # CPU of a pyenv build with a shared libpython; see docs/simulation.md, "fifth round")
    print(f"interpreter: {sys.executable} (Python {sys.version.split()[0]}), "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
