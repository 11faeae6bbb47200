"""pybk.WAL(path, replica_dirs=[...]): each in-process bookie's data in a directory of the
caller's choice; appends, reopening, replay from the same directories, the locks that guard
them, and every kind of bad layout refused."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pybk
from pybk import LockedError

pytestmark = pytest.mark.timeout(120)


def _dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / f"disk{i}" / "replica" for i in range(3)]


def test_replicas_live_where_asked_and_replay_after_reopen(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    with pybk.WAL(tmp_path / "wal", replica_dirs=dirs) as wal:
        ps = [wal.append(b"rec-%d" % i) for i in range(20)]
    assert not (tmp_path / "wal" / "bookies").exists()
    for d in dirs:  # each replica wrote its own journal there
        assert d.is_dir() and any(p.is_file() and p.stat().st_size for p in d.rglob("*")
                                  if p.name != "LOCK")
    with pybk.WAL(tmp_path / "wal", replica_dirs=dirs) as wal:
        assert [p for p, _ in wal.replay()] == ps
        ps.append(wal.append(b"more"))
    # the layout is recorded: reopening without replica_dirs finds the same replicas
    with pybk.WAL(tmp_path / "wal") as wal:
        assert wal._wal.replica_dirs == dirs
        assert [d for _, d in wal.replay()] == [b"rec-%d" % i for i in range(20)] + [b"more"]


async def test_async_wal_with_replica_dirs(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    async with pybk.AsyncWAL(tmp_path / "wal", replica_dirs=dirs, bookies=2,
                             ensemble_size=2, write_quorum=2, ack_quorum=2) as wal:
        pos = await wal.append(b"x")
        assert wal.cluster is not None
        assert [wal.cluster.bookie_dir(b) for b in wal.cluster.bookie_ids] == dirs
    async with pybk.AsyncWAL(tmp_path / "wal", replica_dirs=dirs, bookies=2,
                             ensemble_size=2, write_quorum=2, ack_quorum=2) as wal:
        assert [(p, d) async for p, d in wal.replay()] == [(pos, b"x")]


def test_a_replica_dir_in_use_by_another_process_is_refused(tmp_path: Path) -> None:
    dirs = _dirs(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, pybk
            with pybk.WAL(sys.argv[1], replica_dirs=sys.argv[2:]) as wal:
                wal.append(b"mine")
                print("ready", flush=True)
                sys.stdin.readline()
        """), str(tmp_path / "first"), *map(str, dirs)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        # another WAL (its own directory) on one of the same replica directories
        with pytest.raises(LockedError, match=f"replica directory .* process {holder.pid}"):
            pybk.WAL(tmp_path / "second",
                     replica_dirs=[dirs[1], tmp_path / "x", tmp_path / "y"])
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert holder.wait(60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
    with pybk.WAL(tmp_path / "first", replica_dirs=dirs) as wal:
        assert [d for _, d in wal.replay()] == [b"mine"]


def test_bad_replica_dirs_are_refused(tmp_path: Path) -> None:
    wal_dir = tmp_path / "wal"
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    (tmp_path / "file").write_text("x")
    cases: list[tuple[object, str]] = [
        ([a, b], "2 directories for 3 bookies"),
        ([a, b, c, tmp_path / "d"], "4 directories for 3 bookies"),
        (str(a), "a list of directories"),
        ([a, a, b], "given twice"),
        ([a, a / "inner", b], "nested"),
        ([a / "inner", a, b], "nested"),
        ([a, b, tmp_path / "file"], "not a directory"),
        ([a, b, wal_dir], "holds the WAL directory"),
        ([a, b, tmp_path], "holds the WAL directory"),
        ([a, b, wal_dir / "bookies" / "x"], "inside"),
    ]
    for dirs, match in cases:
        with pytest.raises(ValueError, match=match):
            pybk.WAL(wal_dir, replica_dirs=dirs)  # type: ignore[arg-type]
    assert not a.exists() and not wal_dir.exists()  # refused before anything was made
    with pytest.raises(TypeError, match="replica_dirs"):
        pybk.WAL(metadata="memory://", replica_dirs=[a, b, c])
    with pytest.raises(ValueError, match="cannot create replica directory"):
        pybk.WAL(wal_dir, replica_dirs=[a, b, tmp_path / "file" / "under"])
    assert not (wal_dir / "REPLICAS").exists()
    with pybk.WAL(wal_dir, replica_dirs=[a, b, c]) as wal:  # the lock was released
        wal.append(b"x")
    with pytest.raises(ValueError, match="keeps its replicas in"):
        pybk.WAL(wal_dir, replica_dirs=[a, b, tmp_path / "other"])
    with pybk.WAL(tmp_path / "plain") as wal:
        wal.append(b"y")
    with pytest.raises(ValueError, match="already keeps its replicas under"):
        pybk.WAL(tmp_path / "plain", replica_dirs=[a / "n", b / "n", c / "n"])
