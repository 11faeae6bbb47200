"""Batch write and read through the ``pybk`` data source: a keyed DataFrame written with
``df.write.format("pybk")`` (exactly once per task), read back in parallel (one partition per
segment, big segments split), aggregated by key, and a slice read by positions.

    .venv/bin/python spark_examples/read_log.py [--rows 100000] [--metadata URI]
"""

from __future__ import annotations

import collections
import time

from _cluster import arguments, bookies, check, session
from pyspark.sql import functions as F


def main() -> None:
    args = arguments(__doc__, rows=(int, 100_000, "rows to write"),
                     partitions=(int, 8, "Spark partitions (one segment each)"))
    with bookies(args.metadata) as metadata:
        spark = session(args.master, "pybk read_log")
        try:
            log = f"orders-{int(time.time())}"
            orders = spark.range(0, args.rows, numPartitions=args.partitions).select(
                F.concat(F.lit("customer-"), (F.col("id") % 100).cast("string")).alias("key"),
                F.to_json(F.struct("id", (F.col("id") % 50).alias("qty"))).alias("value"))
            t0 = time.perf_counter()
            (orders.write.format("pybk").option("metadata", metadata).option("log", log)
             .option("createLog", "true").option("batchBytes", str(16 << 10))  # 16 KiB entries
             .mode("append").save())
            print(f"wrote {args.rows} rows in {time.perf_counter() - t0:.1f} s")

            reader = (spark.read.format("pybk").option("metadata", metadata)
                      .option("log", log))
            df = reader.load()
            print(f"read plan: {df.rdd.getNumPartitions()} partitions")
            df.select(F.col("key").cast("string"), F.col("value").cast("string"), "position",
                      "segment", "entry", "slot").show(5, False)
            per_key = {r.key: r["count"] for r in df.groupBy(
                F.col("key").cast("string").alias("key")).count().collect()}
            check(len(per_key) == 100 and sum(per_key.values()) == args.rows,
                  f"{args.rows} rows came back, {args.rows // 100} for each of 100 keys")
            check(collections.Counter(per_key.values()) == {args.rows // 100: 100},
                  "no row lost or repeated")
            ordered = df.select("segment", "entry", "slot").collect()
            check(len({tuple(r) for r in ordered}) == args.rows, "every position is unique")

            split = reader.option("maxPartitionBytes", str(64 << 10)).load()
            check(split.rdd.getNumPartitions() > df.rdd.getNumPartitions()
                  and split.count() == args.rows,
                  f"big segments split into {split.rdd.getNumPartitions()} entry ranges, "
                  "same rows")
            first = df.orderBy("segment", "entry", "slot").limit(1).collect()[0]
            second_segment = sorted({r.segment for r in ordered})[1]
            piece = (reader.option("startingPosition", first.position)
                     .option("endingPosition", f"{second_segment}:0:0").load())
            check(piece.count() == args.rows // args.partitions,
                  f"[{first.position}, {second_segment}:0:0) is exactly the first segment")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
