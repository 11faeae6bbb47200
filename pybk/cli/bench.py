"""``pybk bench``: write throughput and latency of a cluster, beside the same-run ceiling.

Like BookKeeper's ``bin/benchmark writes``. Without ``--metadata`` it starts an embedded
cluster (in-process bookies in a temporary directory, removed afterwards) and, on the same
disk, measures the single-file group-commit ceiling under the same load; with ``--metadata``
it writes to that cluster (TLS and token options as the other commands) and measures a ceiling
only where ``--ceiling-dir`` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any

import click

import pybk
from pybk.cli.common import Conn, fail, optional_client_options, stderr_console
from pybk.errors import BKError
from pybk.runtime.eventloop import DEFAULT_LOOP, LOOPS, LoopUnavailableError, run

__all__ = ["bench"]


@click.command("bench")
@optional_client_options
@click.option("--ensemble", "-e", type=click.IntRange(1), default=3, show_default=True)
@click.option("--write-quorum", "-w", type=click.IntRange(1), default=2, show_default=True)
@click.option("--ack-quorum", "-a", type=click.IntRange(1), default=2, show_default=True)
@click.option("--size", type=click.IntRange(1, 64 << 20), default=100, show_default=True,
              help="Bytes per entry.")
@click.option("--inflight", type=click.IntRange(1, 1 << 20), default=1024, show_default=True,
              help="Appends kept outstanding (closed loop).")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Appends per second instead (open loop: latency counted from when each "
                   "append was due).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True, help="Seconds measured (each for pybk and the ceiling).")
@click.option("--warmup", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Seconds of appends before measuring.")
@click.option("--bookies", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Embedded cluster: bookies to start.")
@click.option("--dir", "root", type=click.Path(file_okay=False, exists=True),
              help="Embedded cluster: where its temporary directory goes (the disk measured).")
@click.option("--server-settings", is_flag=True,
              help="Embedded cluster: run its bookies with pybk bookie's settings "
                   "(preallocated segments, overlapped syncs) instead of LocalCluster's.")
@click.option("--sync-thread", is_flag=True,
              help="Embedded cluster: its journals sync on a thread of this process instead "
                   "of a helper process per bookie (slower under load: the thread waits for "
                   "the busy loop's GIL; to compare).")
@click.option("--ceiling/--no-ceiling", default=True, show_default=True,
              help="Measure the plain-file group-commit ceiling after pybk.")
@click.option("--ceiling-dir", type=click.Path(file_okay=False, exists=True),
              help="Remote cluster: measure the ceiling on this local directory's disk.")
@click.option("--loop", type=click.Choice(LOOPS), default=DEFAULT_LOOP, show_default=True,
              help="Event loop; uvloop needs pip install 'pybk[speed]'.")
@click.option("--tune-gc/--no-tune-gc", default=True, show_default=True,
              help="Set this process's garbage collector as `pybk bookie` sets its own "
                   "(heap frozen after start-up, gen-0 threshold 50,000): fewer, shorter "
                   "collector pauses in the latency tail.")
@click.option("--json", "as_json", is_flag=True, help="The figures as one JSON object.")
def bench(conn: Conn, ensemble: int, write_quorum: int, ack_quorum: int, size: int,
          inflight: int, rate: float | None, duration: float, warmup: float, bookies: int,
          root: str | None, server_settings: bool, sync_thread: bool, ceiling: bool,
          ceiling_dir: str | None, loop: str, tune_gc: bool, as_json: bool) -> None:
    """Measure appends: entries/s and latency percentiles, beside the same-run ceiling.

    \b
    Examples:
      pybk bench                                  # embedded 3-bookie cluster, 5 s
      pybk bench --duration 30 --inflight 1 -e 1 -w 1 -a 1
      pybk bench --metadata zk://zk1:2181/pybk --rate 20000 --ceiling-dir /data
    """
    from pybk.bench.writes import WriteBench, run_write_bench

    remote = bool(conn.metadata)
    if remote and (bookies != 3 or root or server_settings or sync_thread):
        raise click.UsageError("--bookies, --dir, --server-settings and --sync-thread are for "
                               "the embedded cluster (no --metadata)")
    if sync_thread and server_settings:
        raise click.UsageError("--sync-thread is for LocalCluster's defaults: "
                               "--server-settings' overlapped syncs need the helper process")
    if ceiling_dir and not remote:
        raise click.UsageError("--ceiling-dir is for a remote cluster; the embedded one's "
                               "ceiling is measured in its own directory (--dir)")
    if bookies < ensemble:
        raise click.UsageError(f"--ensemble {ensemble} needs at least that many --bookies")
    try:
        spec = WriteBench(ensemble, write_quorum, ack_quorum, size, inflight, rate, duration,
                          warmup, ceiling, ceiling_dir)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    console = stderr_console()

    async def go() -> Any:
        status = (console.status("pybk bench: starting", spinner="dots")
                  if console.is_terminal else contextlib.nullcontext())
        with status:
            def progress(msg: str) -> None:
                if status is not None and hasattr(status, "update"):
                    status.update(f"pybk bench: {msg}")
                else:  # a log or a pipe: one line per step
                    console.print(f"pybk bench: {msg}", highlight=False)

            async def measure() -> Any:
                if not remote:
                    return await run_write_bench(spec, root=root, bookies=bookies,
                                                 server_settings=server_settings,
                                                 sync_thread=sync_thread,
                                                 tune_gc=tune_gc, progress=progress)
                async with conn.client() as client:
                    return await run_write_bench(spec, client=client, tune_gc=tune_gc,
                                                 progress=progress)

            # the measurement takes its own time; --timeout bounds what comes on top of it
            bound = 2 * (spec.warmup + spec.duration) + 1.0 + conn.timeout
            try:
                return await asyncio.wait_for(measure(), bound)
            except TimeoutError as exc:
                if isinstance(exc, BKError):
                    raise
                raise pybk.TimeoutError(
                    f"not done within {bound:g} s (the measurement's own time plus --timeout "
                    f"{conn.timeout:g} s)") from None

    try:
        report = run(go(), loop)
    except LoopUnavailableError as exc:
        raise click.UsageError(str(exc)) from exc
    except BKError as exc:
        fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except (ValueError, OSError) as exc:
        fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except KeyboardInterrupt:
        fail("interrupted")
    if as_json:
        click.echo(json.dumps(report.as_dict() | {"loop": loop}))
        return
    _print_report(report, loop)


def _print_report(report: Any, loop: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from pybk.bench.stats import LatencySummary

    out = Console(highlight=False)
    if not out.is_terminal:
        out = Console(highlight=False, width=120)  # a pipe or a file: no cut columns
    out.print(f"pybk bench: {report.setup}; event loop {loop}")
    table = Table("", "entries/s", "MB/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms",
                  "entries", title="latency: from the append call to its acknowledgement"
                  if math.isnan(report.pybk.target_rate) else
                  "latency: from when each append was due (open loop)")
    size = report.entry_size
    for name, r in (("pybk", report.pybk), ("ceiling", report.ceiling)):
        if r is None:
            continue
        ms = LatencySummary.of(r.latencies).ms()
        table.add_row(name, f"{r.rate:,.0f}", f"{r.rate * size / 1e6:,.1f}",
                      *(f"{ms[k]:.3f}" for k in ("p50", "p90", "p99", "p99.9", "max")),
                      f"{r.count:,}")
    out.print(table)
    if report.ceiling is not None:
        out.print(f"ceiling: {report.ceiling_setup}; {report.ceiling_group:.0f} records per "
                  "fsync")
        if report.pybk.behind or report.ceiling.behind or math.isnan(report.pybk.target_rate):
            out.print(f"pybk / ceiling: {report.ratio:.2f}x entries/s (same load, same disk, "
                      "same run)")
        else:  # both kept to the rate asked for: their latencies are the comparison
            p99 = LatencySummary.of(report.pybk.latencies).p99
            c99 = LatencySummary.of(report.ceiling.latencies).p99
            out.print(f"both kept the rate; pybk's p99 is {p99 / c99:.2f}x the ceiling's "
                      "(same load, same disk, same run)")
    if report.fsync_p50 is not None:
        p50 = LatencySummary.of(report.pybk.latencies).p50
        out.print(f"one {size}-byte write + fdatasync on that disk: p50 "
                  f"{report.fsync_p50 * 1e3:.3f} ms (pybk's p50: {p50 / report.fsync_p50:.1f} "
                  "of them)")
    if report.pybk.behind:
        out.print(f"open loop: fell behind the schedule by up to {report.pybk.behind:,} "
                  "appends (the rate is above what the cluster sustains)")
    for note in report.notes:
        out.print(note)
