"""``pybk bookie --storage db`` processes: a ledger written, a bookie killed and restarted
(its journal replayed into the db engine), everything read back."""

from __future__ import annotations

from pathlib import Path

import pytest

from pybk.server.cluster import ProcessCluster

PAYLOADS = [f"entry-{i}".encode() for i in range(30)]


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_bookie_processes_run_the_db_engine(tmp_path: Path) -> None:
    with ProcessCluster(tmp_path, bookies=3, extra_args=["--storage", "db"]) as cluster:
        client = cluster.client()
        lh = client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        lh.append_many(PAYLOADS)
        victim = cluster.bookie_ids[0]
        cluster.stop_bookie(victim)  # killed: what it acknowledged is in its journal
        cluster.start_bookie(victim)
        lh.close()
        rh = client.open_ledger(lh.id)
        assert [e.data for e in rh.read(0, rh.last_add_confirmed)] == PAYLOADS
        # every bookie runs the db engine (its checkpoint file, entry logs beside it)
        assert len(list(tmp_path.rglob("db-checkpoint"))) == 3
        assert len(list(tmp_path.rglob("entrylogs"))) == 3
