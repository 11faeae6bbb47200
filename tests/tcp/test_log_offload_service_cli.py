"""``pybk log offload-service --once`` against bookie processes on loopback: a log nobody
writes to, offloaded by the service as its trigger says, its bookie copies deleted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import pybk
from pybk.cli import main
from pybk.logs import OFFLOADED

from .proc_cluster import ProcCluster

pytest.importorskip("fsspec")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_the_command_runs_a_round_against_bookie_processes(tmp_path: Path) -> None:
    cluster = ProcCluster(tmp_path / "c", 3)
    asyncio.run(cluster.start())
    try:
        with pybk.sync.Client(cluster.metadata) as client:
            log = client.namespace().create_log("orders", roll_entries=1)
            with log.writer() as w:
                w.append_many([b"a", b"b"])  # (one segment each once rolled)
            log.set_offload(f"file://{tmp_path}/tier", threshold_bytes=1, deletion_lag=0)
        result = CliRunner().invoke(main, ["log", "offload-service", "--once"],
                                    env={"PYBK_METADATA": cluster.metadata})
        assert result.exit_code == 0, result.output
        progress = json.loads(result.stdout)
        assert progress["default/orders"]["offloaded_segments"] >= 1
        assert progress["default/orders"]["bookies_only"] == 0
        with pybk.sync.Client(cluster.metadata) as client:
            segs = client.namespace().open_log("orders").segments()
            assert {s.tier for s in segs if s.last_entry >= 0} == {OFFLOADED}
    finally:
        cluster.stop_all()
