"""Bulk writes driven by a pandas UDF: JSON events built by a vectorized UDF, written with
``pybk.spark.write_partitions`` (mapInArrow into ledgers of each task's own, published in one
compare-and-set), then read back with the log's own reader.

    .venv/bin/python spark_examples/bulk_write_udf.py [--rows 200000] [--metadata URI]
"""

from __future__ import annotations

import asyncio
import json
import time

import pandas as pd
from _cluster import arguments, bookies, check, session
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import BinaryType

import pybk
import pybk.spark


@pandas_udf(BinaryType())
def to_json(ids: pd.Series, users: pd.Series, amounts: pd.Series) -> pd.Series:
    """One JSON document per row, built a column batch at a time."""
    return pd.Series([
        json.dumps({"id": int(i), "user": u, "amount": float(a)}, separators=(",", ":")).encode()
        for i, u, a in zip(ids, users, amounts, strict=True)
    ])


async def read_back(metadata: str, log_name: str) -> list[pybk.LogRecord]:
    async with pybk.Client(metadata) as client:
        log = await client.namespace().open_log(log_name)
        last = await log.last_position()
        out: list[pybk.LogRecord] = []
        async with log.reader(stop_at=last) as reader:
            while batch := await reader.read_batch(10_000):
                out.extend(batch)
        return out


def main() -> None:
    args = arguments(__doc__, rows=(int, 200_000, "events to write"),
                     partitions=(int, 4, "Spark partitions"))
    with bookies(args.metadata) as metadata:
        spark = session(args.master, "pybk bulk_write_udf")
        try:
            events = spark.range(0, args.rows, numPartitions=args.partitions).select(
                "id",
                F.concat(F.lit("user-"), (F.col("id") % 1000).cast("string")).alias("user"),
                (F.col("id") % 977 / 10).alias("amount"),
            )
            df = events.select(F.col("user").cast("binary").alias("key"),
                               to_json("id", "user", "amount").alias("value"))
            log_name = f"events-{int(time.time())}"
            t0 = time.perf_counter()
            written = pybk.spark.write_partitions(df, metadata=metadata, log=log_name,
                                                  create_log=True, compression="zstd")
            elapsed = time.perf_counter() - t0
            rows = written.collect()
            written.show(truncate=False)
            print(f"wrote {args.rows} events in {elapsed:.1f} s "
                  f"({args.rows / elapsed:,.0f} rows/s, pandas UDF included)")
        finally:
            spark.stop()
        check(sum(r.records for r in rows) == args.rows,
              f"the ledgers written hold {args.rows} records")
        check(sorted(r.partition for r in rows) == list(range(args.partitions)),
              "one ledger per partition")
        records = asyncio.run(read_back(metadata, log_name))
        ids = [json.loads(r.data)["id"] for r in records]
        check(sorted(ids) == list(range(args.rows)), "the log holds every event exactly once")
        check(all(r.key == json.loads(r.data)["user"].encode() for r in records),
              "each record kept its key")
        check([r.position for r in records] == sorted(r.position for r in records),
              "positions increase along the log")


if __name__ == "__main__":
    main()
