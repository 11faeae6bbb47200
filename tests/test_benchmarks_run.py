"""Every script in benchmarks/ runs to the end with tiny settings and prints its figures, so a
change to the code they drive (a bookie's add path, the client, the CLI) cannot leave them
broken unnoticed. Nothing here is timed: the figures are only checked to be there."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CASES = {
    "targets.py": (["--duration", "0.1", "--read-entries", "2000", "--loop", "both"],
                   [r"ceiling\s+asyncio\s+[\d,]+\s+[\d,]+ entries/s", r"client\s+uvloop",
                    r"tcp\s+asyncio\s+[\d,]+", r"lone tcp\s+asyncio",
                    r"replicas' sync floor .*= [\d.]+ fsyncs \(the row's unit\); p50 = "
                    r"[\d.]+ floors",
                    # each lone row's verdict names the machine's floor when not met
                    r"lone\s+asyncio\s+[\d.]+\s+[\d.]+ ms\s+[\d.]+\s+<= 2 fsyncs  (met|NOT MET; "
                    r"(target UNDER the floor \([\d.]+\)|the floor \([\d.]+\) leaves \d+ us))",
                    r"lone tcp\s+uvloop\s+[\d.]+\s+[\d.]+ ms\s+[\d.]+\s+<= 3 fsyncs  (met|NOT "
                    r"MET; (target UNDER the floor|the floor))",
                    r"floor \(lone rows, in the row's fsyncs, same run\)",
                    r"simplest Python replicas .* p50 [\d.]+ ms = [\d.]+ fsyncs; pybk p50 = "
                    r"[\d.]+x of it",
                    r"p99@half\s+asyncio",
                    r"read\s+uvloop\s+[\d,]+", r"uvloop / asyncio"]),
    "add_profile.py": (["--adds", "300", "--top", "3"],
                       [r"E3/Qw2/Qa2: [\d.]+ calls/add", r"E1/Qw1/Qa1: [\d.]+ calls/add",
                        r"[\d.]+ allocations/add"]),
    "add_cpu.py": (["--duration", "0.2", "--rounds", "1", "--inflight", "64"],
                   [r"fs=mem\s+[\d,]+ entries/s\s+CPU\s+[\d.]+ us/entry",
                    r"fs=disk\s+[\d,]+ entries/s", r"loop thread\s+[\d.]+"]),
    "add_layers.py": (["--rounds", "1", "--count", "3000", "--disk"],
                      [r"driver\s+[\d.]+\s+[\d,]+\s+the closed-loop driver",
                       r"bookies\s+[\d.]+\s+[\d,]+\s+bookies: admission",
                       r"disk\s+[\d.]+\s+[\d,]+\s+real files"]),
    "bookie_append.py": (["--duration", "0.15", "--rounds", "1", "--writers", "1",
                          "--sizes", "100"],
                         [r"file treatment, both sides", r"lone writer: p50 [\d.]+ ms"]),
    "ledger_append.py": (["--duration", "0.1", "--inflight", "8"], [r"3/2/2\s+100\s+8\s+\d+"]),
    "tcp_append.py": (["--duration", "0.1", "--rounds", "1", "--sizes", "100", "--window",
                       "16", "--defaults"],
                      [r"tcp / in-process\s+[\d.]+", r"in-process defaults differ"]),
    "wal_append.py": (["--duration", "0.1", "--rounds", "1", "--tail-records", "0"],
                      [r"1/append \|\s+[\d,]+", r"lone writer",
                       r"replicas' sync floor .* 3 journals [\d.]+ ms",
                       r"target \(b\), a lone writer's p50 <= 3 fsyncs: [\d.]+: (met|NOT MET; "
                       r"(target UNDER the floor|the floor))",
                       r"like with like \(both 1/append\): [\d.]+x: (met|NOT MET; (target "
                       r"ABOVE the ceiling|the ceiling)).* the driver alone"]),
    "table_ops.py": (["--duration", "0.3", "--gets", "50", "--no-etcd"],
                     [r"pybk tables \(E3 Qw3 Qa2\)\s+\d+", r"SQLite \(1 writer, FULL\)\s+\d+",
                      r"target: get p50 < 1 ms in process: [\d.]+ ms -> (met|NOT MET)"]),
    "noisy_neighbour.py": (["--quick"],
                           [r"in-proc\s+write\s+enforced\s+[\d.]+\s+[\d.]+\s+\d+\s+[\d.]+\s+[\d.]+"
                            r"\s+p99 (met|NOT MET)",
                            r"tcp\s+read\s+no enforcement\s+[\d.]+", r"throughput (met|NOT MET)"]),
    "lone_commit.py": (["--quick"],
                       [r"sqlite WAL, sync=FULL\s+[\d.]+\s+[\d.]+\s+[\d,]+",
                        r"wal 1 replica \(sync\)\s+[\d.]+", r"async wal default\s+[\d.]+",
                        r"1 replica p50 / sqlite p50\s+[\d.]+x  <= 1.3x  (met|NOT MET)",
                        r"default p50 / quorum floor\s+[\d.]+x", r"sync p50 / async p50"]),
    "lone_cpu.py": (["--rounds", "1", "--count", "50", "--shapes", "sync 1 replica"],
                    [r"sync 1 replica\s+this\s+[\d.]+\s+\d+-\d+\s+[\d.]+\s+\d+"]),
    "checkpoint.py": (["--entries", "20000", "--ledgers", "20", "--changed", "1000",
                       "--active", "5", "--rounds", "1"], [r"delta vs base"]),
    "metrics_overhead.py": (["--duration", "0.1", "--rounds", "1", "--writers", "4",
                             "--window", "16"],
                            [r"no metrics\s+[\d,]+ entries/s", r"with metrics\s+[\d,]+",
                             r"CPU per entry [\d.]+"]),
    "sim_seeds.py": (["--seeds", "0..1", "--rounds", "1"],
                     [r"[\d.]+ CPU s/seed", r"10,000 seeds in [\d.]+ min",
                      # (the checkout's own pybk, not whichever the interpreter has installed)
                      r"pybk of " + re.escape(str(Path(__file__).resolve().parents[1]))]),
    "spark_write.py": (["--rows", "2000", "--rounds", "1", "--warmup", "0", "--seeds", "4",
                        "--duration", "1"],
                       [r"ratio pybk data source / parquet: [\d.]+x",
                        r"ratio pybk write_partitions / parquet: [\d.]+x",
                        r"trace hashes equal for 4/4 seeds"]),
    "gc_soak.py": (["--minutes", "0.05", "--rate", "500", "--ledgers", "10", "--ledger-mb",
                    "0.2", "--gc-interval", "1", "--sample", "0.5", "--p99-mb", "2",
                    "--p99-seconds", "0.3"],
                   [r"second half's largest: [\d.]+ MB; bound 3 x \(1.5 x 10 \+ 16\) = 93.0 MB",
                    r"logtime: a log appended at 500 x 1000 B records/s for 0.05 min, retention",
                    r"every bookie within 1.5 x live \+ 16 MB \([\d.]+ MB\) after: ",
                    r"p99 compacting / idle: [\d.]+x; target <= 1.5x: (met|NOT MET)",
                    r"verdict: (all met|NOT all met)"]),
    "gc_cost.py": (["--rounds", "1", "--duration", "0.2", "--lone", "20", "--seeds", "0..0"],
                   [r"ledger\s+entries/s\s+[\d,.]+\s+[\d,.]+\s+[\d.]+x .*met",
                    r"wal CPU\s+us/append", r"lone\s+ms p50",
                    r"sim\s+CPU s/seed\s+[\d.]+\s+[\d.]+",
                    r"sim: [\d,]+ loop steps per seed with the collector, [\d,]+ without"]),
    "metadata_ops.py": (["--ops", "20", "--watches", "3", "--rounds", "1", "--backends",
                         "memory,sqlite"],
                        [r"memory\s+create\s+ops/s\s+[\d,.]+",
                         r"sqlite\s+watch\s+ms p50\s+[\d,.]+"]),
    "tiered_read.py": (["--mb", "2", "--segment-mb", "1", "--rounds", "1", "--acks", "200"],
                       [r"  bookies\s+[\d.]+\s+[\d,]+", r"  tier\s+[\d.]+\s+[\d,]+",
                        r"ratio tier / bookies: [\d.]+x", r"offload: \d+ segments, [\d.]+ MB/s",
                        r"one at a time\s+[\d,]+\s+1\.000", r"cumulative/100\s+[\d,]+"]),
    "tail_latency.py": (["--records", "30", "--pace-seconds", "0.1", "--pauses", "0,1",
                         "--readers", "tail,wal"],
                        [r"in process tail\s+0\s+30\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+"
                         r"[\d.]+ .*(met|NOT MET)",
                         r"in process wal\s+1\s+", r"tcp\s+tail\s+1\s+",
                         r"etcd: (one member|not installed)",
                         r"targets: p50 <= 0.5 ms"]),
    "deferred_sync.py": (["--entries", "30", "--rounds", "1", "--every", "1,10"],
                         [r"synced\s+[\d,]+\s+[\d.]+ ms\s+1.00x",
                          r"deferred/10\s+[\d,]+\s+[\d.]+ ms\s+[\d.]+x",
                          r"target: deferred/10 durable rate >= 2x synced: [\d.]+x -> "
                          r"(met|NOT MET)"]),
    "storage_scale.py": (["--entries", "20000"],
                         [r"writes \(entries/s\)\s+[\d,]+\s+[\d,]+\s+[\d.]+x",
                          r"restart \(s\)\s+[\d.]+", r"catch-up interleaved",
                          r"RSS < 512 MB at 100M \(extrapolated\): [\d,]+ MB: (met|NOT MET)",
                          r"interleaved within 2x of alone: .*(met|NOT MET)"]),
    "abuse.py": (["--seconds", "1", "--scale", "0.05"],
                 [r"quiet\s+\d+", r"attacked\s+\d+", r"ratio\s+[\d.]+",
                  r"bookie peak RSS \d+ MiB", r"new clients during the attack"]),
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_benchmark_runs(script: str, tmp_path: Path) -> None:
    args, expected = CASES[script]
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    for pattern in expected:
        assert re.search(pattern, proc.stdout), (pattern, proc.stdout[-3000:])


def test_every_benchmark_is_covered_here_and_by_make_bench() -> None:
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(CASES)
    makefile = (BENCH.parent / "Makefile").read_text()
    target = makefile[makefile.index("\nbench:"):].split("\n\n")[0]
    assert {s for s in scripts if f"benchmarks/{s}" in target} == scripts
    assert "pybk bench" in target


def _load_benchmark(name: str) -> types.ModuleType:
    """A benchmark script as a module (its siblings, such as _common, importable)."""

    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # (its dataclasses look their module up there)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_a_lone_rows_verdict_says_whether_its_target_is_under_the_machines_floor() -> None:
    targets = _load_benchmark("targets")

    def lone(p50_fsyncs: float, floor: float | None, target: str = "<= 2 fsyncs") -> str:
        limit = float(target.split()[1])
        unit_ms = 0.05
        return str(targets.verdict(targets.Row(
            "lone", "", p50_fsyncs * unit_ms, unit_ms, "ms", p50_fsyncs, target,
            p50_fsyncs <= limit, floor=floor, floor_what="the replicas' syncs")))

    assert lone(1.9, 1.8) == "met"
    assert lone(2.5, None) == "NOT MET"
    # the floor leaves (2 - 1.96) fsyncs of 50 us: 2 us for everything else
    assert lone(5.8, 1.96) == "NOT MET; the floor (1.96) leaves 2 us"
    assert lone(5.8, 2.4) == "NOT MET; target UNDER the floor (2.40)"
    assert lone(12.0, 3.0, "<= 3 fsyncs") == "NOT MET; target UNDER the floor (3.00)"


def test_a_throughput_targets_verdict_says_whether_the_driver_alone_could_reach_it() -> None:
    common = _load_benchmark("_common")
    assert common.floor_verdict(True, 1.5, 1.3, "x") == "met"
    # the driver alone reaches 1.34x the ceiling: 1.5x is out of any system's reach
    assert common.floor_verdict(False, 1.5, 1.34, "x") == (
        "NOT MET; target ABOVE the ceiling (1.34x)")
    assert common.floor_verdict(False, 1.5, 2.0, "x") == (
        "NOT MET; the ceiling (2.00x) is above it")
