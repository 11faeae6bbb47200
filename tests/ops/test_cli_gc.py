"""``pybk bookie gc`` (run every bookie's collector now, or one's; ``--status``) and ``pybk
bookie inspect``'s live and dead bytes per segment, against a LocalCluster on SQLite."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pybk
from pybk.bookie import BookieConfig
from pybk.cluster import LocalCluster

ROOT = str(Path(pybk.__file__).resolve().parent.parent)

CONFIG = BookieConfig(segment_size=8192, disk_check_interval=0, gc_interval=0,
                      gc_min_ledger_age=0, journal_sync_process=False)


def cli(*args: str) -> tuple[int, str]:
    """``pybk ARGS`` in a process of its own (as an operator runs it beside the bookies)."""
    proc = subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    return proc.returncode, proc.stdout + proc.stderr


async def test_bookie_gc_runs_the_collectors_and_reports(tmp_path: Path) -> None:
    m = f"sqlite:///{tmp_path}/metadata.db"
    async with LocalCluster(tmp_path, 3, metadata=m, bookie_config=CONFIG) as c:
        client = c.client()
        ids = []
        for n in range(3):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await lh.append_many([b"%d-%d" % (n, i) * 50 for i in range(40)])
            await lh.close()
            ids.append(lh.id)
        await client.delete_ledger(ids[0])
        await client.delete_ledger(ids[1])
        code, out = await asyncio.to_thread(cli, "bookie", "gc", "--metadata", m, "--json")
        assert code == 0, out
        rows = [json.loads(line) for line in out.splitlines()]
        assert [r["bookie"] for r in rows] == ["bookie-0", "bookie-1", "bookie-2"]
        for r in rows:
            assert sorted(r["ledgers_removed"]) == ids[:2] and r["bytes_reclaimed"] > 0
        code, out = await asyncio.to_thread(cli, "bookie", "gc", "--metadata", m,
                                            "--bookie", "bookie-1")
        assert code == 0 and out.startswith("bookie-1\tremoved 0 ledgers"), out
        code, out = await asyncio.to_thread(cli, "bookie", "gc", "--metadata", m, "--status")
        assert code == 0 and out.count("ledgers removed 2") == 3, out
        await c.stop_bookie("bookie-2")
        code, out = await asyncio.to_thread(cli, "bookie", "gc", "--metadata", m, "--bookie",
                                            "bookie-2", "--timeout", "5")
        assert code == 1 and "did not run" in out and "did not answer" in out, out
        code, out = await asyncio.to_thread(cli, "bookie", "inspect",
                                            str(c.bookie_dir("bookie-2")), "--json")
        assert code == 0, out
        segs = json.loads(out)["segments"]
        assert all(s["live_bytes"] + s["dead_bytes"] >= s["size"] for s in segs)
        assert sum(s["live_bytes"] for s in segs) >= 40 * 150  # the live ledger's entries
        code, out = await asyncio.to_thread(cli, "bookie", "inspect",
                                            str(c.bookie_dir("bookie-2")))
        assert code == 0 and "live" in out and "dead" in out and "compaction can give" in out
