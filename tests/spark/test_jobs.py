"""The job records behind exactly-once Spark writes, without Spark: whatever a task attempt
made is found and deleted after a crash at any point, a straggler that outlives its job cleans
up after itself, and published ledgers are never swept."""

from __future__ import annotations

import pytest
from logs_kit import mem_cluster

from pybk.errors import NoSuchLedgerError
from pybk.logs import BuiltSegment
from pybk.spark import jobs

KEY = "logs/default/l"


async def _exists(client, lid: int) -> bool:  # type: ignore[no-untyped-def]
    try:
        await client.ledger_metadata(lid)
    except NoSuchLedgerError:
        return False
    return True


async def test_a_crashed_attempts_ledgers_are_swept_wherever_it_stopped() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        md = await log.metadata()
        await jobs.begin_job(client, "job1", KEY, 1000)
        # attempt 0 writes two ledgers, then its process dies (no cleanup at all)
        dead = jobs.TaskLedgers(client, "job1", "p0-a0", KEY, md.config)
        await dead.start(1000)
        b = await log.segment_builder(create_ledger=dead.create, flush_records=2)
        await b.append_many([b"a", b"b", b"c"])
        made = list(dead.ledgers)
        assert made and all([await _exists(client, lid) for lid in made])
        # attempt 1 dies between listing an id and creating the ledger
        half = jobs.TaskLedgers(client, "job1", "p1-a0", KEY, md.config)
        await half.start(1000)
        await half._list(await client.store.allocate_ledger_id())
        # attempt 2 succeeds and is published
        ok = jobs.TaskLedgers(client, "job1", "p0-a1", KEY, md.config)
        await ok.start(1000)
        b2 = await log.segment_builder(create_ledger=ok.create)
        await b2.append_many([b"a", b"b", b"c"])
        built = await b2.finish()
        await log.publish(built, origin="spark:job1")
        await jobs.finish_job(client.store, "job1", KEY, jobs.COMMITTED, 2000)
        deleted = await jobs.sweep_job(client, "job1", KEY)
        assert sorted(deleted) == sorted(made)
        assert not any([await _exists(client, lid) for lid in made])
        assert await _exists(client, built[0].ledger_id)  # the published one stays
        assert await client.store.list_keys("spark/tasks/") == []
        assert await jobs.job_state(client.store, "job1") == jobs.COMMITTED


async def test_a_straggler_cleans_up_after_its_job_finished() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        md = await log.metadata()
        await jobs.begin_job(client, "job2", KEY, 1000)
        slow = jobs.TaskLedgers(client, "job2", "p3-a1", KEY, md.config)
        await slow.start(1000)
        first = await slow.create({"pybk.log": KEY.encode()})
        await first.append(b"x")
        # meanwhile the job is committed without this attempt and swept
        await jobs.finish_job(client.store, "job2", KEY, jobs.COMMITTED, 2000)
        assert await jobs.sweep_job(client, "job2", KEY) == [first.id]
        # the straggler's next ledger: listed, made, then it sees the job closed
        with pytest.raises(jobs.JobClosedError, match="straggler"):
            await slow.create({"pybk.log": KEY.encode()})
        assert not any([await _exists(client, lid) for lid in slow.ledgers])
        assert await client.store.list_keys("spark/tasks/") == []  # its list went too
        late = jobs.TaskLedgers(client, "job2", "p4-a0", KEY, md.config)
        with pytest.raises(jobs.JobClosedError):
            await late.start(3000)
        # an aborted job: everything listed goes, the log's segments stay
        await jobs.begin_job(client, "job3", KEY, 4000)
        t = jobs.TaskLedgers(client, "job3", "p0-a0", KEY, md.config)
        await t.start(4000)
        b = await log.segment_builder(create_ledger=t.create)
        await b.append_many([b"y"])
        built = await b.finish()
        await jobs.finish_job(client.store, "job3", KEY, jobs.ABORTED, 5000)
        assert await jobs.sweep_job(client, "job3", KEY) == [built[0].ledger_id]
        with pytest.raises(ValueError, match="does not exist"):
            await log.publish([BuiltSegment.from_doc(built[0].to_doc())])


