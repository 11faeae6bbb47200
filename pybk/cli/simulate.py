"""``pybk simulate``: run many simulated seeds and print what they found; shrink a failing
seed to a minimal scenario; replay a scenario file.

Registered on the ``pybk`` click group by :mod:`pybk.cli`. A sweep draws a progress bar on
stderr (only on a terminal, as ``pybk ledger append`` does) and prints on stdout a summary
table (seeds, virtual seconds, operations, faults by kind, the configurations drawn,
coverage markers, violations, seeds per minute, CPU seconds per seed, virtual-to-real ratio)
and, for each failing seed, its report and the exact command that reproduces it. Exit status
1 when any seed failed.

``--spark MASTER`` runs the sweep's seeds on Spark executors (``pybk.spark.simulate``).
``--seed N --shrink`` reduces a failing seed's fault schedule, workload and configuration to
a minimal scenario that still violates the same invariant and writes it (``--out``);
``--replay FILE`` runs such a file (or one written by ``--seed N --save FILE``).
"""

from __future__ import annotations

import sys
from typing import Any

import click

__all__ = ["simulate"]


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
@click.option("--verbose", is_flag=True, help="With --seed or --replay: print the whole trace.")
@click.option("--shrink", is_flag=True,
              help="With --seed: shrink a failing run to a minimal scenario and write it.")
@click.option("--invariant", default=None,
              help="With --shrink: the invariant to keep violating (default: the first).")
@click.option("--max-runs", type=int, default=400, show_default=True,
              help="With --shrink: at most this many runs.")
@click.option("--out", "out", default=None,
              help="With --shrink: the scenario file to write (default pybk-sim-seed<N>.json).")
@click.option("--save", "save", default=None,
              help="With --seed: write the run's scenario (its resolved faults) to this file.")
