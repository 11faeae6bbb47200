"""``pybk cluster up`` takes a lock on its root (issue 34, item 11): two started at once
both used to pass the "nothing runs here" check, and one left bookies that `pybk cluster
down` did not know of. Now one starts and the other is refused, and `down` stops them all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _bookie_pids(root: Path) -> list[int]:
    """Live processes whose command line names ``root`` (its bookies)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"bookie" in cmd and any(str(root).encode() in a for a in cmd):
            found.append(int(entry))
    return found


def test_two_cluster_ups_at_once_start_one_cluster(tmp_path: Path) -> None:
    root = tmp_path / "c"
    args = [sys.executable, "-m", "pybk", "cluster", "up", "--root", str(root), "--bookies",
            "2"]
    env = {**os.environ}
    ups = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env) for _ in range(2)]
    try:
        results = [p.communicate(timeout=120) for p in ups]
        codes = sorted(p.returncode for p in ups)
        assert codes == [0, 1], results
        refused = results[[p.returncode for p in ups].index(1)][1]
        assert "another cluster is starting" in refused or "already running" in refused
        assert len(_bookie_pids(root)) == 2
    finally:
        down = subprocess.run([sys.executable, "-m", "pybk", "cluster", "down", "--root",
                               str(root)], capture_output=True, text=True, timeout=120, env=env)
    assert down.returncode == 0, down.stderr
    assert _bookie_pids(root) == []


def test_an_up_during_another_ups_start_is_refused_and_spawns_nothing(tmp_path: Path) -> None:
    """The race made deterministic: while one ``up`` holds the root (between its check and
    its state file), another is refused before it starts any bookie."""
    from pybk.runtime.dirlock import DirectoryLock

    root = tmp_path / "c"
    root.mkdir()
    lock = DirectoryLock(root, "cluster root")
    lock.acquire()  # an `up` in its window
    try:
        up = subprocess.run([sys.executable, "-m", "pybk", "cluster", "up", "--root", str(root),
                             "--bookies", "1", "--ready-timeout", "20"],
                            capture_output=True, text=True, timeout=120)
        assert up.returncode == 1 and "another cluster is starting" in up.stderr, up.stderr
        assert _bookie_pids(root) == []
    finally:
        lock.release()
        subprocess.run([sys.executable, "-m", "pybk", "cluster", "down", "--root", str(root)],
                       capture_output=True, timeout=120)
