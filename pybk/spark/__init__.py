"""pybk for PySpark 4 (``pip install pybk[spark]``): the ``pybk`` data source (batch write
exactly once per task, batch read, Structured Streaming source and sink), bulk writes from a
DataFrame pipeline, and simulations fanned out over executors. See docs/spark.md.

::

    import pybk.spark
    spark.dataSource.register(pybk.spark.PybkDataSource)          # format "pybk"
    df.write.format("pybk").option("metadata", uri).option("log", "events").mode("append").save()
    spark.read.format("pybk").option("metadata", uri).option("log", "events").load()
    pybk.spark.write_partitions(df, metadata=uri, log="events")    # one row per ledger
    pybk.spark.simulate(spark, seeds=range(1000), faults="all")   # one row per seed
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pybk.spark.jobs import JobClosedError
    from pybk.spark.maintenance import sweep_jobs
    from pybk.spark.options import OptionError
    from pybk.spark.session import local_session
    from pybk.spark.simulate import simulate
    from pybk.spark.source import PybkDataSource
    from pybk.spark.udf import write_partitions

__all__ = [
    "JobClosedError",
    "OptionError",
    "PybkDataSource",
    "local_session",
    "simulate",
    "sweep_jobs",
    "write_partitions",
]

#: where each public name lives: imported when first used, so that importing the package
#: (as ``python -m pybk.spark.daemon`` does before it forks workers) starts no thread
_HOMES = {
    "JobClosedError": "pybk.spark.jobs",
    "OptionError": "pybk.spark.options",
    "PybkDataSource": "pybk.spark.source",
    "local_session": "pybk.spark.session",
    "simulate": "pybk.spark.simulate",
    "sweep_jobs": "pybk.spark.maintenance",
    "write_partitions": "pybk.spark.udf",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pybk.spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
