"""Batch writes and reads through the ``pybk`` data source, on real Spark and real bookie
processes: a round trip, exactly once per task (a task failing its first attempt, a job
failing midway), a live writer, and bad input refused on the driver before any task writes."""

from __future__ import annotations

import collections
import os
from typing import Any

import pytest
from pyspark.sql import functions as F

from pybk.logs import COMPLETED, Position

N = 100_000
PARTS = 8


def _frame(spark: Any, n: int = N, parts: int = PARTS) -> Any:
    """Rows ``v<id>`` with key ``k<id % 97>`` (no key when id % 10 == 0), in ``parts``
    partitions of consecutive ids."""
    ids = spark.range(0, n, numPartitions=parts)
    return ids.select(
        F.when(F.col("id") % 10 == 0, F.lit(None))
        .otherwise(F.concat(F.lit("k"), (F.col("id") % 97).cast("string")))
        .cast("binary").alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"),
    )


def _expected(n: int = N) -> collections.Counter[tuple[bytes | None, bytes]]:
    return collections.Counter(
        (None if i % 10 == 0 else b"k%d" % (i % 97), b"v%d" % i) for i in range(n))


def _write(df: Any, bookies: Any, log: str, **options: str) -> None:
    w = df.write.format("pybk").option("metadata", bookies.metadata).option("log", log)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()


def _read(spark: Any, bookies: Any, log: str, **options: str) -> Any:
    r = spark.read.format("pybk").option("metadata", bookies.metadata).option("log", log)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _no_leftovers(bookies: Any, before: set[int], log: str) -> None:
    """Every ledger made since ``before`` is a segment of the log; no task lists remain."""
    segs = {s.ledger_id for s in bookies.segments(log)}
    assert bookies.ledgers() - before <= segs, "orphan ledgers"
    assert bookies.keys("spark/tasks/") == []


def test_round_trip_100k_rows_in_8_partitions(spark: Any, bookies: Any) -> None:
    bookies.create_log("roundtrip", compression="zstd")
    before = bookies.ledgers()
    _write(_frame(spark), bookies, "roundtrip")
    segs = bookies.segments("roundtrip")
    assert len(segs) == PARTS and all(s.state == COMPLETED for s in segs)
    assert sum(s.records for s in segs) == N
    assert len({s.origin for s in segs}) == 1 and segs[0].origin.startswith("spark:")
    _no_leftovers(bookies, before, "roundtrip")

    df = _read(spark, bookies, "roundtrip")
    assert df.columns == ["key", "value", "log", "position", "segment", "entry", "slot"]
    rows = df.collect()
    assert collections.Counter((r.key, r.value) for r in rows) == _expected()
    assert {r.log for r in rows} == {"roundtrip"}
    by_segment: dict[int, list[Any]] = collections.defaultdict(list)
    for r in rows:
        assert r.position == f"{r.segment}:{r.entry}:{r.slot}"
        by_segment[r.segment].append(Position(r.segment, r.entry, r.slot))
    for seg, positions in by_segment.items():
        positions.sort()
        assert len(set(positions)) == len(positions), f"repeated positions in segment {seg}"
    # a partition's rows keep their order inside their segment: consecutive ids
    for seg in by_segment:
        vals = [int(r.value[1:]) for r in sorted(
            (r for r in rows if r.segment == seg), key=lambda r: (r.entry, r.slot))]
        assert vals == list(range(vals[0], vals[0] + len(vals)))
    # the log layer's own reader agrees, keys included
    recs = bookies.records("roundtrip")
    assert collections.Counter((r.key, r.data) for r in recs) == _expected()
    assert [r.position for r in recs] == sorted(r.position for r in recs)


