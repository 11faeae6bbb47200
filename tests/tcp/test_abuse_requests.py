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
    from pybk.metadata import open_store
    from pybk.metadata.base import LedgerMetadata

    bookie = await bookie_factory().astart()
    meta = open_store(bookie.metadata)  # (a bookie takes adds of ledgers the metadata holds)
    await meta.create_ledger(LedgerMetadata(1, 1, 1, 1, {0: ("b1",)}))
    await meta.close()
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
    assert "unencodable" not in log and "Traceback" not in log
    assert log.count("protocol errors") <= 3, log[-2000:]


async def test_fences_of_ledgers_not_yet_created_cannot_squat_them(bookie_factory) -> None:
    """Issue 34, item 5: ledger ids come in ascending blocks, and a FENCE for a ledger the
    bookie did not know recorded the key it carried: fencing the next 200 ids made every one
    of the next ledgers fail ("master key does not match"). Now such a fence is refused
    ("unknown", never "absent") unless the metadata holds the ledger, and with the metadata's
    master key, a fence under another key is refused too."""
    from pybk.client import Client
    from pybk.wire import FenceRequest

    bookie = await bookie_factory().astart()
    async with Client(bookie.metadata) as client:
        first = await client.create_ledger(1, 1, 1)
        await first.append(b"x")
        transport = _transport(bookie)
        try:
            for lid in range(first.id + 1, first.id + 201):
                r = await transport.send("b1", FenceRequest(lid, master_key(b"guess")), 10)
                assert r.status == Status.UNKNOWN_LEDGER_STATE, (lid, r)
                r = await transport.send("b1", ReadRequest(lid, -1, fence=True,
                                                           master_key=master_key(b"g")), 10)
                assert r.status == Status.UNKNOWN_LEDGER_STATE, (lid, r)
            for _ in range(20):  # the next ledgers are their creator's
                lh = await client.create_ledger(1, 1, 1, password=b"pw")
                await lh.append(b"mine")
                await lh.close()
            # a ledger that exists, fenced under another key than its metadata's: refused
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            r = await transport.send("b1", FenceRequest(lh.id, master_key(b"guess")), 10)
            assert r.status in (Status.UNAUTHORIZED, Status.UNKNOWN_LEDGER_STATE), r
            await lh.append(b"still mine")
            # recovery by the owner still fences (the metadata vouches for the ledger)
            rh = await client.open_ledger(lh.id, password=b"pw")
            assert rh.last_add_confirmed == 0
        finally:
            await transport.close()


async def test_adds_of_ledgers_not_yet_created_cannot_squat_them(bookie_factory) -> None:
    """Issue 34, "ledger-id squatting": an ADD (single, batched, recovery) of a ledger the
    bookie did not know created it under the key it carried, so one add to each of the next
    ids made their creator's adds fail ("master key does not match"). Now such an add is
    refused ("unknown") unless the metadata holds the ledger, and under another key than the
    metadata's it is refused too; a writer pipelining thousands of adds to a fresh ledger
    over TCP is never refused (its adds share one metadata check)."""
    from pybk.client import Client
    from pybk.wire import AddBatchRequest

    guess = master_key(b"guess")
    bookie = await bookie_factory().astart()
    async with Client(bookie.metadata) as client:
        first = await client.create_ledger(1, 1, 1)
        await first.append(b"x")
        transport = _transport(bookie)
        try:
            for lid in range(first.id + 1, first.id + 201):
                frames = [DigestManager(lid).frame(e, e - 1, 1, b"s") for e in (0, 1)]
                for request in (AddRequest(lid, 0, guess, frames[0]),
                                AddRequest(lid, 0, guess, frames[0], recovery=True),
                                AddBatchRequest(lid, guess, (0, 1), tuple(frames))):
                    r = await transport.send("b1", request, 10)
                    assert r.status == Status.UNKNOWN_LEDGER_STATE, (lid, r)
            for _ in range(20):  # the next ledgers are their creator's
                lh = await client.create_ledger(1, 1, 1, password=b"pw")
                assert await lh.append(b"mine") == 0
                await lh.close()
            # a ledger that exists and the bookie has not heard of yet, under another key
            lh = await client.create_ledger(1, 1, 1, password=b"pw")
            frame0 = DigestManager(lh.id).frame(0, -1, 1, b"s")
            for request in (AddRequest(lh.id, 0, guess, frame0),
                            AddBatchRequest(lh.id, guess, (0,), (frame0,))):
                r = await transport.send("b1", request, 10)
                assert r.status == Status.UNAUTHORIZED, r
            # the owner pipelines 5,000 adds before the first answer: none refused
            futs = [lh.append(b"e%d" % i) for i in range(5000)]
            assert await asyncio.wait_for(asyncio.gather(*futs), 60) == list(range(5000))
            await lh.close()
            rh = await client.open_ledger(lh.id, password=b"pw")
            assert rh.last_add_confirmed == 4999
        finally:
            await transport.close()
