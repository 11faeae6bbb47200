"""Caller-chosen entry ids over TCP (in-process bookies behind loopback servers): out-of-order
appends, a duplicate refused, recovery by another client sealing at the contiguous prefix. The
wire needs nothing new: an add names its entry id already."""

from __future__ import annotations

import asyncio

import pytest

from pybk.client import Client, ClientConfig
from pybk.errors import DuplicateEntryIdError, LedgerFencedError

from .inproc_tcp import tcp_bookies

pytestmark = pytest.mark.timeout(60)

CONFIG = ClientConfig(add_timeout=5.0, read_timeout=5.0)


async def test_adv_ids_over_tcp() -> None:
    async with tcp_bookies(3) as cluster, \
            Client(cluster.store, config=CONFIG) as writer, \
            Client(cluster.store, config=CONFIG) as reader:
        lh = await writer.create_ledger_adv(3, 2, 2, password=b"pw")
        ids = [5, 3, 0, 4, 2, 1, 9, 7]
        futs = [lh.append(eid, b"e%d" % eid) for eid in ids]
        with pytest.raises(DuplicateEntryIdError):
            lh.append(3, b"again")
        done = await asyncio.gather(*futs[:6])
        assert done == ids[:6] and lh.last_add_confirmed == 5 and lh.held == 2
        assert any(s.connections for s in cluster.servers.values())  # (TCP it is)
        rh = await reader.open_ledger(lh.id, password=b"pw")  # recovery: 6 never came
        assert rh.last_add_confirmed == 5
        assert [e.data for e in await rh.read(0, 5)] == [b"e%d" % i for i in range(6)]
        with pytest.raises(LedgerFencedError):
            await lh.append(6, b"e6")
        for fut in futs[6:]:
            with pytest.raises(LedgerFencedError):
                await fut
        await lh.close()
