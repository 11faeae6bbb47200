"""Losing the auditor's own bookie, many times over, on a real ZooKeeper (LocalCluster)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from ops_kit import LOST_AUDITOR_BOUND, lost_auditor_trial

from pybk.testing.zookeeper import ZooKeeperServer

#: 20 in the suite; PYBK_LOST_AUDITOR_TRIALS=50 for the longer run
TRIALS = int(os.environ.get("PYBK_LOST_AUDITOR_TRIALS", "20"))


@pytest.mark.integration
@pytest.mark.slow
async def test_losing_the_auditors_bookie_is_repaired_within_seconds_every_time(
    tmp_path: Path, zk_server: ZooKeeperServer,
) -> None:
    took = [await lost_auditor_trial(tmp_path / f"t{n}",
                                     zk_server.uri(f"/lost-auditor-{uuid.uuid4().hex[:8]}"))
            for n in range(TRIALS)]
    assert max(took) < LOST_AUDITOR_BOUND, took
    print(f"lost auditor on ZooKeeper: {TRIALS} trials, slowest {max(took):.2f}s, "
          f"median {sorted(took)[len(took) // 2]:.2f}s")
