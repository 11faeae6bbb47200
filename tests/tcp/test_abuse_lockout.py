"""Many addresses, one silent connection each (issue 34, item 4): displacement only took a
connection from an address holding two more than the newcomer's, so 130 addresses held the
128-slot unauthenticated budget of a token bookie (and 4,200 the 4,096 cap of a plain one)
and every client was refused. A newcomer now always takes the place of the oldest connection
that has not proven itself (or, with none, of the oldest that has sent nothing)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest
from abuse_kit import BookieUnderTest, wait_for

from pybk.testing.attacks import SilentConnections
from pybk.transport.tcp import TcpTransport
from pybk.wire import BookieInfoRequest, Status

pytestmark = pytest.mark.integration

#: the attackers: 250 loopback addresses, one connection each (clients use 127.0.0.1)
ATTACKERS = [f"127.0.{i // 250 + 1}.{i % 250 + 1}" for i in range(250)]


@pytest.fixture
def bookie_factory(tmp_path):
    started: list[BookieUnderTest] = []

    def make(*args: str) -> BookieUnderTest:
        bookie = BookieUnderTest(tmp_path / f"b{len(started)}", *args)
        started.append(bookie)
        return bookie

    yield make
    for bookie in started:
        bookie.kill()


async def _connects(bookie: BookieUnderTest, within: float, **kw) -> bool:
    """Whether a fresh client connects (authenticating) and is answered within ``within``."""
    async def resolve(_bookie_id: str) -> str:
        return bookie.address

    transport = TcpTransport(resolve, **kw)
    try:
        response = await transport.send(bookie.bookie_id, BookieInfoRequest(), within)
        return response.status == Status.OK
    except Exception:
        return False
    finally:
        await transport.close()


#: the flood runs in a process of its own (as an attacker's would: on its own loop, not the
#: client's), printing "running" once it opened a round of connections
_FLOOD = """
import asyncio, sys
from pybk.testing.attacks import ReconnectFlood
async def main():
    host, port, addrs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    flood = ReconnectFlood(host, port, count=len(addrs), pause=0.01, local_addresses=addrs)
    await flood.start()
    while flood.stats["opened"] < 2 * len(addrs):
        await asyncio.sleep(0.05)
    print("running", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_a_token_client_gets_in_past_many_addresses_reconnecting(bookie_factory,
                                                                       tmp_path) -> None:
    token = tmp_path / "token"
    token.write_bytes(b"s3cret")
    bookie = await bookie_factory("--auth-token-file", str(token),
                                  "--max-unauthenticated", "32").astart()
    flood = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FLOOD, bookie.host, str(bookie.port), ",".join(ATTACKERS),
        stdout=asyncio.subprocess.PIPE, env=os.environ.copy())
    try:
        assert flood.stdout is not None
        line = await asyncio.wait_for(flood.stdout.readline(), 60)
        assert line.strip() == b"running", line
        tries = [await _connects(bookie, 1.0, auth_token=b"s3cret") for _ in range(20)]
        assert sum(tries) >= 19, tries  # was 0: every newcomer refused
        m = await bookie.ametrics()
        assert m["pybk_server_unauthenticated_connections"] <= 32
        assert m.get("event:displaced", 0) >= len(ATTACKERS)
    finally:
        flood.send_signal(signal.SIGKILL)
        await flood.wait()


async def test_a_plain_bookie_full_of_silent_addresses_still_admits_a_client(
        bookie_factory) -> None:
    bookie = await bookie_factory("--max-connections", "64").astart()
    attack = SilentConnections(bookie.host, bookie.port, count=len(ATTACKERS),
                               local_addresses=ATTACKERS)
    await attack.start()
    try:
        await wait_for(lambda: bookie.metrics().get("pybk_server_connections", 0) >= 64, 30,
                       "the cap is full")
        tries = [await _connects(bookie, 2.0) for _ in range(10)]
        assert all(tries), tries
        assert (await bookie.ametrics()).get("event:displaced", 0) >= 10
    finally:
        await attack.stop()
