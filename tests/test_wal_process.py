"""Real processes: a child appends through pybk.WAL and prints each acknowledged position; it is
killed with SIGKILL at a random moment (chosen by the number of acknowledgements seen, not by
time); the next WAL replays every record the child printed. Embedded (in-process bookies under
the directory) twice in a row, and over TCP bookie processes where a bookie of the writer's
ensemble is SIGKILLed too while the child writes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from logs_kit import until
from process_kit import children

import pybk
from pybk import Position
from pybk.server.processes import pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHILD = textwrap.dedent("""
    import sys
    import pybk

    where, first = sys.argv[1], int(sys.argv[2])
    wal = pybk.WAL(where) if "://" not in where else pybk.WAL(name="app", metadata=where)
    print("ready", wal.last_position, flush=True)
    i = first
    while True:  # single appends and batches; each line is printed once acknowledged
        if i % 7 == 0:
            batch = [b"rec-%d" % j for j in range(i, i + 5)]
            for j, pos in enumerate(wal.append_many(batch), start=i):
                print(pos, j, flush=True)
            i += 5
        else:
            print(wal.append(b"rec-%d" % i), i, flush=True)
            i += 1
""")


class Child:
    """The appending child process; its acknowledged (position, index) lines."""

    def __init__(self, where: str, first: int) -> None:
        self.where, self.first = where, first
        self.proc: asyncio.subprocess.Process | None = None
        self.acked: list[tuple[Position, int]] = []
        self.ready: str = ""
        #: the sync helpers it had when it was killed
        self.helpers: list[int] = []

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CHILD, self.where, str(self.first),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        if not line.startswith(b"ready"):
            err = await self.proc.stderr.read() if self.proc.stderr else b""
            raise AssertionError(f"child did not start: {line!r} {err.decode()[-2000:]}")
        self.ready = line.decode().split(maxsplit=1)[1].strip()

    async def wait_acked(self, count: int) -> None:
        """Read acknowledgements until ``count`` were seen (bounded)."""
        assert self.proc is not None and self.proc.stdout is not None
        while len(self.acked) < count:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
            if not line:
                err = await self.proc.stderr.read() if self.proc.stderr else b""
                raise AssertionError(f"child ended: {err.decode()[-3000:]}")
            self._take(line)

    def _take(self, line: bytes) -> None:
        pos, index = line.decode().split()
        self.acked.append((Position.parse(pos), int(index)))

    async def kill(self) -> None:
        """SIGKILL, then every line it printed before dying counts too. Its bookies' sync
        helper processes (pybk.storage.syncer: one per in-process bookie on real files) see
        their sockets close and end too."""
        assert self.proc is not None and self.proc.stdout is not None
        helpers = children(self.proc.pid, running="_sync_child.py")
        os.kill(self.proc.pid, signal.SIGKILL)
        rest = await asyncio.wait_for(self.proc.stdout.read(), 60)
        await asyncio.wait_for(self.proc.wait(), 60)
        await until(lambda: not any(map(pid_alive, helpers)), 60)  # (each saw its socket close)
        self.helpers = helpers
        # (the text after the last newline is a line the kill cut short: with an unbuffered
        # stdout, PYTHONUNBUFFERED=1, print writes its pieces one by one; an acknowledgement
        # not printed whole is one the test does not count)
        for line in rest.split(b"\n")[:-1]:
            if line.strip():
                self._take(line)


def check_replay(replayed: list[tuple[Position, bytes]], acked: list[tuple[Position, int]]
                 ) -> None:
    """Every acknowledged record is there, at its position; nothing repeats; the log is in
    position order; anything else is a record sent but not acknowledged (after the last one
    acknowledged of its run)."""
    got = dict(replayed)
    assert len(got) == len(replayed), "a position repeats"
    assert [p for p, _ in replayed] == sorted(got), "not in position order"
    for pos, index in acked:
        assert got.get(pos) == b"rec-%d" % index, (pos, index, got.get(pos))
    datas = [d for _, d in replayed]
    assert len(set(datas)) == len(datas), "a record was replayed twice"


async def test_embedded_wal_survives_kill_9(tmp_path: Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    where = str(tmp_path / "wal")
    acked: list[tuple[Position, int]] = []
    first = 0
    for _ in range(2):
        child = Child(where, first)
        await child.start()
        expected_last = acked[-1][0] if acked else None
        if expected_last is not None:  # the restarted WAL recovered up to at least it
            assert child.ready != "None" and Position.parse(child.ready) >= expected_last
        await child.wait_acked(rng.randrange(5, 400))
        await child.kill()
        assert len(child.helpers) == 3, child.helpers  # one per embedded bookie
        acked += child.acked
        first = child.acked[-1][1] + 100
    async with pybk.AsyncWAL(where) as wal:
        replayed = [pd async for pd in wal.replay()]
    check_replay(replayed, acked)
    assert len(replayed) >= len(acked)
    print(f"embedded: {len(acked)} acknowledged in 2 runs, {len(replayed)} replayed")


async def test_embedded_wal_with_replica_dirs_survives_kill_9(tmp_path: Path) -> None:
    """Replicas in directories of their own: made once here (the layout is recorded under the
    WAL's directory), then the child's plain ``pybk.WAL(where)`` finds them; after its kill -9
    the replay from the same directories has every acknowledged record."""
    where = str(tmp_path / "wal")
    dirs = [tmp_path / f"dev{i}" / "replica" for i in range(3)]
    async with pybk.AsyncWAL(where, replica_dirs=dirs):
        pass
    child = Child(where, 0)
    await child.start()
    await child.wait_acked(random.Random(int.from_bytes(os.urandom(4), "big")).randrange(5, 300))
    await child.kill()
    assert len(child.helpers) == 3, child.helpers
    assert not (tmp_path / "wal" / "bookies").exists()
    async with pybk.AsyncWAL(where, replica_dirs=dirs) as wal:
        replayed = [pd async for pd in wal.replay()]
    check_replay(replayed, child.acked)
    assert len(replayed) >= len(child.acked) > 0


async def test_wal_over_tcp_bookies_survives_kill_9_of_the_writer_and_a_bookie(
        tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from tcp.proc_cluster import ProcCluster

    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    cluster = ProcCluster(tmp_path, bookies=4)
    try:
        await cluster.start()
        child = Child(cluster.metadata, 0)
        await child.start()
        await child.wait_acked(rng.randrange(5, 200))
        async with pybk.Client(cluster.metadata) as client:  # a bookie the writer uses
            log = await client.namespace("wal").open_log("app")
            seg = (await log.segments())[-1]
            md = await client.ledger_metadata(seg.ledger_id)
            victim = rng.choice(list(md.last_ensemble))
        cluster.kill9(victim)
        await child.wait_acked(len(child.acked) + rng.randrange(5, 200))  # it goes on
        await child.kill()
        async with pybk.AsyncWAL(name="app", metadata=cluster.metadata) as wal:
            replayed = [pd async for pd in wal.replay()]
        check_replay(replayed, child.acked)
        print(f"tcp: {len(child.acked)} acknowledged (bookie {victim} killed), "
              f"{len(replayed)} replayed")
    finally:
        cluster.stop_all()
