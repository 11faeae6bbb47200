"""A local SparkSession set up for pybk: what the examples, the tests, the benchmark and
``pybk simulate --spark`` start.

What it sets, and why (docs/spark.md): ``PYSPARK_PYTHON`` to this interpreter (otherwise
Spark's Python workers start whatever ``python3`` is on PATH, without pybk or pyarrow);
``SPARK_LOCAL_IP`` and the driver's host to loopback; the UI off; the driver JVM's JIT flags
that cut its start-up by a third (``-XX:+UseSerialGC -XX:TieredStopAtLevel=1``); shuffle
partitions and parallelism to the cores asked for; PySpark's worker daemon made quiet about
workers whose output Spark stopped reading (``df.show(5)``, the session stopped:
:mod:`pybk.spark.daemon`); and the ``pybk`` data source registered.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["JVM_FLAGS", "local_session"]

JVM_FLAGS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData"


def _cores(master: str) -> int:
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master.strip())
    if m is None:
        return 2
    return os.cpu_count() or 2 if m.group(1) == "*" else int(m.group(1))


def local_session(
    master: str = "local[2]",
    app_name: str = "pybk",
    conf: Mapping[str, str] | None = None,
    *,
    log_level: str = "ERROR",
) -> Any:
    """A SparkSession on ``master`` (``local[N]``, or ``local[N,F]`` to retry a failed task
    up to F times) with the ``pybk`` data source registered. With another master (a real
    cluster) only the data source, the UI and the hash seed are set: executors need pybk
    installed (``pip install pybk[spark]`` in their environment)."""
    local = master.strip().startswith("local")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pybk.spark.source import PybkDataSource

    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYTHONHASHSEED", "0")
    )
    if local:
        cores = str(_cores(master))
        builder = (
            builder.config("spark.sql.shuffle.partitions", cores)
            .config("spark.default.parallelism", cores)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", JVM_FLAGS)
            .config("spark.python.daemon.module", "pybk.spark.daemon")
        )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    spark.dataSource.register(PybkDataSource)
    return spark
