"""Fixtures of the Spark tests: one SparkSession and one cluster of real bookie processes for
the whole session, and helpers that look at a log and at the ledgers a job left behind.

The session is ``local[2,3]``: two cores, and a failed task is retried up to 3 attempts (the
exactly-once tests need retries; plain ``local[2]`` never retries). The UI is off, the driver
JVM has the JIT flags of the research notes, and ``PYSPARK_PYTHON`` is this interpreter. These
tests never skip: ``make test`` installs Java and the ``[spark]`` extra, so a missing piece is
a failure. The bookies are ``pybk bookie`` processes started by ``pybk cluster up`` (TCP on
loopback, SQLite metadata under a temp dir) and stopped by ``pybk cluster down``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from spark_kit import Bookies, pybk_cli


@pytest.fixture(scope="session")
def bookies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bookies]:
    root = tmp_path_factory.mktemp("spark-bookies")
    metadata = pybk_cli("cluster", "up", "--root", str(root), "--bookies", "3")
    try:
        yield Bookies(root, metadata.splitlines()[-1])
    finally:
        pybk_cli("cluster", "down", "--root", str(root))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers run this venv's interpreter
    import pybk.spark

    session = pybk.spark.local_session("local[2,3]", "pybk-tests", log_level="OFF")
    try:
        yield session
    finally:
        session.stop()
