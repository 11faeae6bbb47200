"""The names API.md's Spark section promises (no Spark session needed)."""

from __future__ import annotations

import inspect

import pybk.spark
from pybk.spark.source import READ_DDL


def test_the_spark_names_and_shapes() -> None:
    assert {"PybkDataSource", "simulate", "write_partitions", "local_session",
            "sweep_jobs"} <= set(pybk.spark.__all__)
    assert pybk.spark.PybkDataSource.name() == "pybk"
    cols = [c.split()[0] for c in READ_DDL.split(",")]
    assert cols == ["key", "value", "log", "position", "segment", "entry", "slot"]
    sim = inspect.signature(pybk.spark.simulate).parameters
    assert list(sim)[:2] == ["spark", "seeds"] and {"faults", "duration"} <= set(sim)
    assert sim["faults"].default == "all" and sim["duration"].default == 30.0
    wp = inspect.signature(pybk.spark.write_partitions).parameters
    assert next(iter(wp)) == "df" and {"metadata", "log"} <= set(wp)