def test_big_segments_split_and_position_ranges(spark: Any, bookies: Any) -> None:
    bookies.create_log("ranges")
    _write(_frame(spark, 20_000, 4), bookies, "ranges", batchBytes="4096")
    whole = _read(spark, bookies, "ranges")
    assert whole.rdd.getNumPartitions() == 4
    split = _read(spark, bookies, "ranges", maxPartitionBytes="16384")
    expect = 0
    for s in bookies.segments("ranges"):  # entry ranges of about 16 KiB per segment
        entries = s.last_entry + 1
        per = max(1, 16384 // (s.bytes // entries))
        expect += -(-entries // per)
    assert split.rdd.getNumPartitions() == expect > 4 * 4
    assert collections.Counter(tuple(r) for r in split.collect()) == collections.Counter(
        tuple(r) for r in whole.collect())
    segs = bookies.segments("ranges")
    start, end = f"{segs[1].seq}:3:7", f"{segs[3].seq}:0:0"
    part = _read(spark, bookies, "ranges", startingPosition=start, endingPosition=end)
    got = sorted(Position(r.segment, r.entry, r.slot) for r in part.collect())
    want = sorted(Position(r.segment, r.entry, r.slot) for r in whole.collect()
                  if Position.parse(start) <= Position(r.segment, r.entry, r.slot)
                  < Position.parse(end))
    assert got == want and got[0] == Position.parse(start)
    assert {p.segment for p in got} == {segs[1].seq, segs[2].seq}
    assert _read(spark, bookies, "ranges", startingPosition="latest").count() == 0


def test_a_task_failing_its_first_attempt_leaves_each_row_once(spark: Any, bookies: Any,
                                                              tmp_path: Any) -> None:
    bookies.create_log("retried")
    before = bookies.ledgers()
    marker = str(tmp_path / "failed-once")

    @F.udf("string")
    def flaky(value):  # type: ignore[no-untyped-def]  (hints would make it an Arrow UDF)
        from pyspark import TaskContext

        tc = TaskContext.get()
        # partition 3 holds ids 37500..49999: die on attempt 0 after ~9000 rows were written
        if tc.partitionId() == 3 and tc.attemptNumber() == 0 and value == "v46500":
            open(marker, "w").close()  # proof that the failure ran
            raise RuntimeError("injected failure on the first attempt")
        return value

    df = _frame(spark)
    _write(df.select("key", flaky("value").alias("value")), bookies, "retried")
    assert os.path.exists(marker), "the first attempt did not fail"
    rows = _read(spark, bookies, "retried").collect()
    assert collections.Counter((r.key, r.value) for r in rows) == _expected()
    assert len(bookies.segments("retried")) == PARTS
    _no_leftovers(bookies, before, "retried")


def test_a_job_failing_midway_leaves_no_rows_and_no_ledgers(spark: Any, bookies: Any) -> None:
    bookies.create_log("failed")
    before = bookies.ledgers()

    @F.udf("string")
    def doomed(value):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 5 and value == "v70000":
            raise RuntimeError("injected failure on every attempt")
        return value

    with pytest.raises(Exception, match="injected failure on every attempt"):
        _write(_frame(spark).select("key", doomed("value").alias("value")), bookies, "failed")
    assert bookies.segments("failed") == []
    assert bookies.records("failed") == []
    bookies.wait_clean(before)  # no ledger, no task list, once the cancelled tasks ended


def test_a_live_writer_is_named_unless_fenced(spark: Any, bookies: Any) -> None:
    import asyncio

    import pybk

    bookies.create_log("shared")
    df = _frame(spark, 1000, 2)

    async def hold_writer() -> Any:
        client = pybk.Client(bookies.metadata)
        log = await client.namespace().open_log("shared")
        w = await log.writer(label="app-writer")
        await w.append(b"from the app")
        return client, w

    loop = asyncio.new_event_loop()
    try:
        client, w = loop.run_until_complete(hold_writer())
        before = bookies.ledgers()
        with pytest.raises(Exception, match=r"option 'fenceWriter'.*app-writer"):
            _write(df, bookies, "shared")
        assert bookies.ledgers() == before
        _write(df, bookies, "shared", fenceWriter="true")
        # the old writer is refused: by a fenced bookie, or (its loop stood still through the
        # Spark job, so its connections may be gone) by the ensemble change that finds the
        # ledger closed by the recovery (seen once on a loaded machine)
        with pytest.raises((pybk.LedgerFencedError, pybk.LedgerClosedError)):
            loop.run_until_complete(w.append(b"too late"))
        loop.run_until_complete(w.close())
        loop.run_until_complete(client.close())
    finally:
        loop.close()
    recs = bookies.records("shared")
    assert recs[0].data == b"from the app" and len(recs) == 1001


@pytest.mark.parametrize("case", ["no-value", "bad-type", "unknown-log", "unreachable-zk",
                                  "no-sqlite-file", "no-metadata", "overwrite", "memory"])
def test_bad_input_fails_on_the_driver_naming_the_option(spark: Any, bookies: Any,
                                                         case: str) -> None:
    bookies.create_log(f"bad-{case}")
    before = bookies.ledgers()
    df = _frame(spark, 1000, 2)
    writer = df.write.format("pybk").option("metadata", bookies.metadata) \
        .option("log", f"bad-{case}").mode("append")
    expect = {
        "no-value": r"column 'value' is required.*key binary",
        "bad-type": r"column 'value' must be binary or string, not bigint",
        "unknown-log": r"option 'log': log 'nowhere' does not exist.*createLog",
        "unreachable-zk": r"option 'metadata': cannot reach the metadata store "
                          r"zk://127.0.0.1:1/pybk within 2 s",
        "no-sqlite-file": r"option 'metadata': no SQLite metadata file",
        "no-metadata": r"option 'metadata': required",
        "overwrite": r"option 'mode': pybk logs are append-only",
        "memory": r"option 'metadata': 'memory://' lives in one process",
    }[case]
    if case == "no-value":
        writer = df.select("key").write.format("pybk").option("metadata", bookies.metadata) \
            .option("log", f"bad-{case}").mode("append")
    elif case == "bad-type":
        writer = spark.range(10).withColumnRenamed("id", "value").write.format("pybk") \
            .option("metadata", bookies.metadata).option("log", f"bad-{case}").mode("append")
    elif case == "unknown-log":
        writer = writer.option("log", "nowhere")
    elif case == "unreachable-zk":
        writer = writer.option("metadata", "zk://127.0.0.1:1/pybk") \
            .option("metadataTimeout", "2")
    elif case == "no-sqlite-file":
        writer = writer.option("metadata", f"sqlite://{bookies.root}/missing/meta.db")
    elif case == "no-metadata":
        writer = df.write.format("pybk").option("log", "x").mode("append")
    elif case == "overwrite":
        writer = writer.mode("overwrite")
    elif case == "memory":
        writer = writer.option("metadata", "memory://")
    with pytest.raises(Exception, match=expect):
        writer.save()
    assert bookies.ledgers() == before  # no task wrote anything
    assert bookies.segments(f"bad-{case}") == []


@pytest.mark.parametrize(("options", "expect"), [
    ({"startingPosition": "soon"}, r"option 'startingPosition'"),
    ({"endingPosition": "1:2"}, r"option 'endingPosition'"),
    ({"log": "nowhere"}, r"option 'log': log 'nowhere' does not exist"),
    ({"maxPartitionBytes": "0"}, r"option 'maxPartitionBytes': must be >= 1"),
    ({"maxRecordsPerTrigger": "5"}, r"option 'maxRecordsPerTrigger': applies to streaming"),
])
def test_bad_read_options_fail_naming_the_option(spark: Any, bookies: Any,
                                                 options: dict[str, str], expect: str) -> None:
    bookies.create_log("readable")
    name = options.pop("log", "readable")
    with pytest.raises(Exception, match=expect):
        _read(spark, bookies, name, **options).collect()


def test_workers_reuse_one_client_per_process(spark: Any, bookies: Any) -> None:
    uri = bookies.metadata

    def probe(_rows: Any) -> Any:
        import os as os_

        from pybk.spark import runtime

        yield (os_.getpid(), id(runtime.client(uri)))

    seen = spark.sparkContext.parallelize(range(16), 16).mapPartitions(probe).collect()
    seen += spark.sparkContext.parallelize(range(16), 16).mapPartitions(probe).collect()
    pids = {pid for pid, _ in seen}
    assert len(pids) < len(seen)  # workers were reused between tasks
    assert len(set(seen)) == len(pids)  # and each process made one client


def test_a_null_value_fails_the_job_and_leaves_nothing(spark: Any, bookies: Any) -> None:
    bookies.create_log("nulls")
    before = bookies.ledgers()
    df = spark.range(0, 30_000, numPartitions=3).select(
        F.when(F.col("id") == 25_000, F.lit(None))
        .otherwise(F.col("id").cast("string")).alias("value"))
    with pytest.raises(Exception, match=r"column 'value' is null in row \d+ of partition 2"):
        _write(df, bookies, "nulls")
    assert bookies.segments("nulls") == []
    bookies.wait_clean(before)
