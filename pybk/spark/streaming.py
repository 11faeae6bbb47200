"""Structured Streaming with pybk logs: a source whose offsets are positions, and a sink that
publishes each micro-batch once, whatever is replayed.

Design notes: docs/internals.md, "pybk/spark/streaming.py".
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pybk.errors import CursorNotFoundError
from pybk.logs.log import Log
from pybk.logs.meta import TRUNCATED, LogMetadata
from pybk.logs.position import Position
from pybk.spark import jobs, runtime
from pybk.spark.options import OptionError, SourceOptions
from pybk.spark.read import FIRST, SegmentRange, TailFinder, plan_ranges, read_partition
from pybk.spark.source import PybkCommitMessage, task_ids, task_results
from pybk.spark.write import (
    TaskResult,
    WritePlan,
    collect_built,
    finish_and_sweep,
    prepare_write,
    publish_and_sweep,
    write_task,
)

__all__ = ["PybkStreamReader", "PybkStreamWriter", "StreamWritePlan", "prepare_stream_write"]

#: a micro-batch's job records are forgotten this many batches later
_KEEP_BATCHES = 10


class PybkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming source (see the module doc). Its offset methods run in one long-lived
    driver-side worker for the whole query, which keeps a :class:`TailFinder` open."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._finder: TailFinder | None = None
        self._target: Position | None = None  # availableNow: where the query stops
        self._cursor_at: Position | None = None  # where this query last reset its cursor

    # -- offsets -----------------------------------------------------------------------------

    def _offset(self, pos: Position) -> dict[str, str]:
        return {"log": self.opts.log_key, "position": str(pos)}

    def _position(self, offset: dict[str, Any]) -> Position:
        if offset.get("log") != self.opts.log_key:
            raise OptionError("log", f"the query's checkpoint was made reading "
                                     f"{offset.get('log')!r}, not {self.opts.log_key!r}")
        return Position.parse(str(offset["position"]))

    async def _state(self) -> tuple[Any, LogMetadata, TailFinder]:
        client = await runtime.aclient(self.opts.metadata)
        md = await (await self._log()).metadata()
        if self._finder is None:
            self._finder = TailFinder()
        return client, md, self._finder

    async def _tail(self) -> Position | None:
        client, md, finder = await self._state()
        tail, _ = await finder.tail(client, md)
        return tail

    def initialOffset(self) -> dict[str, str]:
        if self.opts.cursor is not None:  # a new query resumes where the cursor is
            at = runtime.run(self._cursor_start())
            if at is not None:
                return self._offset(at)
        start = self.opts.start()
        if isinstance(start, Position):
            return self._offset(start)
        if start == "latest":
            tail = runtime.run(self._tail())
            return self._offset(tail if tail is not None else FIRST)
        return self._offset(FIRST)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_records_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tail = runtime.run(self._tail())
        self._target = tail if tail is not None else FIRST

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, str]:
        begin = self._position(start) if start else FIRST
        if start and self.opts.cursor is not None:
            self._consumed(begin)  # (the batch that ended at ``start`` is done)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if max_rows is None and limit is None:
            max_rows = self.opts.max_records_per_trigger
        return self._offset(runtime.run(self._latest(begin, max_rows)))

    async def _latest(self, start: Position, max_rows: int | None) -> Position:
        client, md, finder = await self._state()
        tail, _ = await finder.tail(client, md)
        if tail is None:
            return start
        target = tail if self._target is None else min(tail, self._target)
        if target <= start:
            return start
        if max_rows is None:
            return target
        tb = md.truncated_before
        cur = max(start, tb) if tb is not None else start
        remaining = max_rows
        for seg in md.segments:
            if seg.state == TRUNCATED or seg.seq < cur.segment or seg.seq > target.segment:
                continue
            seg_start = cur if seg.seq == cur.segment else Position(seg.seq, 0, 0)
            if seg.seq == target.segment:
                seg_end = target
            elif seg.last_position is not None:
                seg_end = seg.last_position.next_slot()
            else:
                continue
            if seg_end <= seg_start:
                continue
            begin = await finder.index(client, seg, seg_start)
            stop = await finder.index(client, seg, seg_end)
            if stop - begin <= remaining:
                remaining -= stop - begin
                if remaining == 0:
                    return seg_end
                continue
            return await finder.position_of(client, seg, begin + remaining, seg_start.entry,
                                            seg_end.entry)
        return target

    # -- batches -----------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[SegmentRange]:
        a, b = self._position(start), self._position(end)
        if b <= a:
            return []

        async def meta() -> LogMetadata:
            return (await self._state())[1]

        md = runtime.run(meta())
        return plan_ranges(md, a, b, b.entry, self.opts.max_partition_bytes)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.opts, partition)

    async def _log(self) -> Log:
        client = await runtime.aclient(self.opts.metadata)
        return await client.namespace(self.opts.namespace).open_log(self.opts.log)

    async def _cursor_start(self) -> Position | None:
        """The cursor's resume point (None: no cursor yet, or it consumed nothing)."""
        assert self.opts.cursor is not None
        try:
            return await (await self._log()).cursor_resume_point(self.opts.cursor)
        except CursorNotFoundError:
            return None

    def commit(self, end: dict[str, Any]) -> None:
        """The batch up to ``end`` is done: the query's cursor (if any) consumed it all."""
        pos = self._position(end)
        if self.opts.cursor is not None:
            self._consumed(pos)

    def _consumed(self, pos: Position) -> None:
        """Reset the query's cursor to ``pos``, once per position. Spark commits a batch to
        the source only when it plans the next one, so the cursor is also moved when the
        next batch's start is asked for: the last batch of an availableNow run counts too."""
        if pos != self._cursor_at:
            runtime.run(self._reset(pos))
            self._cursor_at = pos

    async def _reset(self, pos: Position) -> None:
        assert self.opts.cursor is not None
        await (await self._log()).reset_cursor(self.opts.cursor, pos, create=True)

    def stop(self) -> None:
        finder, self._finder = self._finder, None
        if finder is not None:
            runtime.run(finder.close())


