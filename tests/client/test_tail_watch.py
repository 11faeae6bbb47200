"""A tail started after its handle was opened sees every metadata change since the open,
including one its own client already read through another handle (the store's watch
baseline is what it last returned, which may be newer than this handle's metadata)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import pybk
from pybk.client.context import ClientConfig
from pybk.storage.memfs import MemFileSystem


async def _follow(rh: pybk.ReadHandle) -> list[bytes]:
    return [e.data async for e in rh.tail(0)]


@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
async def test_a_tail_ends_when_the_ledger_was_closed_before_it_started(
        tmp_path: Path, scheme: str) -> None:
    for trial in range(5):  # act at once: no settling anywhere
        uri = "memory://" if scheme == "memory" else f"sqlite:///{tmp_path}/m{trial}.db"
        async with pybk.LocalCluster(f"/t{trial}", bookies=3, fs=MemFileSystem(),
                                     metadata=uri) as cluster:
            # a long poll outlasts the test: only the metadata can end the tail in time
            client = cluster.client(config=ClientConfig(long_poll_timeout=60.0))
            lh = await client.create_ledger(3, 2, 2)
            for i in range(3):
                await lh.append(b"e%d" % i)
            rh = await client.open_ledger(lh.id, recovery=False)
            await lh.close()  # through the same client: its store returned the closed record

            assert await asyncio.wait_for(_follow(rh), 15) == [b"e0", b"e1", b"e2"]
