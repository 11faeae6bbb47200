"""``PybkDataSource``: the ``pybk`` format of Spark's Python data source API (PySpark 4).

::

    spark.dataSource.register(pybk.spark.PybkDataSource)
    df.write.format("pybk").option("metadata", uri).option("log", "events").mode("append").save()
    spark.read.format("pybk").option("metadata", uri).option("log", "events").load()
    spark.readStream.format("pybk").option("metadata", uri).option("log", "events").load()
    stream.writeStream.format("pybk").option("metadata", uri).option("log", "out") \\
        .option("checkpointLocation", dir).start()

Where each method runs (Spark's, not ours to choose): ``writer()``, ``reader()`` and the
stream methods in Python workers on the driver's side, before any task (so option and schema
mistakes fail the query there, naming the option); ``write()`` / ``read()`` in executors'
Python workers; ``commit()`` / ``abort()`` in another driver-side worker. Nothing is shared in
memory between them: what a task needs is pickled with the writer or the partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from pybk.logs.position import Position
from pybk.spark import runtime
from pybk.spark.driver import connect
from pybk.spark.options import OptionError, SourceOptions, parse_options
from pybk.spark.read import FIRST, SegmentRange, TailFinder, plan_ranges, read_partition
from pybk.spark.write import TaskResult, WritePlan, abort_job, commit_job, prepare_write, write_task

__all__ = ["READ_DDL", "PybkCommitMessage", "PybkDataSource"]

#: the columns of a read (Spark DDL)
READ_DDL = ("key BINARY, value BINARY, log STRING, position STRING, segment BIGINT, "
            "entry BIGINT, slot BIGINT")


class PybkCommitMessage(WriterCommitMessage):
    """A task's commit message: what it wrote (see :class:`pybk.spark.write.TaskResult`)."""

    def __init__(self, result: TaskResult) -> None:
        self.result = result


def task_results(messages: Sequence[Any]) -> list[TaskResult | None]:
    return [m.result if isinstance(m, PybkCommitMessage) else None for m in messages]


def task_ids() -> tuple[int, int]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return 0, 0
    return tc.partitionId(), tc.attemptNumber()


class PybkBatchWriter(DataSourceArrowWriter):
    """Batch write: exactly once per task (see :mod:`pybk.spark.write`)."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> PybkCommitMessage:
        partition, attempt = task_ids()
        built = write_task(self.plan, f"p{partition}-a{attempt}", iterator, partition)
        return PybkCommitMessage(TaskResult(self.plan.job, partition, attempt,
                                            tuple(b.to_doc() for b in built)))

    def commit(self, messages: Sequence[Any]) -> None:
        commit_job(self.plan, task_results(messages))

    def abort(self, messages: Sequence[Any]) -> None:
        abort_job(self.plan)


class PybkBatchReader(DataSourceReader):
    """Batch read of ``[startingPosition, endingPosition)``; one partition per segment (or
    per entry range of a big one)."""

    def __init__(self, opts: SourceOptions, ranges: list[SegmentRange]) -> None:
        self.opts = opts
        self.ranges = ranges

    def partitions(self) -> Sequence[SegmentRange]:
        return self.ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.opts, partition)


def plan_batch_read(opts: SourceOptions) -> list[SegmentRange]:
    """On the driver: the partitions of a batch read (the log's end is where it is now)."""
    md = connect(opts)
    start_opt, end_opt = opts.start(), opts.end()

    async def go() -> tuple[Position | None, int]:
        client = await runtime.aclient(opts.metadata)
        finder = TailFinder()
        try:
            return await finder.tail(client, md)
        finally:
            await finder.close()

    tail, tail_entry = runtime.run(go(), timeout=opts.metadata_timeout)
    if tail is None:
        return []
    start = tail if start_opt == "latest" else FIRST if start_opt == "earliest" else start_opt
    end = tail if end_opt == "latest" else end_opt
    assert isinstance(start, Position) and isinstance(end, Position)
    if end > tail:
        end = tail  # records after the end are not there yet
    return plan_ranges(md, start, end, tail_entry, opts.max_partition_bytes)


class PybkDataSource(DataSource):
    """The ``pybk`` format: batch write and read, streaming read and write of pybk logs."""

    @classmethod
    def name(cls) -> str:
        return "pybk"

    def schema(self) -> str:
        return READ_DDL

    def writer(self, schema: Any, overwrite: bool) -> PybkBatchWriter:
        if overwrite:
            raise OptionError("mode", "pybk logs are append-only: use .mode('append') "
                                      "(overwrite is not supported)")
        opts = parse_options(self.options, mode="write")
        return PybkBatchWriter(prepare_write(opts, schema))

    def reader(self, schema: Any) -> PybkBatchReader:
        opts = parse_options(self.options, mode="read")
        return PybkBatchReader(opts, plan_batch_read(opts))

    def streamReader(self, schema: Any) -> Any:
        from pybk.spark.streaming import PybkStreamReader

        opts = parse_options(self.options, mode="stream-read")
        connect(opts)
        return PybkStreamReader(opts)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from pybk.spark.streaming import PybkStreamWriter, prepare_stream_write

        if overwrite:
            raise OptionError("outputMode", "pybk logs are append-only: use "
                                            "outputMode('append')")
        opts = parse_options(self.options, mode="stream-write")
        return PybkStreamWriter(prepare_stream_write(opts, schema))
