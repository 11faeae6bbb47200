"""Real ``pybk bookie --autorecovery`` processes on ZooKeeper metadata: a bookie SIGKILLed
and its directory deleted is re-replicated away (scenario in tests/ops_kit.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from ops_kit import lost_bookie_is_re_replicated

from pybk.testing.zookeeper import ZooKeeperServer

pytestmark = pytest.mark.integration


async def test_a_killed_and_wiped_bookie_is_re_replicated_on_zookeeper(
        tmp_path: Path, zk_server: ZooKeeperServer) -> None:
    await lost_bookie_is_re_replicated(tmp_path, zk_server.uri(f"/ar-{uuid.uuid4().hex[:8]}"))
