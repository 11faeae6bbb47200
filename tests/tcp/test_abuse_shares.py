"""Per-bookie slots filled by many connections, each within its own share (issue 34, second
round): the unknown-ledger check looks at most 64 ledgers up at once, a connection holding
none getting one more up to 128 (pybk.bookie.unknown), so enough connections each fencing
one absent id at a time can hold all 128. Does a writer's first add of a new ledger (a
lookup too) then starve? Measured against a real ``pybk bookie``: no. (The entries-in-flight
slots are tested in tests/tcp/test_abuse_entries.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from abuse_kit import BookieUnderTest
from prometheus_client import CollectorRegistry

from pybk.client import Client

pytestmark = pytest.mark.integration

_FLOOD = """
import asyncio, json, sys
from pybk.testing.attacks import FenceFlood
host, port, conns, seconds = sys.argv[1:5]
async def main():
    flood = FenceFlood(host, int(port), connections=int(conns), depth=4,
                       local_addresses=[f"127.0.2.{i}" for i in range(1, 201)])
    await flood.start()
    print("running", flush=True)
    await asyncio.sleep(float(seconds))
    await flood.stop()
    print(json.dumps(dict(flood.stats)), flush=True)
asyncio.run(main())
"""


@pytest.fixture
def bookie(tmp_path):
    started = BookieUnderTest(tmp_path / "b")
    yield started
    started.kill()


async def test_many_connections_fencing_absent_ids_do_not_starve_a_writers_first_adds(
        bookie) -> None:
    """600 connections from 200 addresses, each keeping four FENCEs of absent ids in flight
    (the slots are full: most are refused TOO_MANY_REQUESTS), while a client creates ten
    ledgers and appends to each: no add is refused and no ensemble changes. It passes on
    the code before this round too (no fix needed); a probe beside 1,000 such connections
    saw 20 of 20 ledgers, rounds up to 1.6 s."""
    await bookie.astart()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    flood = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FLOOD, bookie.host, str(bookie.port), "600", "15",
        stdout=asyncio.subprocess.PIPE, env=env)
    assert flood.stdout is not None
    registry = CollectorRegistry()
    try:
        assert b"running" in await asyncio.wait_for(flood.stdout.readline(), 60)
        loop = asyncio.get_running_loop()
        flood_ends = loop.time() + 15
        rounds: list[float] = []
        async with Client(bookie.metadata, metrics=registry) as client:
            for i in range(10):
                began = loop.time()
                lh = await asyncio.wait_for(client.create_ledger(1, 1, 1, password=b"pw"), 10)
                assert await asyncio.wait_for(lh.append(b"first %d" % i), 10) == 0
                assert await asyncio.wait_for(lh.read(0, 0), 10) is not None
                rounds.append(loop.time() - began)
        assert loop.time() < flood_ends, rounds  # (all of it under attack)
        stats = json.loads((await asyncio.wait_for(flood.stdout.read(), 60)).decode()
                           .strip().splitlines()[-1])
    finally:
        if flood.returncode is None:
            flood.kill()
        await flood.wait()
    samples = {s.name: s.value for m in registry.collect() for s in m.samples}
    assert samples["pybk_client_add_errors_total"] == 0, samples
    assert samples["pybk_client_ensemble_changes_total"] == 0, samples
    assert max(rounds) < 5.0, rounds
    assert stats.get("answered.TOO_MANY_REQUESTS", 0) > 1000, stats  # the slots were full
