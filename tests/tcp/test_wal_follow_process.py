"""A WAL on three bookie processes (``pybk.WAL(name=..., metadata=URI)``) and a
``pybk.WALFollower`` of it on another client: the follower gets each record, the last before
the writer goes quiet included, without waiting for the periodic explicit LAC (set out of
reach), and ``promote()`` fences the writer and returns a WAL holding every record."""

from __future__ import annotations

import asyncio
import threading

import pytest

import pybk
from pybk import LedgerFencedError
from pybk.client.context import ClientConfig

from .proc_cluster import ProcCluster

pytestmark = pytest.mark.integration

SLOW_TICK = ClientConfig(explicit_lac_interval=60.0, speculative_read_delay=0.0,
                         long_poll_timeout=30.0)


@pytest.fixture
async def cluster(tmp_path):
    c = ProcCluster(tmp_path / "cluster", 3)
    await c.start()
    yield c
    c.stop_all()


def _scenario(metadata: str) -> None:
    wal = pybk.WAL(name="app", metadata=metadata, client_config=SLOW_TICK)
    try:
        wal.append(b"r0")
        with pybk.WALFollower(name="app", metadata=metadata, client_config=SLOW_TICK) as f:
            got: list[bytes] = []
            appended = threading.Event()

            def write() -> None:
                for i in range(1, 4):
                    wal.append(b"r%d" % i)
                appended.set()

            writer = threading.Thread(target=write)
            # 5 s with nothing new ends the loop: far below the 60 s tick
            for _pos, data in f.follow(timeout=5.0):
                got.append(data)
                if len(got) == 1:
                    writer.start()
                if len(got) == 4:
                    break
            writer.join(30)
            assert appended.is_set() and got == [b"r0", b"r1", b"r2", b"r3"]
            new = f.promote()
            try:
                with pytest.raises(LedgerFencedError):
                    wal.append(b"too late")
                assert [d for _, d in new.replay()] == got
                new.append(b"r4")
            finally:
                new.close()
    finally:
        wal.close()


async def test_a_follower_of_bookie_processes_and_its_promotion(cluster):
    await asyncio.to_thread(_scenario, cluster.metadata)
