"""The examples say what they do: the quickstart announces the cluster it runs, and
``wal_kv.py --help`` prints its usage instead of taking ``--help`` for a directory."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_the_quickstart_announces_the_bookies_it_runs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    announced = re.search(r"starting a cluster of (\d+) bookies", out)
    assert announced is not None, out
    listed = re.search(r"bookies: ([\w, -]+?) \(", out)
    assert listed is not None, out
    # every bookie the run names (in ensembles, crashes) is one of those announced
    named = set(re.findall(r"bookie-\d+", out))
    assert len(listed.group(1).split(", ")) == int(announced.group(1)) == len(named) == 4, out
    assert "all checks verified" in out


def test_wal_kv_help_prints_usage_and_makes_nothing(tmp_path: Path) -> None:
    for flag in ("--help", "-h"):
        r = subprocess.run([sys.executable, str(EXAMPLES / "wal_kv.py"), flag], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("usage: examples/wal_kv.py [-h] [DIR]"), r.stdout
    assert list(tmp_path.iterdir()) == []  # no directory named --help
    r = subprocess.run([sys.executable, str(EXAMPLES / "wal_kv.py"), "--bogus"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
    assert list(tmp_path.iterdir()) == []
