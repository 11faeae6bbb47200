"""``pybk log cursors / delete-cursor / retention / offload`` and the tier column of
``pybk log show``, against bookie processes on loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import pybk
from pybk.cli import main

from .proc_cluster import ProcCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_cursor_retention_and_offload_commands(tmp_path: Path) -> None:
    cluster = ProcCluster(tmp_path / "c", 3)
    asyncio.run(cluster.start())
    try:
        env = {"PYBK_METADATA": cluster.metadata}

        def pybk_log(*args: str) -> str:
            result = CliRunner().invoke(main, ["log", *args], env=env)
            assert result.exit_code == 0, result.output
            return result.stdout

        pybk_log("create", "orders", "--roll-entries", "1")
        for rec in ("a", "b", "c"):  # one segment each (each command closes its writer)
            pybk_log("append", "orders", rec)
        with pybk.sync.Client(cluster.metadata) as client:
            log = client.namespace().open_log("orders")
            with log.subscribe("billing") as cur:
                first = cur.receive(timeout=30)
                assert first is not None
                cur.ack(first.position)
        assert pybk_log("cursors", "orders").split() == ["billing", str(first.position)]
        seqs = [s["seq"] for s in json.loads(pybk_log("show", "orders", "--json"))["segments"]]
        assert len(seqs) == 3
        pybk_log("retention", "orders", "--after-consumed", "--apply")
        segs = json.loads(pybk_log("show", "orders", "--json"))["segments"]
        assert [s["seq"] for s in segs] == seqs[1:]  # the consumed one went
        tier = tmp_path / "tier"
        no_url = CliRunner().invoke(main, ["log", "offload", "orders", "--threshold-bytes",
                                           "10"], env=env)
        assert no_url.exit_code == 2 and "need --url" in no_url.output
        out = pybk_log("offload", "orders", "--url", f"file://{tier}", "--deletion-lag", "0",
                       "--threshold-bytes", "1000000", "--bytes-per-s", "5000000")
        assert out.split() == [str(x) for x in seqs[1:]]
        cfg = json.loads(pybk_log("show", "orders", "--json"))["config"]
        assert cfg["offload_threshold_bytes"] == 1000000
        assert cfg["offload_bytes_per_s"] == 5000000
        segs = json.loads(pybk_log("show", "orders", "--json"))["segments"]
        assert [s["tier"] for s in segs] == ["offloaded", "offloaded"]
        assert "tier" in pybk_log("show", "orders")  # (the table is cut at 80 columns here)
        out = pybk_log("read", "orders", "--format", "raw")
        assert out.split() == ["b", "c"]  # from the tier
        pybk_log("reset-cursor", "orders", "audit", str(first.position), "--create")
        assert pybk_log("cursors", "orders").split()[:2] == ["audit", "-"]  # none acked
        with pybk.sync.Client(cluster.metadata) as client:
            log = client.namespace().open_log("orders")
            assert log.cursor_resume_point("audit") == first.position
        bad = CliRunner().invoke(main, ["log", "reset-cursor", "orders", "audit", "1:x"],
                                 env=env)
        assert bad.exit_code == 2 and "not a position" in bad.output
        gone = CliRunner().invoke(main, ["log", "reset-cursor", "orders", "nobody", "1:0:0"],
                                  env=env)
        assert gone.exit_code == 1 and "CursorNotFoundError" in gone.stderr
        pybk_log("delete-cursor", "orders", "audit")
        pybk_log("delete-cursor", "orders", "billing")
        assert pybk_log("cursors", "orders").strip() == ""
        bad = CliRunner().invoke(main, ["log", "delete-cursor", "orders", "../x"], env=env)
        assert bad.exit_code == 2 and "bad cursor name" in bad.output
        gone = CliRunner().invoke(main, ["log", "delete-cursor", "orders", "billing"], env=env)
        assert gone.exit_code == 1 and "CursorNotFoundError" in gone.stderr
    finally:
        cluster.stop_all()
