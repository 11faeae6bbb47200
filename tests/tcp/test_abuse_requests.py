"""Requests that used to cost a real ``pybk bookie`` process far more than they carried, or
write a log line each (issue 34, items 1, 2 and 7). Each runs against the process over real
sockets; every wait is bounded."""

from __future__ import annotations

import asyncio

import pytest
from abuse_kit import BookieUnderTest

from pybk.transport.tcp import TcpTransport
from pybk.wire import AddRequest, DigestManager, ReadRequest, Status, master_key

pytestmark = pytest.mark.integration

KEY = master_key(b"pw")


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


def _transport(bookie: BookieUnderTest) -> TcpTransport:
    async def resolve(_bookie_id: str) -> str:
        return bookie.address

    return TcpTransport(resolve)


async def test_remote_errors_are_clean_answers_and_their_log_lines_rate_limited(
        bookie_factory) -> None:
    """A long poll with previous_lac = 2^63-1 used to fail encoding its answer (entry id
    2^63) and log an ERROR line per request; garbage on a connection logged a line per
    connection. Now: BAD_REQUEST, and a handful of log lines for hundreds of events."""
    bookie = await bookie_factory().astart()
    transport = _transport(bookie)
    try:
        body = DigestManager(1).frame(0, -1, 1, b"x")
        assert (await transport.send("b1", AddRequest(1, 0, KEY, body), 10)).status == Status.OK
        for _ in range(300):
            r = await transport.send("b1", ReadRequest(1, 0, previous_lac=(1 << 63) - 1,
                                                       timeout=1.0), 10)
            assert r.status == Status.BAD_REQUEST and "previous_lac" in r.message
        for _ in range(200):  # not a frame: the connection is closed
            reader, writer = await asyncio.open_connection(bookie.host, bookie.port)
            writer.write(b"\xff" * 64)
            await asyncio.wait_for(reader.read(), 10)
            writer.close()
        r = await transport.send("b1", ReadRequest(1, 0), 10)  # still serving
        assert r.status == Status.OK and r.body == body
    finally:
        await transport.close()
    log = bookie.log()
    assert "cannot encode" not in log and "Traceback" not in log
    assert log.count("protocol errors") <= 3, log[-2000:]
