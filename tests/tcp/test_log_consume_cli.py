"""``pybk log consume``: a log read through a durable cursor from the command line, against
bookie processes on loopback: each run goes on where the last stopped, --count, --start
latest, --follow to the end of stream, and a bounded wait that gives up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

from pybk.cli import main

from .proc_cluster import ProcCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_consuming_through_a_cursor_goes_on_where_the_last_run_stopped(tmp_path: Path) -> None:
    cluster = ProcCluster(tmp_path / "c", 3)
    asyncio.run(cluster.start())
    try:
        env = {"PYBK_METADATA": cluster.metadata}

        def pybk_log(*args: str, code: int = 0):  # type: ignore[no-untyped-def]
            result = CliRunner().invoke(main, ["log", *args], env=env)
            assert result.exit_code == code, result.output
            return result

        pybk_log("create", "orders")
        pybk_log("append", "orders", *[f"r{i}" for i in range(5)])
        got = pybk_log("consume", "orders", "billing", "--count", "2", "--format", "raw")
        assert got.stdout.split() == ["r0", "r1"]
        assert "consumed 2 records" in got.stderr
        got = pybk_log("consume", "orders", "billing", "--format", "raw")
        assert got.stdout.split() == ["r2", "r3", "r4"]  # the rest, then it stops
        got = pybk_log("consume", "orders", "billing")
        assert got.stdout == "" and "consumed 0 records" in got.stderr
        last = pybk_log("cursors", "orders").stdout.split()
        assert last[0] == "billing" and last[1].count(":") == 2
        late = pybk_log("consume", "orders", "late", "--start", "latest")
        assert late.stdout == ""  # a new cursor at the end has nothing to print
        pybk_log("append", "orders", "r5", "r6", "--end-of-stream")
        got = pybk_log("consume", "orders", "billing", "--follow", "--format", "raw")
        assert got.stdout.split() == ["r5", "r6"]  # followed to the end of stream
        got = pybk_log("consume", "orders", "late", "--format", "json")
        assert got.stdout.count("\n") == 2 and '"position"' in got.stdout

        pybk_log("create", "idle")
        pybk_log("append", "idle", "x")
        pybk_log("consume", "idle", "c")
        waited = pybk_log("consume", "idle", "c", "--follow", "--timeout", "0.5", code=1)
        assert "no new record for cursor 'c'" in waited.stderr
        bad = pybk_log("consume", "idle", "../c", code=2)
        assert "bad cursor name" in bad.output
    finally:
        cluster.stop_all()