@click.option("--replay", "replay", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Run a scenario file (written by --shrink or --save).")
@click.option("--report", "report_dir", default=None, metavar="DIR",
              help="With --seed: write the run's timeline.html, history.jsonl and plots to DIR.")
@click.option("--spark", "spark_master", default=None, metavar="MASTER",
              help="Run the seeds on Spark executors (e.g. local[2]; needs pybk[spark]).")
def simulate(seeds: str | None, seed: int | None, faults_spec: str, duration: float,
             bookies: int | None, workers: int | None, mutation: str, verbose: bool,
             shrink: bool, invariant: str | None, max_runs: int, out: str | None,
             save: str | None, replay: str | None, report_dir: str | None,
             spark_master: str | None) -> None:
    """Run deterministic simulations of whole clusters with injected faults."""
    from pybk.sim.faults import Faults

    mutations = tuple(filter(None, (m.strip() for m in mutation.split(","))))
    try:
        Faults.parse(faults_spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--faults") from exc
    if replay is not None:
        _replay(replay, mutations, verbose)
    if seed is not None:
        _one_seed(seed, bookies, duration, faults_spec, mutations, verbose, shrink, invariant,
                  max_runs, out, save, report_dir)
    if shrink or save or report_dir:
        raise click.UsageError("--shrink, --save and --report go with --seed")
    _sweep(seeds, faults_spec, duration, bookies, mutations, workers, spark_master)


def _print_run(r: object, verbose: bool) -> None:
    if verbose:
        for line in getattr(r, "trace", []):
            click.echo(line)
    click.echo(r.report())  # type: ignore[attr-defined]
    stats = r.stats  # type: ignore[attr-defined]
    click.echo(f"trace hash {r.trace_hash}  virtual {stats.virtual_seconds:.1f}s  "  # type: ignore[attr-defined]
               f"wall {stats.wall_seconds:.2f}s  operations {stats.operations}")


def _replay(path: str, mutations: tuple[str, ...], verbose: bool) -> None:
    from pybk.sim.runner import run
    from pybk.sim.scenario import Scenario

    try:
        scenario = Scenario.load(path)
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--replay") from exc
    r = run(scenario.seed, scenario=scenario, mutations=mutations)
    _print_run(r, verbose)
    if scenario.expect:
        got = {v.invariant for v in r.violations}
        click.echo(f"expected {scenario.expect}: "
                   + ("violated (reproduced)" if scenario.expect in got else "NOT violated"))
    sys.exit(0 if r.ok else 1)


def _one_seed(seed: int, bookies: int | None, duration: float, faults_spec: str,
              mutations: tuple[str, ...], verbose: bool, shrink: bool, invariant: str | None,
              max_runs: int, out: str | None, save: str | None,
              report_dir: str | None = None) -> None:
    from pybk.sim.faults import Faults
    from pybk.sim.runner import run

    r = run(seed, bookies=bookies, duration=duration, faults=Faults.parse(faults_spec),
            mutations=mutations, keep_history=report_dir is not None)
    _print_run(r, verbose)
    if report_dir is not None:
        from pybk.sim.report import write_report

        for path in write_report(r, report_dir):
            click.echo(f"report: {path}")
    if save and r.scenario is not None:
        r.scenario.save(save)
        click.echo(f"scenario written to {save} (pybk simulate --replay {save})")
    if not shrink:
        sys.exit(0 if r.ok else 1)
    if r.ok:
        click.echo("the run passed: nothing to shrink")
        sys.exit(0)
    _shrink(r, invariant, max_runs, out or f"pybk-sim-seed{seed}.json")


def _shrink(r: object, invariant: str | None, max_runs: int, out: str) -> None:
    from pybk.sim.runner import run
    from pybk.sim.shrink import shrink

    violated = [v.invariant for v in r.violations]  # type: ignore[attr-defined]
    target = invariant or violated[0]
    if target not in violated:
        raise click.BadParameter(f"the run does not violate {target} (it violates "
                                 f"{', '.join(sorted(set(violated)))})", param_hint="--invariant")
    scenario = r.scenario  # type: ignore[attr-defined]
    click.echo(f"shrinking: {len(scenario.events)} fault events, keeping {target} violated")
    result = shrink(scenario, target, max_runs=max_runs,
                    on_step=lambda text: click.echo(f"  {text}"))
    result.scenario.save(out)
    click.echo(f"shrunk in {result.runs} runs: {result.events_before} -> "
               f"{result.events_after} fault events")
    for ev in result.scenario.events:
        click.echo(f"  {ev.describe()}")
    final = run(result.scenario.seed, scenario=result.scenario)
    click.echo(final.report())
    click.echo(f"written to {out}: pybk simulate --replay {out}")
    sys.exit(1)


def _sweep(seeds: str | None, faults_spec: str, duration: float, bookies: int | None,
           mutations: tuple[str, ...], workers: int | None, spark_master: str | None) -> None:
    from collections import Counter

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from pybk.sim.sweep import parse_seeds, sweep

    console = Console()  # the summary: data, on stdout
    errors = Console(stderr=True)  # the progress bar: on stderr, and only on a terminal
    try:
        seed_list = parse_seeds(seeds or "0..99")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--seeds") from exc

    failed: list[int] = []
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=errors, transient=True,
                  disable=not errors.is_terminal) as progress:
        task = progress.add_task("simulating", total=len(seed_list))

        def on_result(res: object) -> None:
            if not getattr(res, "ok", True):
                failed.append(getattr(res, "seed", -1))
            progress.update(task, advance=1,
                            description=f"simulating ({len(failed)} failing)")

        if spark_master is not None:
            summary = _on_spark(spark_master, seed_list, faults_spec, duration, bookies,
                                mutations, lambda done, _n: progress.update(task, completed=done))
        else:
            summary = sweep(seed_list, faults=faults_spec, duration=duration, bookies=bookies,
                            mutations=mutations, workers=workers, on_result=on_result)

    configs: Counter[str] = Counter()
    for s in summary.seeds:
        configs.update(k for k in s.coverage if k.startswith("config_"))
    table = Table(title="pybk simulate", show_header=False)
    table.add_row("seeds", str(len(summary.seeds)))
    table.add_row("failing seeds", str(len(summary.failures)))
    table.add_row("virtual seconds", f"{summary.virtual_seconds:,.0f}")
    table.add_row("operations", f"{summary.operations:,}")
    table.add_row("wall seconds", f"{summary.wall_seconds:.1f} ({summary.workers} workers)")
    table.add_row("seeds per minute", f"{summary.seeds_per_minute:.1f}")
    cpu = summary.cpu_seconds_per_seed  # (0: not measured where the seeds ran)
    table.add_row("CPU seconds per seed", f"{cpu:.3f}" if cpu else "-")
    table.add_row("virtual-to-real ratio", f"{summary.virtual_to_real:.1f}x")
    table.add_row("configurations", ", ".join(f"{k[7:]}={v}" for k, v in sorted(configs.items()))
                  or "-")
    table.add_row("faults", ", ".join(f"{k}={v}" for k, v in summary.faults().items()) or "-")
    table.add_row("coverage", ", ".join(f"{k}={v}" for k, v in summary.coverage().items()
                                        if not k.startswith("config_")) or "-")
    table.add_row("sometimes points never reached", ", ".join(summary.never_reached()) or "none")
    table.add_row("violations", ", ".join(f"{k}={v}" for k, v in summary.invariants().items())
                  or "none")
    console.print(table)
    for res in summary.failures:
        click.echo(res.report)
    sys.exit(1 if summary.failures else 0)


def _on_spark(master: str, seeds: list[int], faults: str, duration: float, bookies: int | None,
              mutations: tuple[str, ...], progress: Any) -> Any:
    """The sweep on Spark (pybk.spark.simulate's runner), as the local sweep's summary."""
    try:
        from pyspark.sql import SparkSession

        from pybk.spark.session import local_session
        from pybk.spark.simulate import run_on_spark, summary_from_rows
    except ImportError as exc:
        raise click.UsageError(f"--spark needs pybk[spark] (pyspark): {exc}") from exc
    mine = SparkSession.getActiveSession() is None  # stop only a session made here
    spark = local_session(master, "pybk simulate")
    try:
        rows, wall = run_on_spark(spark, seeds, faults=faults, duration=duration,
                                  bookies=bookies, mutations=mutations, on_progress=progress)
        cores = spark.sparkContext.defaultParallelism
    finally:
        if mine:
            spark.stop()
    return summary_from_rows(rows, wall, cores)
