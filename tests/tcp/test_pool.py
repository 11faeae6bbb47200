"""The client's connection pool: N connections per bookie, one ledger per connection."""

from __future__ import annotations

import asyncio

import pytest

from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport
from pybk.wire import AddRequest, Status

from .conftest import StubBookie


def _resolver(server: BookieServer | None):  # type: ignore[no-untyped-def]
    async def resolve(bookie_id: str) -> str:
        assert server is not None
        host, port = server.address
        return f"{host}:{port}"

    return resolve


async def test_requests_spread_over_the_pool_by_ledger_and_stay_in_order(stub: StubBookie) -> None:
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server), connections_per_bookie=3)
        futs = [
            transport.send("b1", AddRequest(ledger, entry, b"k", b"%d" % entry), 5.0)
            for entry in range(50)
            for ledger in range(6)
        ]
        responses = await asyncio.gather(*futs)
        assert all(r.status == Status.OK for r in responses)
        assert server.stats["accepted"] == 3, "one connection per pool slot"
        # each ledger's adds reached the bookie in the order they were sent
        for ledger in range(6):
            order = [c.entry_id for c in stub.calls if c.ledger_id == ledger]
            assert order == list(range(50)), ledger
        assert transport.connected_bookies() == ["b1"]
        await transport.close()


async def test_default_is_one_connection_per_bookie(stub: StubBookie) -> None:
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server))
        await asyncio.gather(
            *(transport.send("b1", AddRequest(ledger, 0, b"k", b"x"), 5.0) for ledger in range(5))
        )
        assert server.stats["accepted"] == 1
        await transport.close()


def test_pool_size_is_validated() -> None:
    with pytest.raises(ValueError, match="connections_per_bookie"):
        TcpTransport(_resolver(None), connections_per_bookie=0)


def test_client_config_carries_the_pool_size() -> None:
    from pybk.client import ClientConfig

    assert ClientConfig(connections_per_bookie=4).connections_per_bookie == 4
    with pytest.raises(ValueError, match="connections_per_bookie"):
        ClientConfig(connections_per_bookie=0)
