"""The WAL's followers: ``wal.follow()`` on the writer's own WAL, ``AsyncWALFollower`` /
``WALFollower`` on another client of the same bookies, ``promote()`` fencing the old writer,
the timeout, and bad input. Over TCP, a follower of bookie processes:
tests/tcp/test_wal_follow_process.py."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import pybk
from pybk import LedgerFencedError, Position
from pybk.client.context import ClientConfig

from .logs_kit import mem_cluster, until

pytestmark = pytest.mark.timeout(120)

#: the periodic explicit LAC out of reach: a prompt follower is the immediate LAC's doing
SLOW_TICK = ClientConfig(explicit_lac_interval=60.0, speculative_read_delay=0.0,
                         long_poll_timeout=30.0, add_timeout=2.0, read_timeout=2.0)


async def test_follow_replays_then_sees_each_record_as_it_is_acknowledged(
        tmp_path: Path) -> None:
    async with pybk.AsyncWAL(tmp_path, client_config=SLOW_TICK) as wal:
        before = [await wal.append(b"old-%d" % i) for i in range(3)]
        got: list[tuple[Position, bytes]] = []

        async def follow() -> None:
            async for pos, data in wal.follow():
                got.append((pos, data))

        follower = asyncio.ensure_future(follow())
        await until(lambda: len(got) == 3, timeout=5.0)
        assert [p for p, _ in got] == before
        for i in range(3):  # each one seen before the next is written: the last included
            pos = await wal.append(b"new-%d" % i)
            await until(lambda pos=pos: bool(got) and got[-1][0] == pos, timeout=5.0)
        follower.cancel()
        assert [d for _, d in got] == [b"old-0", b"old-1", b"old-2", b"new-0", b"new-1",
                                       b"new-2"]
        # from a position, with a timeout: ends once nothing new comes
        tail = [d async for _, d in wal.follow(start=before[2], timeout=0.2)]
        assert tail == [b"old-2", b"new-0", b"new-1", b"new-2"]


async def test_a_follower_on_another_client_and_its_promotion() -> None:
    async with mem_cluster(3, config=SLOW_TICK) as cluster:
        old = await pybk.AsyncWAL(name="app", client=cluster.client()).open()
        first = [await old.append(b"r%d" % i) for i in range(4)]
        async with pybk.AsyncWALFollower(name="app", client=cluster.client()) as f:
            seen: list[bytes] = []

            async def follow() -> None:
                async for _pos, data in f.follow():
                    seen.append(data)

            task = asyncio.ensure_future(follow())
            await until(lambda: len(seen) == 4, timeout=5.0)
            await old.append(b"last")  # the writer then goes quiet
            await until(lambda: len(seen) == 5, timeout=5.0)
            task.cancel()
            new = await f.promote()
            try:
                with pytest.raises(LedgerFencedError):
                    await old.append(b"too late")
                assert [d async for _, d in new.replay()] == [
                    b"r0", b"r1", b"r2", b"r3", b"last"]
                after = await new.append(b"from the new writer")
                assert after > first[-1]
            finally:
                await new.close()
        await old.close()  # (a fenced writer closes quietly)


def test_the_sync_follow_is_a_blocking_iterator_with_a_timeout(tmp_path: Path) -> None:
    with pybk.WAL(tmp_path, client_config=SLOW_TICK) as wal:
        wal.append(b"a")
        writer_done = threading.Event()

        def write() -> None:
            for i in range(3):
                wal.append(b"w%d" % i)
            writer_done.set()

        got = []
        thread = threading.Thread(target=write)
        for _pos, data in wal.follow(timeout=2.0):
            got.append(data)
            if len(got) == 1:
                thread.start()
            if len(got) == 4:
                break
        thread.join(30)
        assert writer_done.is_set() and got == [b"a", b"w0", b"w1", b"w2"]
        assert [d for _, d in wal.follow(timeout=0.1)] == got


async def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="exactly one"):
        pybk.AsyncWALFollower(name="x")
    with pytest.raises(TypeError, match="exactly one"):
        pybk.AsyncWALFollower(name="x", metadata="memory://", client=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        pybk.AsyncWAL(tmp_path, client=object())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not open"):
        pybk.AsyncWALFollower(name="x", metadata="memory://").log  # noqa: B018
    async with pybk.AsyncWAL(tmp_path) as wal:
        with pytest.raises(ValueError, match="timeout"):
            async for _ in wal.follow(timeout=-1):
                pass
        with pytest.raises(TypeError, match="Position"):
            async for _ in wal.follow(start=(1, 0, 0)):  # type: ignore[arg-type]
                pass
    async with mem_cluster(3) as cluster:
        with pytest.raises(pybk.LogNotFoundError):
            await pybk.AsyncWALFollower(name="nobody", client=cluster.client()).open()
