"""Losing the auditor's own bookie, many times over, on SQLite metadata (LocalCluster).

The auditor dies with its bookie before the bookie leaves the registry; the new auditor's
first check may still see it. Its bookie watch must report the unregistration however the
poller's timing falls (the watch guarantee), so every trial heals within seconds, well
before the hourly periodic bookie check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ops_kit import LOST_AUDITOR_BOUND, lost_auditor_trial

TRIALS = 50


@pytest.mark.slow
async def test_losing_the_auditors_bookie_is_repaired_within_seconds_every_time(
    tmp_path: Path,
) -> None:
    took = [await lost_auditor_trial(tmp_path / f"t{n}") for n in range(TRIALS)]
    assert max(took) < LOST_AUDITOR_BOUND, took
    print(f"lost auditor on SQLite: {TRIALS} trials, slowest {max(took):.2f}s, "
          f"median {sorted(took)[len(took) // 2]:.2f}s")
