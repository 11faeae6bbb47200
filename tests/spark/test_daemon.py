"""A job that reads only part of a Python worker's output (``df.show(3)`` over many rows)
ends without PySpark's daemon printing a worker's ``BrokenPipeError`` traceback on stderr:
``local_session`` runs :mod:`pybk.spark.daemon`. Run as a process of its own, so its
whole stderr (the daemon's included) is looked at after the session stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import pybk.spark

    spark = pybk.spark.local_session("local[2]", "pybk-daemon-test")
    try:
        assert spark.conf.get("spark.python.daemon.module") == "pybk.spark.daemon"
        df = spark.createDataFrame([(i, "x" * 2000) for i in range(20000)],
                                   "a BIGINT, b STRING")
        df.show(3)  # reads a few rows of a partition a Python worker is still writing
        print("rows", df.count())
    finally:
        spark.stop()
    print("stopped")
""")


def test_a_partly_read_worker_ends_without_a_traceback() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rows 20000" in out.stdout and out.stdout.rstrip().endswith("stopped"), out.stdout
    assert "BrokenPipeError" not in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
