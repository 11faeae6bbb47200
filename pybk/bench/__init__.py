"""Measuring pybk: the same-run ceilings, load drivers and latency summaries.

What ``pybk bench`` and the scripts in ``benchmarks/`` share, so a figure printed by one means
the same as the other's:

* :mod:`pybk.bench.ceiling`: the raw-disk reference a durable log is measured against: CRC-framed
  records, one ``write`` and one ``fdatasync`` per group, on one file that is either appended
  to (it grows) or preallocated (zero-filled and synced beforehand, then written in place, as
  a bookie's preallocated journal segments are); an asyncio one-writer-task form and a plain
  loop; the latency of one small write plus its fdatasync.
* :mod:`pybk.bench.tcp_floor`: the machine's floor for a lone replicated write over loopback
  TCP: the simplest Python servers that write, fdatasync and answer, in processes of their
  own, on the same event loop as the row they stand beside.
* :mod:`pybk.bench.drive`: closed-loop (N in flight) and open-loop (a fixed rate, latency
  counted from when each append was due) drivers of any ``append() -> Future``.
* :mod:`pybk.bench.stats`: percentiles and a latency summary.
* :mod:`pybk.bench.writes`: ``pybk bench``'s measurement (a ledger's appends, then the
  ceiling under the same load on the same disk).

Nothing here is used by pybk's own read or write paths.
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
