"""``pybk simulate``: run many simulated seeds and print what they found.

Registered on the ``pybk`` click group by :mod:`pybk.cli`. Prints a progress bar, a summary
table (seeds, virtual seconds, operations, faults by kind, coverage markers, violations, seeds
per minute, virtual-to-real ratio) and, for each failing seed, its report and the exact command
that reproduces it. Exit status 1 when any seed failed.
"""

from __future__ import annotations

import sys

import click

__all__ = [
    "simulate",
]


@click.command("simulate")
@click.option("--seeds", default=None, help="Seed range, e.g. 0..499 or 1,5,9 (inclusive).")
@click.option("--seed", type=int, default=None, help="One seed (prints its report).")
@click.option("--faults", "faults_spec", default="all", show_default=True,
              help="all, none, network, process, disk, beyond, or a comma list of kinds.")
@click.option("--duration", type=float, default=30.0, show_default=True,
              help="Virtual seconds of the safety phase per seed.")
@click.option("--bookies", type=int, default=None, help="Bookies (default: chosen per seed).")
@click.option("--workers", type=int, default=None, help="Worker processes (default: cores).")
@click.option("--mutation", "mutation", default="",
              help="Comma list of test-only mutations to enable (checker sanity checks).")
@click.option("--verbose", is_flag=True, help="With --seed: print the whole trace.")
def simulate(seeds: str | None, seed: int | None, faults_spec: str, duration: float,
             bookies: int | None, workers: int | None, mutation: str, verbose: bool) -> None:
    """Run deterministic simulations of whole clusters with injected faults."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from pybk.sim.faults import Faults
    from pybk.sim.sweep import parse_seeds, sweep

    console = Console()
    mutations = tuple(filter(None, (m.strip() for m in mutation.split(","))))
    try:
        Faults.parse(faults_spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--faults") from exc
    if seed is not None:
        from pybk.sim.runner import run

        r = run(seed, bookies=bookies, duration=duration, faults=Faults.parse(faults_spec),
                mutations=mutations)
        if verbose:
            for line in r.trace:
                click.echo(line)
        click.echo(r.report())
        click.echo(f"trace hash {r.trace_hash}  virtual {r.stats.virtual_seconds:.1f}s  "
                   f"wall {r.stats.wall_seconds:.2f}s  operations {r.stats.operations}")
        sys.exit(0 if r.ok else 1)
    try:
        seed_list = parse_seeds(seeds or "0..99")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from exc

    failed: list[int] = []
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("simulating", total=len(seed_list))

        def on_result(res: object) -> None:
            if not getattr(res, "ok", True):
                failed.append(getattr(res, "seed", -1))
            progress.update(task, advance=1,
                            description=f"simulating ({len(failed)} failing)")

        summary = sweep(seed_list, faults=faults_spec, duration=duration, bookies=bookies,
                        mutations=mutations, workers=workers, on_result=on_result)

    table = Table(title="pybk simulate", show_header=False)
    table.add_row("seeds", str(len(summary.seeds)))
    table.add_row("failing seeds", str(len(summary.failures)))
    table.add_row("virtual seconds", f"{summary.virtual_seconds:,.0f}")
    table.add_row("operations", f"{summary.operations:,}")
    table.add_row("wall seconds", f"{summary.wall_seconds:.1f} ({summary.workers} workers)")
    table.add_row("seeds per minute", f"{summary.seeds_per_minute:.1f}")
    table.add_row("virtual-to-real ratio", f"{summary.virtual_to_real:.1f}x")
    table.add_row("faults", ", ".join(f"{k}={v}" for k, v in summary.faults().items()) or "-")
    table.add_row("coverage", ", ".join(f"{k}={v}" for k, v in summary.coverage().items())
                  or "-")
    table.add_row("violations", ", ".join(f"{k}={v}" for k, v in summary.invariants().items())
                  or "none")
    console.print(table)
    for res in summary.failures:
        click.echo(res.report)
    sys.exit(1 if summary.failures else 0)
