"""Against real ``pybk bookie`` processes: a 5 MiB entry is refused before its id is taken
(EntryTooLargeError, also a ValueError), and the writer goes on: later appends, batched ones
included, are acknowledged and ``close()`` returns (it used to hang: the id was used up by an
entry no bookie would ever take)."""

from __future__ import annotations

import asyncio

import pytest

from pybk.client import Client
from pybk.errors import EntryTooLargeError

from .proc_cluster import ProcCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_an_oversized_entry_over_tcp_leaves_the_writer_working(tmp_path) -> None:
    cluster = ProcCluster(tmp_path / "cluster", 3)
    await cluster.start()
    try:
        async with Client(cluster.metadata) as client:
            lh = await client.create_ledger(3, 2, 2)
            assert await asyncio.wait_for(lh.append(b"first"), 30) == 0
            with pytest.raises(EntryTooLargeError) as info:
                lh.append(b"x" * (5 << 20))
            assert isinstance(info.value, ValueError)
            assert lh.last_add_pushed == 0
            futs = [lh.append(b"e%d" % i) for i in range(200)]  # pushed together: batched
            ids = await asyncio.wait_for(asyncio.gather(*futs), 30)
            assert ids == list(range(1, 201))
            await asyncio.wait_for(lh.close(), 30)
            rh = await client.open_ledger(lh.id, recovery=False)
            entries = await rh.read(0, 200)
            assert [e.data for e in entries] == [b"first", *(b"e%d" % i for i in range(200))]
    finally:
        cluster.stop_all()
