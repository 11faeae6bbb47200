"""Entries in flight (issue 34, second round): one ADD_BATCH can carry 65,536 entries of 44
bytes, each costing the bookie Python work and memory (its slice, its record, its index
step) however few bytes it brings, so bytes in flight did not bound that cost: one
connection pipelining such batches drove a ``pybk bookie`` past 700 MiB with loop stalls of
a third of a second. Entries in flight are now capped per connection and per bookie, by
back-pressure (the bookie stops reading), never by refusing the writer."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from abuse_kit import BookieUnderTest

from pybk.client import Client
from pybk.transport.limits import ServerConfig
from pybk.wire import master_key

pytestmark = pytest.mark.integration

MiB = 1 << 20
CAPS = ServerConfig()

#: the flood runs in a process of its own (an attacker's CPU is not the client's)
_FLOOD = """
import asyncio, json, sys
from pybk.testing.attacks import TinyBatchFlood
host, port, ids, conns, entries, depth, seconds = sys.argv[1:8]
async def main():
    flood = TinyBatchFlood(host, int(port), ledger_ids=[int(i) for i in ids.split(",")],
                           master_key=bytes.fromhex(sys.argv[8]), connections=int(conns),
                           entries=int(entries), depth=int(depth))
    await flood.start()
    print("running", flush=True)
    await asyncio.sleep(float(seconds))
    await flood.stop()
    print(json.dumps(dict(flood.stats)), flush=True)
asyncio.run(main())
"""


@pytest.fixture
def bookie(tmp_path):
    started = BookieUnderTest(tmp_path / "b", "--segment-mb", "64")
    yield started
    started.kill()


async def _flood_beside_a_writer(bookie: BookieUnderTest, *, connections: int, entries: int,
                                 depth: int, seconds: float) -> dict[str, Any]:
    """Run the flood for ``seconds`` while a normal client on its own connection appends 16
    entries and reads one back in rounds; what the client saw, the flood's answers and the
    bookie's peak RSS, longest loop stall and entries in flight (sampled)."""
    await bookie.astart()
    key = master_key(b"attacker")
    async with Client(bookie.metadata) as client:
        ids = [(await client.create_ledger(1, 1, 1, password=b"attacker")).id
               for _ in range(connections)]
        mine = await client.create_ledger(1, 1, 1, password=b"mine")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        flood = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FLOOD, bookie.host, str(bookie.port),
            ",".join(map(str, ids)), str(connections), str(entries), str(depth), str(seconds),
            key.hex(), stdout=asyncio.subprocess.PIPE, env=env)
        assert flood.stdout is not None
        try:
            assert b"running" in await asyncio.wait_for(flood.stdout.readline(), 60)
            loop = asyncio.get_running_loop()
            latencies: list[float] = []
            in_flight: list[float] = []
            end = loop.time() + seconds
            while loop.time() < end:
                began = loop.time()
                futs = [mine.append(b"n%d" % i) for i in range(16)]
                first = (await asyncio.wait_for(asyncio.gather(*futs), 30))[0]
                assert await asyncio.wait_for(mine.read(first, first), 30) is not None
                latencies.append(loop.time() - began)
                metrics = await bookie.ametrics()
                in_flight.append(metrics["pybk_server_entries_in_flight"])
            stats = json.loads((await asyncio.wait_for(flood.stdout.read(), 60)).decode()
                               .strip().splitlines()[-1])
        finally:
            if flood.returncode is None:
                flood.kill()
            await flood.wait()
    metrics = await bookie.ametrics()
    latencies.sort()
    return {"latencies": latencies, "in_flight": in_flight, "flood": stats,
            "peak_rss": bookie.peak_rss(), "stall": metrics["pybk_loop_stall_seconds_max"],
            "metrics": metrics}


async def test_batches_of_tiny_entries_neither_bloat_nor_stall_a_bookie(bookie) -> None:
    """Two connections, each keeping eight 65,536-entry batches of new 44-byte entries in
    flight for 8 s. Before the cap (here, on a loaded 2-core machine): peak RSS 316 MiB,
    loop stalls 51-122 ms, 10 batches answered; now 175-216 MiB, 14-110 ms, 55-82 answered:
    each connection holds one such batch at a time. Every batch is stored (the writer is
    slowed, never refused) and the normal client's rounds go on."""
    got = await _flood_beside_a_writer(bookie, connections=2, entries=65536, depth=8,
                                       seconds=8.0)
    flood, metrics = got["flood"], got["metrics"]
    summary = {k: v for k, v in got.items() if k not in ("latencies", "metrics", "in_flight")}
    summary["max_in_flight"] = max(got["in_flight"])
    summary["client_max"] = got["latencies"][-1]
    assert flood.get("answered.OK", 0) >= 6, summary
    assert set(flood) <= {"opened", "sent", "answered.OK"}, summary  # nothing refused
    assert metrics["event:connection_entries_full"] > 0, summary  # back-pressure was used
    assert metrics["pybk_server_peak_connection_entries"] <= CAPS.max_entries_in_flight
    assert max(got["in_flight"]) <= CAPS.bookie_entries_in_flight * 5 // 4, summary
    assert got["peak_rss"] < 256 * MiB, summary
    assert got["stall"] < 0.25, summary  # (21-110 ms here, with other loads on the machine)
    assert len(got["latencies"]) >= 5 and got["latencies"][-1] < 2.0, summary


async def test_many_connections_within_their_caps_do_not_starve_a_writer(bookie) -> None:
    """Sixty-four connections, each keeping sixteen 4,096-entry batches in flight (its own
    cap's worth, four million entries wanted in all): the bookie holds at most its cap and
    a quarter, and a writer on another connection keeps appending and reading. Before the
    bookie's cap its rounds (16 appends, one read) took up to 2.1-2.8 s; now 0.27-0.78 s.
    The peak RSS (445-490 MiB now, 610 before) is mostly the index: batches of one ledger
    admitted in turns interleave, complete out of order and make its index sparse."""
    got = await _flood_beside_a_writer(bookie, connections=64, entries=4096, depth=16,
                                       seconds=8.0)
    flood, metrics = got["flood"], got["metrics"]
    summary = {k: v for k, v in got.items() if k not in ("latencies", "metrics", "in_flight")}
    summary["max_in_flight"] = max(got["in_flight"])
    summary["client_p50"] = got["latencies"][len(got["latencies"]) // 2]
    summary["client_max"] = got["latencies"][-1]
    assert flood.get("answered.OK", 0) >= 64, summary
    assert set(flood) <= {"opened", "sent", "answered.OK"}, summary
    assert metrics["event:bookie_entries_full"] > 0, summary  # the bookie's cap was reached
    assert max(got["in_flight"]) <= CAPS.bookie_entries_in_flight * 5 // 4, summary
    assert len(got["latencies"]) >= 5 and got["latencies"][-1] < 1.5, summary
    assert got["peak_rss"] < 1024 * MiB, summary  # (mostly the index: see above)


def test_the_caps_are_options() -> None:
    """--max-entries-in-flight and --bookie-entries-in-flight reach ServerConfig."""
    from pybk.cli.limits import server_config_from

    cfg = server_config_from({"max_entries_in_flight": 10, "bookie_entries_in_flight": 20})
    assert (cfg.max_entries_in_flight, cfg.bookie_entries_in_flight) == (10, 20)
    with pytest.raises(ValueError, match="max_entries_in_flight"):
        ServerConfig(max_entries_in_flight=0)
    assert Path(__file__).exists()
