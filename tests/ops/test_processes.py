"""Real ``pybk bookie --autorecovery`` processes on SQLite metadata: a bookie SIGKILLed and
its directory deleted is re-replicated away (scenario in tests/ops_kit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ops_kit import lost_bookie_is_re_replicated

pytestmark = pytest.mark.integration


async def test_a_killed_and_wiped_bookie_is_re_replicated_on_sqlite(tmp_path: Path) -> None:
    await lost_bookie_is_re_replicated(tmp_path, f"sqlite://{tmp_path / 'metadata.db'}")
