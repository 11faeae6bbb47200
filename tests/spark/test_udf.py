"""``pybk.spark.write_partitions``: a pandas UDF shapes the records, mapInArrow writes them,
one CAS publishes them; one row per ledger comes back. A task failing its first attempt
leaves each record once."""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import pandas as pd
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import BinaryType

import pybk.spark
from pybk.logs import Position


def _events(spark: Any, n: int, parts: int) -> Any:
    # defined here, not at module level: a test module cannot be imported by Spark's workers,
    # so the UDF travels by value
    @pandas_udf(BinaryType())
    def to_json(ids: pd.Series, users: pd.Series) -> pd.Series:
        return pd.Series([json.dumps({"id": int(i), "user": u}, separators=(",", ":")).encode()
                          for i, u in zip(ids, users, strict=True)])

    df = spark.range(0, n, numPartitions=parts).withColumn(
        "user", F.concat(F.lit("user-"), (F.col("id") % 50).cast("string")))
    return df.select(F.col("user").cast("binary").alias("key"),
                     to_json("id", "user").alias("value"))


def test_write_partitions_with_a_pandas_udf(spark: Any, bookies: Any) -> None:
    before = bookies.ledgers()
    out = pybk.spark.write_partitions(_events(spark, 30_000, 3), metadata=bookies.metadata,
                                      log="udf-events", create_log=True, compression="zstd",
                                      batch_bytes=64 << 10)
    assert out.columns == ["partition", "ledger_id", "segment", "records", "first_position",
                           "last_position"]
    rows = sorted(out.collect(), key=lambda r: r.segment)
    assert [r.partition for r in rows] == [0, 1, 2]
    assert sum(r.records for r in rows) == 30_000
    segs = {s.ledger_id: s for s in bookies.segments("udf-events")}
    for r in rows:
        seg = segs[r.ledger_id]
        assert (seg.seq, seg.records) == (r.segment, r.records)
        assert Position.parse(r.first_position) == Position(seg.seq, 0, 0)
        assert Position.parse(r.last_position) == seg.last_position
    recs = bookies.records("udf-events")
    docs = [json.loads(r.data) for r in recs]
    assert [d["id"] for d in docs] == list(range(30_000))  # partitions in order, rows in order
    assert all(r.key == d["user"].encode() for r, d in zip(recs, docs, strict=True))
    assert bookies.ledgers() - before == set(segs)
    assert bookies.keys("spark/tasks/") == []


def test_write_partitions_is_exactly_once_across_a_retried_task(spark: Any, bookies: Any,
                                                                tmp_path: Any) -> None:
    bookies.create_log("udf-retried")
    before = bookies.ledgers()
    marker = str(tmp_path / "failed-once")

    @F.udf("binary")
    def flaky(value):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        tc = TaskContext.get()
        if tc.partitionId() == 1 and tc.attemptNumber() == 0 and b'"id":15000,' in value:
            open(marker, "w").close()  # proof that the failure ran
            raise RuntimeError("injected failure on the first attempt")
        return value

    df = _events(spark, 20_000, 2)
    out = pybk.spark.write_partitions(df.select("key", flaky("value").alias("value")),
                                      metadata=bookies.metadata, log="udf-retried")
    assert os.path.exists(marker), "the first attempt did not fail"
    assert sum(r.records for r in out.collect()) == 20_000
    ids = collections.Counter(json.loads(r.data)["id"] for r in bookies.records("udf-retried"))
    assert ids == collections.Counter(range(20_000))
    segs = {s.ledger_id for s in bookies.segments("udf-retried")}
    assert bookies.ledgers() - before == segs
    assert bookies.keys("spark/tasks/") == []


def test_write_partitions_checks_its_arguments_first(spark: Any, bookies: Any) -> None:
    import pytest

    before = bookies.ledgers()
    with pytest.raises(ValueError, match="option 'log': log 'absent' does not exist"):
        pybk.spark.write_partitions(_events(spark, 10, 1), metadata=bookies.metadata,
                                    log="absent")
    with pytest.raises(ValueError, match="column 'value' is required"):
        pybk.spark.write_partitions(spark.range(3), metadata=bookies.metadata, log="absent",
                                    create_log=True)
    with pytest.raises(TypeError, match="unexpected arguments"):
        pybk.spark.write_partitions(_events(spark, 10, 1), metadata=bookies.metadata,
                                    log="absent", create_log=True, ensemble=3)
    assert bookies.ledgers() == before
