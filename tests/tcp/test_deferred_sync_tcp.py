"""Deferred sync over TCP (protocol version 3: the add flag and FORCE): appends answered
before the bookies' fsync, ``force()`` making them durable and telling readers."""

from __future__ import annotations

import asyncio

import pytest

import pybk
from pybk.client import Client, ClientConfig

from .inproc_tcp import tcp_bookies

pytestmark = pytest.mark.timeout(60)

CONFIG = ClientConfig(add_timeout=5.0, read_timeout=5.0, explicit_lac_interval=0.0)


async def test_deferred_sync_over_tcp() -> None:
    async with tcp_bookies(3) as cluster, \
            Client(cluster.store, config=CONFIG) as writer, \
            Client(cluster.store, config=CONFIG) as reader:
        for bookie in cluster.bookies.values():
            bookie.fs.sync_delay = 0.2  # type: ignore[attr-defined]
        lh = await writer.create_ledger(3, 2, 2, write_flags={"deferred_sync"})
        assert isinstance(lh, pybk.DeferredSyncLedgerHandle)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(4):
            assert await lh.append(b"e%d" % i) == i
        assert loop.time() - started < 0.2
        assert sum(b.deferred.pending(lh.id) for b in cluster.bookies.values()) > 0
        rh = await reader.open_ledger(lh.id, recovery=False)
        assert rh.last_add_confirmed == -1
        assert await lh.force() == 3
        assert await rh.read_last_add_confirmed() == 3
        assert [e.data for e in await rh.read(0, 3)] == [b"e0", b"e1", b"e2", b"e3"]
        await lh.close()
