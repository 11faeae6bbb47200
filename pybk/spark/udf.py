"""Bulk writes from a DataFrame pipeline: :func:`write_partitions`, on ``mapInArrow``.

Each partition's Arrow batches go straight into ledgers of their own (the path of a batch write
through the data source, :mod:`pybk.spark.write`); the function a user would hand to
``mapInArrow`` yields one row per ledger written, and the driver then publishes all of them
in one compare-and-set and answers a DataFrame with one row per ledger: partition, ledger id,
records, first and last position. A pandas UDF (or any transformation) upstream shapes the
``value`` (and ``key``) columns; see ``spark_examples/bulk_write_udf.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pybk.spark.options import parse_options
from pybk.spark.source import task_ids
from pybk.spark.write import TaskResult, WritePlan, abort_job, commit_job, prepare_write, write_task

__all__ = ["LEDGER_ROWS", "RESULT_ROWS", "partition_writer", "write_partitions"]

#: what each task of the mapInArrow stage yields: one row per ledger it wrote
LEDGER_ROWS = ("partition INT, attempt INT, ledger_id BIGINT, last_entry BIGINT, "
               "last_slot BIGINT, records BIGINT, bytes BIGINT")
#: what write_partitions returns: one row per ledger, once published
RESULT_ROWS = ("partition INT, ledger_id BIGINT, segment BIGINT, records BIGINT, "
               "first_position STRING, last_position STRING")


def partition_writer(plan: WritePlan) -> Any:
    """The function for ``df.mapInArrow(fn, LEDGER_ROWS)``: writes the partition's batches
    (nothing visible until :func:`pybk.spark.write.commit_job` publishes the rows' ledgers)."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        partition, attempt = task_ids()
        built = write_task(plan, f"p{partition}-a{attempt}", batches, partition)
        if built:
            yield pa.RecordBatch.from_pylist(
                [{"partition": partition, "attempt": attempt, "ledger_id": b.ledger_id,
                  "last_entry": b.last_entry, "last_slot": b.last_slot,
                  "records": b.records, "bytes": b.bytes} for b in built],
                schema=pa.schema([("partition", pa.int32()), ("attempt", pa.int32()),
                                  ("ledger_id", pa.int64()), ("last_entry", pa.int64()),
                                  ("last_slot", pa.int64()), ("records", pa.int64()),
                                  ("bytes", pa.int64())]),
            )

    return write


def write_partitions(
    df: Any,
    *,
    metadata: str,
    log: str,
    namespace: str = "default",
    create_log: bool = False,
    fence_writer: bool = False,
    batch_bytes: int = 1 << 20,
    max_in_flight_bytes: int = 64 << 20,
    metadata_timeout: float = 15.0,
    **log_settings: Any,
) -> Any:
    """Write ``df`` (a ``value`` column, binary or string, and an optional ``key``) to the log
    and return a DataFrame of what was written, one row per ledger (RESULT_ROWS).

    Exactly once: every partition's ledgers are published together, in one compare-and-set,
    after the stage succeeded; failed or speculative attempts, or a failed stage, leave
    nothing behind. ``log_settings`` (``ensemble_size``, ``write_quorum``, ``ack_quorum``,
    ``compression``, ``roll_bytes``) apply when ``create_log`` creates the log. Errors in the
    arguments are raised here, naming the data source option they stand for, before any
    task runs."""
    names = {"ensemble_size": "ensembleSize", "write_quorum": "writeQuorum",
             "ack_quorum": "ackQuorum", "compression": "compression", "roll_bytes": "rollBytes"}
    unknown = set(log_settings) - set(names)
    if unknown:
        raise TypeError(f"write_partitions() got unexpected arguments {sorted(unknown)}")
    raw = {"metadata": metadata, "log": log, "namespace": namespace,
           "createlog": str(create_log).lower(), "fencewriter": str(fence_writer).lower(),
           "batchbytes": str(batch_bytes), "maxinflightbytes": str(max_in_flight_bytes),
           "metadatatimeout": str(metadata_timeout)}
    raw.update({names[k].lower(): str(v) for k, v in log_settings.items()})
    opts = parse_options(raw, mode="write")
    plan = prepare_write(opts, df.schema)
    try:
        rows = df.mapInArrow(partition_writer(plan), LEDGER_ROWS).collect()
    except BaseException:
        abort_job(plan)
        raise
    by_partition: dict[int, list[Any]] = {}
    for r in rows:
        by_partition.setdefault(r["partition"], []).append(r)
    results = []
    for p, prow in sorted(by_partition.items()):
        attempts = {r["attempt"] for r in prow}
        if len(attempts) != 1:
            abort_job(plan)
            raise RuntimeError(f"partition {p} came back from attempts {sorted(attempts)}")
        results.append(TaskResult(plan.job, p, attempts.pop(), tuple(
            {"ledger": r["ledger_id"], "last_entry": r["last_entry"],
             "last_slot": r["last_slot"], "records": r["records"], "bytes": r["bytes"]}
            for r in prow)))
    published = commit_job(plan, results)
    seg_of = {s.ledger_id: s for s in published.segments}
    out = []
    for res in results:
        for b in res.built:
            seg = seg_of[b.ledger_id]
            last = seg.last_position
            out.append((res.partition, b.ledger_id, seg.seq, b.records,
                        f"{seg.seq}:0:0", str(last) if last is not None else None))
    return df.sparkSession.createDataFrame(out, RESULT_ROWS)
