"""Writes exactly once per task: what a task does with its rows, and what the driver does
with the tasks' results (commit or abort).

A task (:func:`write_task`) packs its partition's Arrow batches into envelopes and writes them
with a :class:`~pybk.logs.SegmentBuilder` into ledgers of its own, each listed under the
task attempt before it exists (:mod:`pybk.spark.jobs`); none is a segment of the log, so no
reader sees them. It returns their descriptions, which travel to the driver in the task's
commit message. The driver (:func:`commit_job`) publishes every successful attempt's ledgers
as segments of the log in one compare-and-set, marks the job committed and deletes every
other ledger the job's attempts listed (failed attempts, speculative copies, stragglers).
:func:`abort_job` marks the job aborted and deletes all of them. A retried task thus leaves
nothing of its failed attempt, and a failed job leaves nothing at all.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pybk.logs.builder import BuiltSegment, SegmentBuilder
from pybk.logs.config import LogConfig
from pybk.logs.publish import PublishResult
from pybk.spark import jobs, runtime
from pybk.spark.arrow import is_binary_like, pack_batch
from pybk.spark.driver import connect, now_ms
from pybk.spark.options import SourceOptions

__all__ = ["TaskResult", "WritePlan", "abort_job", "commit_job", "prepare_write", "write_task"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WritePlan:
    """What every task of one write needs (made on the driver, pickled to the tasks)."""

    options: SourceOptions
    job: str
    config: LogConfig
    value_column: str
    key_column: str | None


@dataclass(frozen=True)
class TaskResult:
    """What one task attempt wrote: the ledgers, described, in the order written."""

    job: str
    partition: int
    attempt: int
    segments: tuple[dict[str, int], ...]

    @property
    def built(self) -> list[BuiltSegment]:
        return [BuiltSegment.from_doc(d) for d in self.segments]


def _field_type(field: Any) -> str:
    return str(field.dataType.simpleString())


def resolve_columns(names_and_types: Sequence[tuple[str, str]]) -> tuple[str, str | None]:
    """The value column and the key column (or None), matched case-insensitively as Spark
    does; ValueError naming the columns the DataFrame has when ``value`` is missing or a
    column is neither binary nor string."""
    by_lower = {n.lower(): (n, t) for n, t in names_and_types}
    have = ", ".join(f"{n} {t}" for n, t in names_and_types) or "none"
    found = by_lower.get("value")
    if found is None:
        raise ValueError(f"pybk data source: column 'value' is required (binary or string); "
                         f"the DataFrame has columns: {have}")
    if found[1] not in ("binary", "string"):
        raise ValueError(f"pybk data source: column 'value' must be binary or string, not "
                         f"{found[1]}")
    key = by_lower.get("key")
    if key is not None and key[1] not in ("binary", "string"):
        raise ValueError(f"pybk data source: column 'key' must be binary or string, not "
                         f"{key[1]}")
    return found[0], None if key is None else key[0]


def prepare_write(opts: SourceOptions, schema: Any, *, job: str | None = None,
                  begin: bool = True) -> WritePlan:
    """On the driver, before any task: check the columns, the store, the log (created with
    ``createLog``) and that a publish may follow; begin the job (unless ``begin`` is off: a
    streaming write's micro-batches are jobs of their own). ``schema`` is the DataFrame's
    Spark StructType."""
    cols = [(f.name, _field_type(f)) for f in schema.fields]
    value_col, key_col = resolve_columns(cols)
    md = connect(opts, create=opts.create_log, for_write=True)
    job = job or uuid.uuid4().hex

    async def start() -> None:
        client = await runtime.aclient(opts.metadata)
        await jobs.begin_job(client, job, opts.log_key, now_ms())

    if begin:
        runtime.run(start(), timeout=opts.metadata_timeout)
    return WritePlan(opts, job, md.config, value_col, key_col)


def write_task(plan: WritePlan, task: str, batches: Iterable[Any],
               partition: int = -1) -> list[BuiltSegment]:
    """In a task: write the Arrow record batches into fresh ledgers (nothing visible yet);
    their descriptions. On any failure the ledgers this attempt made are deleted."""
    opts = plan.options
    client = runtime.client(opts.metadata)
    tl = jobs.TaskLedgers(client, plan.job, task, opts.log_key, plan.config)
    builder = SegmentBuilder(
        client, opts.log_key, plan.config, flush_bytes=opts.batch_bytes,
        max_pending_bytes=opts.max_in_flight_bytes,
        custom_metadata={"pybk.spark.job": plan.job.encode(), "pybk.spark.task": task.encode()},
        create_ledger=tl.create,
    )
    where = f" of partition {partition}" if partition >= 0 else ""
    try:
        runtime.run(tl.start(now_ms()))
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if not is_binary_like(batch.schema.field(plan.value_column).type):
                raise ValueError(f"column '{plan.value_column}' is "
                                 f"{batch.schema.field(plan.value_column).type}, not binary")
            for chunk in pack_batch(batch, plan.value_column, plan.key_column,
                                    opts.batch_bytes, where=where):
                runtime.run(builder.add_packed(chunk.count, chunk.lengths, chunk.data,
                                               key_lengths=chunk.key_lengths,
                                               key_data=chunk.key_data))
        built = runtime.run(builder.finish())
        runtime.run(tl.check_open())
    except BaseException:
        try:
            runtime.run(_discard(builder, tl), timeout=60.0)
        except Exception as exc:
            log.warning("spark job %s task %s: could not delete its ledgers (the driver's "
                        "sweep will): %r", plan.job, task, exc)
        raise
    return built


async def _discard(builder: SegmentBuilder, tl: jobs.TaskLedgers) -> None:
    try:
        await builder.abort()
    finally:
        await tl.delete_all()


def collect_built(results: Iterable[TaskResult | None],
                  belongs: Callable[[str], bool]) -> list[BuiltSegment]:
    """The ledgers of the tasks' results, in partition order (each partition once); a result
    of a job that does not ``belong`` is refused."""
    chosen: dict[int, TaskResult] = {}
    for r in results:
        if r is None:
            continue
        if not belongs(r.job):
            raise ValueError(f"a commit message of job {r.job} reached another job")
        if r.partition in chosen:
            raise ValueError(f"two results for partition {r.partition} of job {r.job}")
        chosen[r.partition] = r
    return [b for p in sorted(chosen) for b in chosen[p].built]


async def publish_and_sweep(opts: SourceOptions, built: list[BuiltSegment], *, origin: str,
                            job_ids: Callable[[], Awaitable[Iterable[str]]],
                            sink: tuple[str, int] | None = None) -> PublishResult:
    """Publish ``built`` in one CAS; then mark the jobs committed and delete every ledger
    they listed that is not a segment of the log. If the publish fails, the jobs are
    aborted (their ledgers deleted) and the error raised."""
    client = await runtime.aclient(opts.metadata)
    try:
        lg = await client.namespace(opts.namespace).open_log(opts.log)
        result = await lg.publish(built, origin=origin, sink=sink,
                                  fence_writer=opts.fence_writer)
    except BaseException:
        await finish_and_sweep(opts, await job_ids(), jobs.ABORTED)
        raise
    await finish_and_sweep(opts, await job_ids(), jobs.COMMITTED)
    return result


async def finish_and_sweep(opts: SourceOptions, job_ids: Iterable[str], state: str) -> list[int]:
    """Mark each job ``state`` (committed or aborted), then delete the ledgers its tasks
    listed that are not segments of the log; the ids deleted."""
    client = await runtime.aclient(opts.metadata)
    deleted: list[int] = []
    for job in job_ids:
        await jobs.finish_job(client.store, job, opts.log_key, state, now_ms())
        deleted += await jobs.sweep_job(client, job, opts.log_key)
    return deleted


def commit_job(plan: WritePlan, results: Iterable[TaskResult | None]) -> PublishResult:
    """On the driver: publish every task's ledgers in one CAS (partition order), mark the job
    committed and delete every other ledger its attempts listed. On failure the job is
    aborted (and the error raised)."""
    built = collect_built(results, lambda job: job == plan.job)

    async def ids() -> list[str]:
        return [plan.job]

    return runtime.run(publish_and_sweep(plan.options, built, origin=f"spark:{plan.job}",
                                         job_ids=ids))


def abort_job(plan: WritePlan) -> list[int]:
    """On the driver: mark the job aborted and delete every ledger its tasks listed; the ids
    deleted."""
    return runtime.run(finish_and_sweep(plan.options, [plan.job], jobs.ABORTED))