async def test_finished_job_records_expire_and_stream_batches_are_grouped() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        store = client.store
        log = await client.namespace().create_log("l")
        await jobs.begin_job(client, "old", KEY, 0)
        killed = jobs.TaskLedgers(client, "old", "p0-a0", KEY, (await log.metadata()).config)
        await killed.start(0)
        leftover = await killed.create({"pybk.log": KEY.encode()})  # then killed, no cleanup
        await jobs.finish_job(store, "old", KEY, jobs.COMMITTED, 1)
        await jobs.begin_job(client, "running", KEY, 1)  # open: never expired
        await jobs.begin_job(client, "new", KEY, jobs.FINISHED_TTL_MS + 10)
        names = [k.split("/", 2)[2] for k in await store.list_keys("spark/jobs/")]
        assert sorted(names) == ["new", "running"]
        # expiring the finished job swept what its killed straggler left
        assert not await _exists(client, leftover.id)
        assert await store.list_keys("spark/tasks/") == []
        await jobs.finish_job(store, "sink.b4/run-a", KEY, jobs.ABORTED, 5)  # no record yet
        await jobs.begin_job(client, "sink.b4/run-b", KEY, 6)
        assert await jobs.list_jobs(store, "sink.b4") == ["sink.b4/run-a", "sink.b4/run-b"]
        assert await jobs.job_state(store, "sink.b4/run-a") == jobs.ABORTED
        await jobs.forget_jobs(client, "sink.b4")
        assert await jobs.list_jobs(store, "sink.b4") == []
        with pytest.raises(ValueError, match="committed or aborted"):
            await jobs.finish_job(store, "new", KEY, jobs.OPEN, 7)


async def test_jobs_whose_driver_died_are_swept_by_age() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        md = await log.metadata()
        for job, began in (("dead", 1000), ("young", 9000)):
            await jobs.begin_job(client, job, KEY, began)
            t = jobs.TaskLedgers(client, job, "p0-a0", KEY, md.config)
            await t.start(began)
            b = await log.segment_builder(create_ledger=t.create)
            await b.append_many([b"z"])
            await b.finish()
        dead_ledgers = set(await client.list_ledgers())
        swept = await jobs.sweep_stale_jobs(client, older_than_ms=5000, now_ms=10_000)
        assert list(swept) == ["dead"] and len(swept["dead"]) == 1
        assert set(await client.list_ledgers()) == dead_ledgers - set(swept["dead"])
        assert await jobs.job_state(client.store, "dead") == jobs.ABORTED
        assert await jobs.job_state(client.store, "young") == jobs.OPEN


def test_sweep_jobs_after_a_driver_died_mid_write(bookies) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    import pybk.spark
    from pybk.spark.options import parse_options
    from pybk.spark.write import prepare_write, write_task

    bookies.create_log("orphaned")
    before = bookies.ledgers()
    opts = parse_options({"metadata": bookies.metadata, "log": "orphaned"}, mode="write")
    plan = prepare_write(opts, StructType([StructField("value", BinaryType())]))
    batch = pa.RecordBatch.from_pydict({"value": [b"r%d" % i for i in range(1000)]})
    built = write_task(plan, "p0-a0", [batch])  # a task finished; then the driver died
    assert {b.ledger_id for b in built} <= bookies.ledgers() - before
    swept = pybk.spark.sweep_jobs(bookies.metadata, older_than=0)
    assert sorted(swept[plan.job]) == sorted(b.ledger_id for b in built)
    assert bookies.ledgers() == before and bookies.segments("orphaned") == []
    assert bookies.keys(f"spark/tasks/{plan.job}/") == []
    with pytest.raises(ValueError, match="older_than"):
        pybk.spark.sweep_jobs(bookies.metadata, older_than=-1)
