"""Sticky reads over TCP: the reads of a ledger (E == Qw) reach one bookie's server while it
serves, and the next bookie's once that server is gone."""

from __future__ import annotations

import pytest

from pybk.client import Client, ClientConfig

from .inproc_tcp import tcp_bookies

pytestmark = pytest.mark.timeout(60)

STICKY = ClientConfig(add_timeout=5.0, read_timeout=5.0, speculative_read_delay=0.0,
                      sticky_reads=True)

#: a writer that sends no LAC of its own (the servers' request counts are the reads alone)
QUIET = ClientConfig(immediate_lac=False, explicit_lac_interval=0.0)


async def test_sticky_reads_over_tcp() -> None:
    async with tcp_bookies(3) as cluster, Client(cluster.store, config=STICKY) as client, \
            Client(cluster.store, config=QUIET) as writer:
        lh = await writer.create_ledger(3, 3, 2)
        await lh.append_many([b"e%d" % i for i in range(30)])
        await lh.close()
        rh = await client.open_ledger(lh.id)
        assert rh.sticky is not None
        before = {b: s.stats["requests"] for b, s in cluster.servers.items()}
        for first in range(0, 30, 10):
            assert len(await rh.read(first, first + 9)) == 10
        served = {b: s.stats["requests"] - before[b] for b, s in cluster.servers.items()}
        busy = [b for b, n in served.items() if n]
        assert len(busy) == 1, served
        await cluster.servers[busy[0]].stop()
        before = {b: s.stats["requests"] for b, s in cluster.servers.items()}
        got = [e.data for first in range(0, 30, 10) for e in await rh.read(first, first + 9)]
        assert got == [b"e%d" % i for i in range(30)]
        served = {b: s.stats["requests"] - before[b] for b, s in cluster.servers.items()}
        ensemble = rh.metadata.ensembles[0]
        nxt = ensemble[(ensemble.index(busy[0]) + 1) % 3]
        assert [b for b, n in served.items() if n] == [nxt], served
