"""The auditor's bookie process killed by SIGKILL, again and again, on SQLite metadata:
``pybk bookie --autorecovery`` processes with the default hourly bookie check, so every
repair within seconds is the watches' doing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ops_kit import killed_auditor_trials

#: each trial kills a process and waits out a session: 15 in the suite (about 3 s each);
#: PYBK_LOST_AUDITOR_TRIALS=50 for the longer run the watches were first proved with
TRIALS = int(os.environ.get("PYBK_LOST_AUDITOR_TRIALS", "15"))


@pytest.mark.integration
@pytest.mark.slow
async def test_killing_the_auditors_bookie_process_is_repaired_every_time(
    tmp_path: Path,
) -> None:
    took = await killed_auditor_trials(tmp_path, f"sqlite:///{tmp_path}/metadata.db", TRIALS)
    assert len(took) == TRIALS
    print(f"killed auditor on SQLite: {TRIALS} trials, slowest {max(took):.2f}s, "
          f"median {sorted(took)[len(took) // 2]:.2f}s")
