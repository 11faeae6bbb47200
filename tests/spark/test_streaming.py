"""Structured Streaming through the ``pybk`` source and sink, on real Spark and bookies: a
query stopped and restarted from its checkpoint while a writer appends copies every record
exactly once; availableNow with maxRecordsPerTrigger; a replayed micro-batch is not published
twice; a checkpoint made for another log is refused."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import pybk


def _source(spark: Any, bookies: Any, log: str, **options: str) -> Any:
    r = spark.readStream.format("pybk").option("metadata", bookies.metadata).option("log", log)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def _sink(df: Any, bookies: Any, log: str, checkpoint: Path) -> Any:
    return (df.select("key", "value").writeStream.format("pybk")
            .option("metadata", bookies.metadata).option("log", log)
            .option("checkpointLocation", str(checkpoint)))


def _published(bookies: Any, log: str) -> int:
    return sum(s.records for s in bookies.segments(log))


def _until(cond: Any, timeout: float, what: str, query: Any = None) -> None:
    """Wait (bounded) for ``cond()``; a failed query's error is raised at once."""
    deadline = time.monotonic() + timeout
    while not cond():
        if query is not None and query.exception() is not None:
            raise query.exception()
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        threading.Event().wait(0.05)  # between two looks at the condition


class Appender(threading.Thread):
    """Appends records ``e<i>`` to a log with the log's own writer, 100 per append_many,
    staying at most ``allowance`` records ahead of what the sink published (so it keeps
    appending for as long as the queries run, and no longer)."""

    def __init__(self, bookies: Any, log: str, sink_log: str) -> None:
        super().__init__(name="appender", daemon=True)
        self.bookies, self.log, self.sink_log = bookies, log, sink_log
        self.allowance = 1500
        self.appended = 0
        self.stop_now = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:
            self.error = exc

    async def _run(self) -> None:
        async with pybk.Client(self.bookies.metadata) as client:
            log = await client.namespace().open_log(self.log)
            async with await log.writer(label="appender") as w:
                deadline = time.monotonic() + 120
                seen = -1
                while not self.stop_now.is_set():
                    done = await asyncio.to_thread(_published, self.bookies, self.sink_log)
                    if done != seen:  # progress: the bound counts from the last of it
                        seen, deadline = done, time.monotonic() + 120
                    if self.appended - done >= self.allowance:
                        if time.monotonic() > deadline:
                            raise AssertionError("the sink made no progress for 120 s")
                        await asyncio.sleep(0.05)  # back-pressure: between two looks
                        continue
                    await w.append_many([b"e%d" % (self.appended + i) for i in range(100)])
                    self.appended += 100


def test_a_query_restarted_from_its_checkpoint_while_a_writer_appends(
        spark: Any, bookies: Any, tmp_path: Path) -> None:
    bookies.create_log("events")
    bookies.create_log("copied")
    before = bookies.ledgers()
    checkpoint = tmp_path / "checkpoint"
    appender = Appender(bookies, "events", "copied")
    appender.start()
    try:
        q1 = _sink(_source(spark, bookies, "events", maxRecordsPerTrigger="700"), bookies,
                   "copied", checkpoint).start()
        _until(lambda: _published(bookies, "copied") >= 2500, 120, "the first query copies",
               q1)
        q1.stop()
        stopped_at = _published(bookies, "copied")
        appended_before = appender.appended
        appender.allowance += 1500  # the writer goes on while no query runs
        _until(lambda: appender.appended >= appended_before + 1000, 60, "appends go on")
        q2 = _sink(_source(spark, bookies, "events", maxRecordsPerTrigger="700"), bookies,
                   "copied", checkpoint).start()
        _until(lambda: _published(bookies, "copied") >= stopped_at + 3000, 120,
               "the restarted query copies", q2)
        appender.stop_now.set()
        appender.join(60)
        assert appender.error is None, appender.error
        q2.processAllAvailable()
        q2.stop()
    finally:
        appender.stop_now.set()
        appender.join(60)
        for q in spark.streams.active:
            q.stop()
    events = bookies.records("events")
    copied = bookies.records("copied")
    assert len(events) == appender.appended > 5000
    counts = collections.Counter(r.data for r in copied)
    assert counts == collections.Counter(r.data for r in events)  # each record exactly once
    # the sink published every micro-batch it committed, in order, each once
    assert [r.data for r in copied] == [r.data for r in events]  # one partition per segment
    # and the batch the first query was stopped in left nothing: its replay swept it
    bookies.wait_clean(before, logs=("events", "copied"))


