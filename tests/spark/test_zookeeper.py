"""The ``pybk`` data source with ZooKeeper metadata: a real ZooKeeper, three ``pybk bookie``
processes registered in it, a keyed write and a read through Spark, and the log read back
with the log layer. (An unreachable ZooKeeper is in test_batch's bad input.)"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F
from spark_kit import Bookies

from pybk.cli import spawn_bookie, stop_pid, wait_ready
from pybk.testing.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def zk_bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bookies]:
    root = tmp_path_factory.mktemp("spark-zk")
    with ZooKeeperServer() as server:
        metadata = f"zk://{server.hosts}/pybk-spark-{uuid.uuid4().hex[:8]}"
        procs = {b: spawn_bookie(root, b, metadata) for b in ("zk-1", "zk-2", "zk-3")}
        try:
            for b, proc in procs.items():
                wait_ready(root, b, proc, 60)
            yield Bookies(Path(root), metadata)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    stop_pid(proc.pid, 10)
                    proc.wait(10)


def test_write_and_read_with_zookeeper_metadata(spark: Any, zk_bookies: Bookies) -> None:
    df = spark.range(0, 6000, numPartitions=3).select(
        F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("value"))
    (df.write.format("pybk").option("metadata", zk_bookies.metadata).option("log", "zk-log")
     .option("createLog", "true").mode("append").save())
    rows = (spark.read.format("pybk").option("metadata", zk_bookies.metadata)
            .option("log", "zk-log").load().collect())
    want = collections.Counter((b"k%d" % (i % 7), b"v%d" % i) for i in range(6000))
    assert collections.Counter((r.key, r.value) for r in rows) == want
    recs = zk_bookies.records("zk-log")
    assert collections.Counter((r.key, r.data) for r in recs) == want
    assert len(zk_bookies.segments("zk-log")) == 3
    assert zk_bookies.ledgers() == {s.ledger_id for s in zk_bookies.segments("zk-log")}
    assert zk_bookies.keys("spark/tasks/") == []