@dataclasses.dataclass(frozen=True)
class StreamWritePlan:
    """A streaming write: the checks and settings of a batch write, and the sink's id."""

    write: WritePlan
    sink_id: str

    def batch(self, batch_id: int) -> str:
        """The job group of micro-batch ``batch_id`` (each run's attempt is a job in it)."""
        digest = hashlib.sha256(self.sink_id.encode()).hexdigest()[:20]
        return f"{digest}.b{batch_id}"


def prepare_stream_write(opts: SourceOptions, schema: Any) -> StreamWritePlan:
    """On the driver (when the query starts, and again for each commit: Spark makes the
    stream writer anew there): the checks of a batch write."""
    plan = prepare_write(opts, schema, job="stream", begin=False)
    return StreamWritePlan(plan, opts.sink_id)


def _task_batch() -> tuple[int, str]:
    """(the micro-batch id, the query run's id) of the running task."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    raw = tc.getLocalProperty("streaming.sql.batchId") if tc is not None else None
    if raw is None:
        raise RuntimeError("pybk streaming sink: the task does not know its micro-batch id "
                           "(no streaming.sql.batchId local property)")
    run = tc.getLocalProperty("spark.jobGroup.id") if tc is not None else None
    return int(raw), run or uuid.uuid4().hex  # Spark's job group of a micro-batch: the run id


class PybkStreamWriter(DataSourceStreamArrowWriter):
    """The streaming sink: each micro-batch exactly once (see the module doc)."""

    def __init__(self, plan: StreamWritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> PybkCommitMessage:
        partition, attempt = task_ids()
        batch_id, run = _task_batch()
        job = f"{self.plan.batch(batch_id)}/{run}"
        write = dataclasses.replace(self.plan.write, job=job)
        built = write_task(write, f"p{partition}-a{attempt}", iterator, partition)
        return PybkCommitMessage(TaskResult(job, partition, attempt,
                                            tuple(b.to_doc() for b in built)))

    def _job_ids(self, batch_id: int, results: list[TaskResult | None]) -> Any:
        opts = self.plan.write.options
        group = self.plan.batch(batch_id)

        async def ids() -> list[str]:
            client = await runtime.aclient(opts.metadata)
            listed = set(await jobs.list_jobs(client.store, group))
            return sorted(listed | {r.job for r in results if r is not None})

        return ids

    def commit(self, messages: Sequence[Any], batchId: int) -> None:
        opts = self.plan.write.options
        group = self.plan.batch(batchId)
        results = task_results(messages)
        built = collect_built(results, lambda job: job.startswith(group + "/"))

        async def go() -> None:
            await publish_and_sweep(opts, built, origin=f"spark:{group}",
                                    job_ids=self._job_ids(batchId, results),
                                    sink=(self.plan.sink_id, batchId))
            if batchId >= _KEEP_BATCHES:  # stragglers of old batches: long gone
                client = await runtime.aclient(opts.metadata)
                await jobs.forget_jobs(client, self.plan.batch(batchId - _KEEP_BATCHES))

        runtime.run(go())

    def abort(self, messages: Sequence[Any], batchId: int) -> None:
        opts = self.plan.write.options

        async def go() -> None:
            ids = await self._job_ids(batchId, task_results(messages))()
            await finish_and_sweep(opts, ids, jobs.ABORTED)

        runtime.run(go())