def test_available_now_with_max_records_and_a_replayed_batch(spark: Any, bookies: Any,
                                                             tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    bookies.create_log("keyed")
    bookies.create_log("keyed-copy")
    df = spark.range(0, 2500, numPartitions=1).select(
        F.concat(F.lit("k"), (F.col("id") % 13).cast("string")).cast("binary").alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"))
    df.write.format("pybk").option("metadata", bookies.metadata).option("log", "keyed") \
        .mode("append").save()
    checkpoint = tmp_path / "ck"

    def run_once() -> None:
        q = _sink(_source(spark, bookies, "keyed", maxRecordsPerTrigger="1000"), bookies,
                  "keyed-copy", checkpoint).trigger(availableNow=True).start()
        q.awaitTermination(180)
        assert not q.isActive and q.exception() is None

    run_once()
    copied = bookies.records("keyed-copy")
    assert [(r.key, r.data) for r in copied] == [(r.key, r.data)
                                                  for r in bookies.records("keyed")]
    assert len(bookies.segments("keyed-copy")) == 3  # 1000 + 1000 + 500: three batches

    # Spark replays a batch whose commit it did not record: the sink publishes it once
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    os.remove(checkpoint / "commits" / str(last))
    crc = checkpoint / "commits" / f".{last}.crc"
    if crc.exists():
        os.remove(crc)
    run_once()
    assert len(bookies.records("keyed-copy")) == 2500
    assert len(bookies.segments("keyed-copy")) == 3
    sink = hashlib.sha256(str(checkpoint).encode()).hexdigest()[:20]
    runs = [k for k in bookies.keys("spark/jobs/") if f"/{sink}.b{last}/" in k]
    assert len(runs) == 2, runs  # batch `last` ran twice, and was published once

    df2 = spark.range(2500, 3200, numPartitions=1).select(
        F.lit(None).cast("binary").alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"))
    df2.write.format("pybk").option("metadata", bookies.metadata).option("log", "keyed") \
        .mode("append").save()
    run_once()
    copied = bookies.records("keyed-copy")
    assert [r.data for r in copied] == [b"v%d" % i for i in range(3200)]
    assert all(r.key is None for r in copied[2500:])
    assert bookies.keys("spark/tasks/") == []


def test_a_checkpoint_of_another_log_is_refused(spark: Any, bookies: Any,
                                                tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    bookies.create_log("first")
    bookies.create_log("second")
    bookies.create_log("sink-of-both")
    spark.range(10).select(F.col("id").cast("string").alias("value")).write.format("pybk") \
        .option("metadata", bookies.metadata).option("log", "first").mode("append").save()
    checkpoint = tmp_path / "ck"
    q = _sink(_source(spark, bookies, "first"), bookies, "sink-of-both", checkpoint) \
        .trigger(availableNow=True).start()
    q.awaitTermination(120)
    q = _sink(_source(spark, bookies, "second"), bookies, "sink-of-both", checkpoint) \
        .trigger(availableNow=True).start()
    with pytest.raises(Exception, match=r"option 'log': the query's checkpoint was made "
                                        r"reading 'logs/default/first'"):
        q.awaitTermination(120)


def test_a_query_with_a_cursor_records_its_progress_and_a_new_query_resumes_there(
        spark: Any, bookies: Any, tmp_path: Path) -> None:
    """option cursor: each committed batch resets the log's durable cursor to its end
    (retention by consumption sees the query), and a query with a new checkpoint starts
    where the cursor is, not at startingPosition."""
    from pyspark.sql import functions as F

    bookies.create_log("cur-src")
    bookies.create_log("cur-sink")

    def append(first: int, last: int) -> None:
        spark.range(first, last, numPartitions=1).select(
            F.concat(F.lit("v"), F.col("id").cast("string")).alias("value")).write \
            .format("pybk").option("metadata", bookies.metadata).option("log", "cur-src") \
            .mode("append").save()

    def run(checkpoint: Path) -> None:
        q = _sink(_source(spark, bookies, "cur-src", cursor="spark-q",
                          maxRecordsPerTrigger="100"), bookies, "cur-sink", checkpoint) \
            .trigger(availableNow=True).start()
        q.awaitTermination(180)
        assert not q.isActive and q.exception() is None

    def resume_point() -> Any:
        async def go(client: pybk.Client) -> Any:
            log = await client.namespace().open_log("cur-src")
            return await log.cursor_resume_point("spark-q")

        return bookies.run(bookies._with_client(go))

    append(0, 250)
    run(tmp_path / "ck1")
    src = bookies.records("cur-src")
    assert resume_point() == src[-1].position.next_slot()
    append(250, 300)
    run(tmp_path / "ck2")  # a new checkpoint: the cursor, not "earliest", says where
    copied = bookies.records("cur-sink")
    assert [r.data for r in copied] == [b"v%d" % i for i in range(300)]
    assert resume_point() == bookies.records("cur-src")[-1].position.next_slot()
    bad = _source(spark, bookies, "cur-src", cursor="../x")
    with pytest.raises(Exception, match="option 'cursor'"):
        bad.writeStream.format("console").start().awaitTermination(60)
