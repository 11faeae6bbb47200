"""The immediate LAC over TCP, with three bookie processes: a tailing reader and a long poll
in another client see a quiet writer's last record at once (the periodic explicit LAC is set
out of reach), and a writer *process* killed right after its last immediate LAC leaves a
ledger whose recovery agrees with what the reader saw."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pybk.client import Client
from pybk.client.context import ClientConfig

from .conftest import wait_until
from .proc_cluster import ProcCluster

pytestmark = pytest.mark.integration

SLOW_TICK = ClientConfig(explicit_lac_interval=60.0, speculative_read_delay=0.0,
                         long_poll_timeout=30.0)

WRITER = textwrap.dedent("""
    import asyncio, sys
    from pybk.client import Client
    from pybk.client.context import ClientConfig

    async def main():
        config = ClientConfig(explicit_lac_interval=60.0)
        async with Client(sys.argv[1], config=config) as client:
            lh = await client.create_ledger(3, 3, 2, password=b"pw")
            print(lh.id, flush=True)
            for i in range(int(sys.argv[2])):
                await lh.append(b"r%d" % i)
            print("acked", flush=True)
            await asyncio.Event().wait()  # quiet until killed

    asyncio.run(main())
""")


def _spawn_writer(metadata: str, records: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", WRITER, metadata, str(records)],
                            stdout=subprocess.PIPE, text=True)


@pytest.fixture
async def cluster(tmp_path):
    c = ProcCluster(tmp_path / "cluster", 3)
    await c.start()
    yield c
    c.stop_all()


async def test_tail_and_long_poll_see_the_last_record_at_once_over_tcp(cluster):
    async with Client(cluster.metadata, config=SLOW_TICK) as writer, \
            Client(cluster.metadata, config=SLOW_TICK) as reader:
        lh = await writer.create_ledger(3, 2, 2, password=b"pw")
        rh = await reader.open_ledger(lh.id, password=b"pw", recovery=False)
        got: list[bytes] = []

        async def follow() -> None:
            async for entry in rh.tail(0):
                got.append(entry.data)

        follower = asyncio.ensure_future(follow())
        for i in range(3):
            await lh.append(b"t%d" % i)
        await wait_until(lambda: len(got) == 3, timeout=5.0, what="the tail")  # tick: 60 s
        follower.cancel()
        assert got == [b"t0", b"t1", b"t2"]

        poll = asyncio.ensure_future(rh.read_last_add_confirmed_and_entry(3, timeout=30.0))
        await lh.append(b"t3")
        entry = await asyncio.wait_for(poll, 5.0)
        assert entry is not None and entry.data == b"t3"
        await lh.close()


async def test_a_writer_process_killed_after_its_immediate_lac(cluster):
    proc = _spawn_writer(cluster.metadata, 5)
    try:
        assert proc.stdout is not None
        ledger_id = int(await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60))
        async with Client(cluster.metadata, config=SLOW_TICK) as reader:
            rh = await reader.open_ledger(ledger_id, password=b"pw", recovery=False)
            got: list[bytes] = []

            async def follow() -> None:
                async for entry in rh.tail(0):
                    got.append(entry.data)

            follower = asyncio.ensure_future(follow())
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            assert line.strip() == "acked"
            await wait_until(lambda: len(got) == 5, timeout=5.0, what="the last record")
            os.kill(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait, 10)
            follower.cancel()
            recovered = await reader.open_ledger(ledger_id, password=b"pw", recovery=True)
            assert recovered.last_add_confirmed == 4
            assert [e.data for e in await recovered.read(0, 4)] == got
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
