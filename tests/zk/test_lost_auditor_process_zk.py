"""The auditor's bookie process killed by SIGKILL, again and again, on a real ZooKeeper."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from ops_kit import killed_auditor_trials

from pybk.testing.zookeeper import ZooKeeperServer

TRIALS = 50


@pytest.mark.integration
@pytest.mark.slow
async def test_killing_the_auditors_bookie_process_is_repaired_every_time(
    tmp_path: Path, zk_server: ZooKeeperServer,
) -> None:
    uri = zk_server.uri(f"/killed-auditor-{uuid.uuid4().hex[:8]}")
    took = await killed_auditor_trials(tmp_path, uri, TRIALS)
    assert len(took) == TRIALS
    print(f"killed auditor on ZooKeeper: {TRIALS} trials, slowest {max(took):.2f}s, "
          f"median {sorted(took)[len(took) // 2]:.2f}s")
