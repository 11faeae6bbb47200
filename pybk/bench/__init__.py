"""Measuring pybk: the same-run ceilings, load drivers and latency summaries.

What ``pybk bench`` and the scripts in ``benchmarks/`` share, so a figure printed by one means
the same as the other's (listed in docs/internals.md, "pybk/bench/__init__.py").
"""

from pybk.bench.ceiling import (
    GroupCommitFile,
    RecordFile,
    frame_records,
    fsync_latencies,
    plain_group_commit,
    replica_sync_floor,
)
from pybk.bench.drive import Run, closed_loop, open_loop
from pybk.bench.stats import LatencySummary, median, percentile
from pybk.bench.writes import WriteBench, WriteReport, run_write_bench

__all__ = [
    "GroupCommitFile",
    "LatencySummary",
    "RecordFile",
    "Run",
    "WriteBench",
    "WriteReport",
    "closed_loop",
    "frame_records",
    "fsync_latencies",
    "median",
    "open_loop",
    "percentile",
    "plain_group_commit",
    "replica_sync_floor",
    "run_write_bench",
]
