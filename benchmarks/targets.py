"""The write path's targets (issue 19), each beside its peer measured in the same run.

    python benchmarks/targets.py [--duration 1] [--rounds 1] [--loop both]
                                 [--read-entries 100000] [--settings defaults|server]
                                 [--dir /tmp] [--skip tcp,read]

Every row is pybk through its public API (``LedgerHandle.append``, ``ReadHandle.read``) and a
peer on the same disk in the same run; the ratio and the target it measures are printed:

1. ``ceiling``: in process, E3/Qw2/Qa2, 100 B, 1024 in flight, against the single-file
   group-commit ceiling (``pybk.bench.GroupCommitFile``: one CRC-framed record per entry, one
   asyncio writer task, one write + fdatasync per accumulated batch), same in-flight count.
   Target >= 0.6x.
2. ``client``: E=Qw=Qa=1 through the client, 1024 in flight, against the same bookie (the
   one the ledger's ensemble names, in the same cluster) driven directly through
   ``Bookie.add_entry`` with entries framed as the client frames them, and, when the bookie
   has ``add_batch``, also with the adds of one loop pass sent as one batch (as a batching
   client sends them); the faster of the two is the peer. Target >= 0.8x.
3. ``tcp``: three ``pybk bookie`` processes on loopback, E3/Qw2/Qa2, 1024 in flight, against an
   in-process cluster given the same ``BookieConfig`` (``process_bookie_config()``) and GC
   settings. Target >= 0.5x.
4. ``lone``: one writer awaiting each append (1 in flight), in process and over TCP; its p50
   in fsync latencies: one 100 B record written and fdatasync'ed on a file with the bookies'
   treatment (and, stricter, on a preallocated file when the bookies append), measured between
   slices of the lone writer (the disk's latency drifts by 10x within seconds here), on the
   loop's thread and on a worker thread (which one is faster varies), the smaller kept.
   Targets: within 2 (in process) and 3 (TCP). Beside the TCP row, the machine's floor for
   it: the simplest Python program doing a lone replicated write over loopback on the same
   loop (``pybk.bench.tcp_floor``: two server processes that write a record in place,
   fdatasync it and answer 8 bytes; no protocol, checks or index), between the same slices.
   Each lone row's verdict names its floor in the row's own unit: in process, the two
   replicas' syncs alone (``replica_sync_floor`` on the faster of the bookies' file treatment
   and a preallocated file, the faster of one after the other and both at once: what any
   program pays for two durable copies on this disk); over TCP, the simplest Python replicas
   above. A target under its floor is printed as such: no product meets it on this machine;
   otherwise the verdict says how many microseconds the target leaves above the floor.
5. ``p99@half``: an open-loop driver (``pybk.bench.open_loop``: appends issued at a fixed
   rate, the ones due each millisecond together, the finest tick both loops' timers keep;
   latency counted from when each was due) at half the rate row 1 (in process) and row
   3 (TCP) reached. Target p99 < 5 ms. Printed beside it: what the tail is made of (the
   disk's own p99 for one write + fdatasync, measured beside the lone writer; how late an
   idle event loop wakes up just before, nothing of pybk running: the machine's floor; the
   CPU per append; this process's collector passes and the longest).
6. ``read``: sequential read of a closed ledger of ``--read-entries`` 100 B entries
   (E3/Qw2/Qa2, in process; the target is defined at 1,000,000: ``--read-entries
   1000000``), ``ReadHandle.read`` 1000 entries a call, against a plain loop reading the same
   number of CRC-framed records from one file (read, parse, verify the CRC). Target >= 200k
   entries/s.

In-process clusters use ``--settings``: ``defaults`` (``pybk.LocalCluster(root)`` as a user
gets it: journal segments appended, syncs on a thread) or ``server`` (what a ``pybk bookie``
process runs: preallocated segments written in place, overlapped syncs through a sync helper
process, inline syncs when nothing overlaps); the ceiling's file gets the same treatment as
the bookies' segments. Row 3 always uses ``server`` on both sides. ``--loop both`` (the
default when uvloop is installed) runs every row on asyncio and on uvloop (TCP bookie
processes included) and prints them side by side. ``--rounds`` repeats everything, rounds
alternating, and prints medians. ``--gc`` sets the in-process cluster's garbage collector:
``tuned`` (the default: ``pybk.LocalCluster(tune_gc=True)``, what a ``pybk bookie`` process
does to its own) or ``default`` (Python's settings); the TCP rows' processes are always tuned.
The read row also prints the CPU per entry read (wall-clock figures drift with the machine's
load; CPU per entry much less). The measurements themselves are in ``_targets_measures.py``;
this script runs the rounds, makes the rows and prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import (
    Run,
    bookie_appender,
    closed_loop,
    floor_verdict,
    loops_to_run,
    median,
    percentile,
    run_on,
    server_settings,
    tcp_bookies,
)
from _targets_measures import (
    E1,
    E3,
    SIZE,
    ceiling_run,
    ledger_closed_loop,
    ledger_open_loop,
    lone_writer,
    read_ceiling,
    read_run,
)

from pybk import Client, LocalCluster
from pybk.bench import RecordFile
from pybk.bench.tcp_floor import tcp_floor_servers
from pybk.metadata.base import LedgerMetadata
from pybk.runtime.eventloop import available_loops
from pybk.server.process import tune_gc_for_server


@dataclass
class Row:
    """One target: pybk's figure, the peer's, and how they compare."""

    key: str
    what: str
    pybk: float
    peer: float
    unit: str
    #: pybk / peer (throughput rows) or pybk in peer units (latency rows)
    ratio: float
    target: str
    met: bool
    detail: str = ""
    #: lone rows: the least this machine lets any program of the kind named by
    #: ``floor_what`` pay, in the row's own unit (fsyncs); a target below it cannot be met
    #: here, whatever the product does
    floor: float | None = None
    floor_what: str = ""


# -- one round on one loop ---------------------------------------------------------------------


async def one_round(root: Path, args: argparse.Namespace, loop: str) -> dict[str, Any]:
    """Every measurement once, on the running loop. Raw figures by name."""
    out: dict[str, Any] = {}
    prealloc = args.settings == "server"
    config = server_settings() if prealloc else None
    skip = set(args.skip.split(",")) if args.skip else set()
    gc.collect()
    # made once per round, before the cluster starts: making a preallocated file loads the
    # disk for a while after, and the cluster's first rows give it that while
    with contextlib.ExitStack() as files:
        pre = files.enter_context(contextlib.closing(
            RecordFile(str(root / "prealloc.log"), preallocate=True)))
        # one file per replica of the ack quorum (Qa = 2), for the replicas' sync floor: the
        # in-process bookies' treatment, and preallocated as the bookie processes'
        floor = {kind: [files.enter_context(contextlib.closing(RecordFile(
                     str(root / f"replica-{kind}-{i}.log"), preallocate=kind == "prealloc",
                     prealloc_size=8 << 20))) for i in range(E3[2])]
                 for kind in ("same", "prealloc")}
        out["floor_files"] = floor
        return await _one_round(root, args, loop, out, prealloc, config, skip, pre)


async def _one_round(root: Path, args: argparse.Namespace, loop: str, out: dict[str, Any],
                     prealloc: bool, config: Any, skip: set[str], pre: RecordFile
                     ) -> dict[str, Any]:
    grow = str(root / "grow.log")
    async with LocalCluster(root / "inproc", 3, bookie_config=config,
                            tune_gc=args.gc == "tuned") as cluster:
        client = cluster.client()
        # 1. E3/Qw2/Qa2 at 1024 against the single-file ceiling
        run, lh = await ledger_closed_loop(client, E3, 1024, args.duration)
        await lh.close()
        out["e3"] = run
        out["ceiling"], out["ceiling_group"] = await ceiling_run(
            pre if prealloc else grow, 1024, args.duration)
        # 2. E1 through the client against the same bookie directly
        run, lh = await ledger_closed_loop(client, E1, 1024, args.duration)
        out["e1"] = run
        bookie = cluster.bookie(lh.metadata.last_ensemble[0])
        await lh.close()
        for lid in (1 << 40, (1 << 40) + 1):  # ids the client never assigns, in the metadata
            await cluster.store.create_ledger(  # (a bookie refuses adds of ledgers it lacks)
                LedgerMetadata(lid, 1, 1, 1, {0: (bookie.bookie_id,)}))
        direct = bookie_appender(bookie, 1 << 40, SIZE)
        await closed_loop(direct, 1024, min(args.duration, 0.3))
        out["direct"] = await closed_loop(direct, 1024, args.duration)
        if hasattr(bookie, "add_batch"):  # a bookie that takes batches: drive it so too
            direct = bookie_appender(bookie, (1 << 40) + 1, SIZE, batched=True)
            await closed_loop(direct, 1024, min(args.duration, 0.3))
            out["direct_batch"] = await closed_loop(direct, 1024, args.duration)
        # 4./5. lone writer and p99 at half the peak, in process
        floor = out.pop("floor_files")
        kinds = {"prealloc": floor["prealloc"]}
        if not prealloc:  # the bookies append: their own treatment too
            kinds["same"] = floor["same"]
        out["lone"], units = await lone_writer(
            client, args.duration, {"same": pre if prealloc else grow, "prealloc": pre},
            floors=kinds)
        out["fsync_same"], out["fsync_prealloc"] = units["same"], units["prealloc"]
        # the floor any program pays: the faster treatment, the faster way (serial or not)
        for way in ("serial", "concurrent"):
            out[f"floor_{way}"] = min(units[f"floor_{way}_{kind}"] for kind in kinds)
        out["floor"] = min(out["floor_serial"], out["floor_concurrent"])
        out["fsync_p99"] = units["same_p99"]
        out["half"], out["half_info"] = await ledger_open_loop(client, out["e3"].rate / 2,
                                                               args.duration)
        # 6. sequential read
        if "read" not in skip:
            out["read"], out["read_cpu"] = await read_run(client, args.read_entries)
            out["read_ceiling"] = read_ceiling(str(root), args.read_entries)
    if "tcp" in skip:
        return out
    # 3. TCP bookie processes against in process, same settings; 4./5. over TCP
    async with tcp_bookies(root / "tcp", 3, loop=loop) as metadata, \
            LocalCluster(root / "same", 3, bookie_config=server_settings()) as same, \
            Client(metadata) as tcp_client, \
            tcp_floor_servers(root / "tcp", E3[2], loop) as floor_peer:
        gc.unfreeze()
        gc.collect()
        tune_gc_for_server()  # as each bookie process does; this process is both clients
        try:
            run, lh = await ledger_closed_loop(same.client(), E3, 1024, args.duration)
            await lh.close()
            out["same"] = run
            run, lh = await ledger_closed_loop(tcp_client, E3, 1024, args.duration)
            await lh.close()
            out["tcp"] = run
            out["tcp_lone"], units = await lone_writer(tcp_client, args.duration,
                                                       {"prealloc": pre},
                                                       floors={"prealloc": floor["prealloc"]},
                                                       peer=floor_peer.measure)
            out["tcp_peer"] = units["peer"]
            out["tcp_fsync"] = units["prealloc"]
            out["tcp_floor"] = min(units["floor_serial_prealloc"],
                                   units["floor_concurrent_prealloc"])
            out["tcp_fsync_p99"] = units["prealloc_p99"]
            out["tcp_half"], out["tcp_half_info"] = await ledger_open_loop(
                tcp_client, out["tcp"].rate / 2, args.duration)
        finally:
            gc.unfreeze()
            gc.set_threshold(700, 10, 10)
    return out


# -- summary -----------------------------------------------------------------------------------


def rows_of(rounds: list[dict[str, Any]], settings: str, gc_setting: str) -> list[Row]:
    """Medians over rounds (ratios: the median of per-round ratios)."""

    def med(key: str, f: Callable[[Any], float] = lambda r: r.rate) -> float:
        return median([f(r[key]) for r in rounds])

    def ratio(a: str, b: str, fa: Callable[[Any], float] = lambda r: r.rate,
              fb: Callable[[Any], float] = lambda r: r.rate) -> float:
        return median([fa(r[a]) / fb(r[b]) for r in rounds])

    def p50(r: Run) -> float:
        return percentile(r.latencies, 0.5)

    def p99(r: Run) -> float:
        return percentile(r.latencies, 0.99)

    rows = []
    r = ratio("e3", "ceiling")
    rows.append(Row("ceiling", f"E3/Qw2/Qa2 1024 in flight, in process ({settings}) vs the "
                    "single-file group-commit ceiling", med("e3"), med("ceiling"), "entries/s",
                    r, ">= 0.6x", r >= 0.6,
                    f"pybk p50 {med('e3', p50) * 1e3:.2f} ms p99 {med('e3', p99) * 1e3:.2f} "
                    f"ms; ceiling p50 {med('ceiling', p50) * 1e3:.2f} ms, "
                    f"{median([x['ceiling_group'] for x in rounds]):.0f} records per fsync"))
    def direct(x: dict[str, Any]) -> float:
        """The faster way of driving the bookie directly: single adds, or batches."""
        return float(max(x["direct"].rate, x["direct_batch"].rate if "direct_batch" in x
                         else 0.0))

    r = median([x["e1"].rate / direct(x) for x in rounds])
    batch_note = ""
    if "direct_batch" in rounds[0]:
        batch_note = (f"direct single adds {med('direct'):,.0f}/s, direct batches (the adds "
                      f"of one loop pass as one add_batch) {med('direct_batch'):,.0f}/s; "
                      "the faster is the peer")
    rows.append(Row("client", "E1/Qw1/Qa1 1024 in flight through the client vs the same "
                    "bookie driven directly", med("e1"),
                    median([direct(x) for x in rounds]), "entries/s", r, ">= 0.8x",
                    r >= 0.8, batch_note))
    if "tcp" in rounds[0]:
        r = ratio("tcp", "same")
        rows.append(Row("tcp", "E3/Qw2/Qa2 1024 in flight, 3 pybk bookie processes over TCP "
                        "vs in process, same bookie settings", med("tcp"), med("same"),
                        "entries/s", r, ">= 0.5x", r >= 0.5,
                        f"tcp p50 {med('tcp', p50) * 1e3:.2f} ms; in process p50 "
                        f"{med('same', p50) * 1e3:.2f} ms"))
    fs_same = median([x["fsync_same"] for x in rounds])
    fs_pre = median([x["fsync_prealloc"] for x in rounds])
    r = median([p50(x["lone"]) / lone_unit(x, "floor") for x in rounds])
    detail = (f"fsync p50: {fs_same * 1e3:.3f} ms on the bookies' file treatment, "
              f"{fs_pre * 1e3:.3f} ms preallocated (the smaller is the unit; each measured "
              "between slices of the lone writer, on this thread and on a worker thread, the "
              f"smaller p50 kept); {med('lone'):,.0f} appends/s; "
              f"{floor_note(rounds, 'lone', 'floor', both=settings == 'defaults')}")
    rows.append(Row("lone", "lone writer p50, in process, in fsync latencies",
                    med("lone", p50) * 1e3, min(fs_same, fs_pre) * 1e3, "ms", r,
                    "<= 2 fsyncs", r <= 2, detail, floor=sync_floor(rounds, "floor"),
                    floor_what="the 2 replicas' syncs alone (any program)"))
    if "tcp" in rounds[0]:
        r = median([p50(x["tcp_lone"]) / x["tcp_fsync"] for x in rounds])
        detail = (f"{med('tcp_lone'):,.0f} appends/s; fsync p50 on a preallocated file, "
                  f"the bookies' treatment; {floor_note(rounds, 'tcp_lone', 'tcp_floor')}; "
                  f"{peer_note(rounds)}")
        rows.append(Row("lone tcp", "lone writer p50, over TCP, in fsync latencies",
                        med("tcp_lone", p50) * 1e3,
                        median([x["tcp_fsync"] for x in rounds]) * 1e3, "ms", r,
                        "<= 3 fsyncs", r <= 3, detail,
                        floor=median([x["tcp_peer"] / x["tcp_fsync"] for x in rounds]),
                        floor_what="the simplest Python replicas (any Python program)"))
    half = med("half", p99) * 1e3
    rows.append(Row("p99@half", "p99 at half the peak rate (open loop), in process",
                    half, 5.0, "ms", half / 5.0, "< 5 ms", half < 5.0,
                    f"rate {median([x['half'].target_rate for x in rounds]):,.0f}/s, "
                    f"p50 {med('half', p50) * 1e3:.2f} ms, most behind "
                    f"{max(x['half'].behind for x in rounds)}; {tail_note(rounds, 'half')}; "
                    f"collector: {gc_setting}"))
    if "tcp" in rounds[0]:
        half = med("tcp_half", p99) * 1e3
        rows.append(Row("p99@half tcp", "p99 at half the peak rate (open loop), over TCP",
                        half, 5.0, "ms", half / 5.0, "< 5 ms", half < 5.0,
                        f"rate {median([x['tcp_half'].target_rate for x in rounds]):,.0f}/s, "
                        f"p50 {med('tcp_half', p50) * 1e3:.2f} ms, most behind "
                        f"{max(x['tcp_half'].behind for x in rounds)}; "
                        f"{tail_note(rounds, 'tcp_half', 'tcp_fsync_p99')}"))
    if "read" in rounds[0]:
        rd = median([x["read"] for x in rounds])
        rc = median([x["read_ceiling"] for x in rounds])
        rows.append(Row("read", "sequential read of a closed ledger, in process, against a "
                        "plain loop reading the same CRC-framed records from one file (ratio "
                        "to it printed, the target is absolute)",
                        rd, rc, "entries/s", rd / rc, ">= 200k/s", rd >= 200_000,
                        f"CPU {median([x['read_cpu'] for x in rounds]) * 1e6:.2f} us per entry "
                        f"read ({1 / median([x['read_cpu'] for x in rounds]):,.0f} entries per "
                        "CPU second)"))
    return rows


def lone_unit(x: dict[str, Any], floor_key: str) -> float:
    """A lone row's unit in one round: the in-process row's stricter fsync (the smaller of
    the bookies' file treatment and a preallocated file), the TCP row's preallocated one."""
    if floor_key == "floor":
        return float(min(x["fsync_same"], x["fsync_prealloc"]))
    return float(x["tcp_fsync"])


def sync_floor(rounds: list[dict[str, Any]], floor_key: str) -> float:
    """The replicas' sync floor in the lone row's own unit (fsyncs), median of the rounds."""
    return median([x[floor_key] / lone_unit(x, floor_key) for x in rounds])


def floor_note(rounds: list[dict[str, Any]], key: str, floor_key: str, *,
               both: bool = False) -> str:
    """The replicas' sync floor beside a lone row: what Qa = 2 journals' syncs cost on this
    disk whatever the product does (``replica_sync_floor``, on the faster file treatment),
    in the row's own unit, and the p50 in those floors. ``both``: measured on the bookies'
    own (appended) files as well as preallocated ones (in process, default settings)."""
    floor = median([x[floor_key] for x in rounds])
    in_floors = median([percentile(x[key].latencies, 0.5) / x[floor_key] for x in rounds])
    treatments = ("a preallocated file and the bookies' own, the faster" if both
                  else "preallocated files")
    line = (f"replicas' sync floor (2 journals' write + fdatasync on this disk, on "
            f"{treatments}; the faster of one after the other and both at once): "
            f"{floor * 1e3:.3f} ms = {sync_floor(rounds, floor_key):.2f} fsyncs (the row's "
            f"unit); p50 = {in_floors:.2f} floors")
    if floor_key == "floor":
        line += (f" (one after the other {median([x['floor_serial'] for x in rounds]) * 1e3:.3f}"
                 f" ms, at once {median([x['floor_concurrent'] for x in rounds]) * 1e3:.3f} ms)")
    return line


def peer_note(rounds: list[dict[str, Any]]) -> str:
    """The lone TCP row's machine floor: the simplest Python program doing a lone replicated
    write over loopback on the same loop (``pybk.bench.tcp_floor``), and pybk's p50 in it."""
    peer = median([x["tcp_peer"] for x in rounds])
    fs = median([x["tcp_fsync"] for x in rounds])
    ratio = median([percentile(x["tcp_lone"].latencies, 0.5) / x["tcp_peer"] for x in rounds])
    return (f"the simplest Python replicas (pybk.bench.tcp_floor: {E3[2]} server processes on "
            f"this loop, each record written in place, fdatasync'ed and answered with 8 bytes; "
            f"no protocol, checks or index; measured between the same slices): p50 "
            f"{peer * 1e3:.3f} ms = {peer / fs:.2f} fsyncs; pybk p50 = {ratio:.2f}x of it")


def tail_note(rounds: list[dict[str, Any]], key: str, fsync_key: str = "fsync_p99") -> str:
    """What a p99@half row's tail is made of: the disk's own p99 (one 100 B write +
    fdatasync, measured beside the lone writer), the machine's floor (an idle loop's wake-up
    lateness), the CPU per append, the collector's passes in this process (the bookies' own,
    over TCP, are not seen here)."""
    info = [x[f"{key}_info"] for x in rounds]
    return (f"a write + fdatasync's own p99 {median([x[fsync_key] for x in rounds]) * 1e3:.2f}"
            f" ms; an idle loop's wake-up lateness just before (nothing running) p99 "
            f"{median([i['idle_p99'] for i in info]) * 1e3:.2f} ms, max "
            f"{max(i['idle_max'] for i in info) * 1e3:.1f} ms; "
            f"CPU {median([i['cpu'] for i in info]) * 1e6:.1f} us per append (this "
            f"process); collector passes {max(i['gc_passes'] for i in info):.0f}, longest "
            f"{max(i['gc_longest'] for i in info) * 1e3:.1f} ms")


def verdict(r: Row) -> str:
    """met / NOT MET, and for a lone row the machine's floor in the row's unit
    (``floor_verdict``)."""
    limit = float(r.target.split()[1]) if r.floor is not None else 0.0  # "<= 2 fsyncs"
    return floor_verdict(r.met, limit, r.floor, unit_us=r.peer * 1e3)  # r.peer: the unit, ms


def row_line(r: Row, loop: str) -> str:
    number = "{:>12,.3f}" if r.unit == "ms" else "{:>12,.0f}"
    return (f"{r.key:<13} {loop:<8} {number.format(r.pybk)} {number.format(r.peer)} "
            f"{r.unit:<10} {r.ratio:>7.2f} {r.target:>12}  {verdict(r)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds; medians")
    ap.add_argument("--loop", choices=("asyncio", "uvloop", "both"),
                    default="both" if "uvloop" in available_loops() else "asyncio")
    ap.add_argument("--read-entries", type=int, default=100_000,
                    help="entries of the read row's ledger (the target is at 1000000)")
    ap.add_argument("--settings", choices=("defaults", "server"), default="defaults",
                    help="in-process bookie settings (row 3 always uses server settings)")
    ap.add_argument("--dir", default=None, help="where the temp directory goes (the disk)")
    ap.add_argument("--skip", default="", help="comma-separated: tcp, read")
    ap.add_argument("--gc", choices=("tuned", "default"), default="tuned",
                    help="the in-process cluster's garbage collector: tuned as a bookie "
                         "process tunes its own (LocalCluster(tune_gc=True)), or Python's "
                         "defaults (the TCP rows' processes are always tuned)")
    args = ap.parse_args()
    loops = loops_to_run(args.loop)
    results: dict[str, list[dict[str, Any]]] = {loop: [] for loop in loops}
    with tempfile.TemporaryDirectory(prefix="pybk-targets-", dir=args.dir) as tmp:
        print(f"disk under test: {tmp}; {SIZE} B entries, {args.duration:g} s per "
              f"measurement, {args.rounds} round(s) alternating {' / '.join(loops)}; "
              f"in-process settings: {args.settings}, collector {args.gc}")
        for i in range(args.rounds):
            for loop in loops:
                root = Path(tmp) / f"{loop}-{i}"
                root.mkdir()
                results[loop].append(run_on(loop, one_round(root, args, loop)))
    gc_setting = ("tuned as a bookie process tunes it (LocalCluster(tune_gc=True))"
                  if args.gc == "tuned" else "Python's defaults")
    by_loop = {loop: rows_of(rs, args.settings, gc_setting) for loop, rs in results.items()}
    first = by_loop[loops[0]]
    print()
    head = f"{'target':<13} {'loop':<8} {'pybk':>12} {'peer':>12} {'unit':<10} " \
           f"{'ratio':>7} {'target':>12}  verdict"
    print(head)
    print("-" * len(head))
    for i in range(len(first)):
        for loop in loops:
            print(row_line(by_loop[loop][i], loop))
    if len(loops) > 1:
        print()
        for i, row in enumerate(first):
            if row.unit != "ms":
                a, b = by_loop[loops[0]][i], by_loop[loops[1]][i]
                print(f"{row.key:<13} {loops[1]} / {loops[0]}: {b.pybk / a.pybk:.2f}x pybk, "
                      f"{b.peer / a.peer:.2f}x peer")
    print()
    for i, row in enumerate(first):
        print(f"{row.key:<13} {row.what}")
        for loop in loops:
            detail = by_loop[loop][i].detail
            if detail:
                print(f"{'':<13}   {loop}: {detail}")
    print("\nratio: pybk / peer (throughput rows, same run), pybk p50 / fsync p50 (lone rows), "
          "p99 / 5 ms (p99@half rows)")
    floors = {r.key: r.floor_what for r in first if r.floor is not None}
    if floors:
        print("floor (lone rows, in the row's fsyncs, same run): the least a lone append "
              "costs on this machine: "
              + "; ".join(f"{key}: {what}" for key, what in floors.items())
              + ". A target UNDER its floor cannot be met here; 'leaves N us' is what the "
              "target leaves for everything but the floor (a request, its checks, its answer)")


if __name__ == "__main__":
    main()
