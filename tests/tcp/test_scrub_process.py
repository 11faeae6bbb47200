"""A ``pybk bookie`` finds damage in a sealed segment by itself (issue 34, item 8): a byte
flipped while it was down used to go unnoticed ("writable (started)") until a reader hit
it. Now its scrubber reports it in the bookie's info and metrics and marks the ledger
under-replicated, so auto-recovery copies the entry back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from abuse_kit import BookieUnderTest, wait_for

from pybk.client import Client
from pybk.metadata import open_store
from pybk.transport.tcp import TcpTransport
from pybk.wire import BookieInfoRequest, Status

pytestmark = pytest.mark.integration


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


async def test_a_flipped_byte_in_a_sealed_segment_is_reported_and_marked(tmp_path: Path) -> None:
    bookie = await BookieUnderTest(tmp_path / "r", "--segment-mb", "1").astart()
    async with Client(bookie.metadata) as client:
        lh = await client.create_ledger(1, 1, 1)
        await lh.append_many([bytes([i % 251]) * (64 << 10) for i in range(48)])  # 3 MiB
        await lh.close()
    bookie.stop()
    journal = bookie.root / "bookies" / "b1" / "journal"
    first = sorted(n for n in os.listdir(journal) if n.endswith(".seg"))[0]
    _flip(journal / first, 200 << 10)  # a sealed segment the checkpoint covers
    await bookie.astart()
    try:
        async def damaged() -> bool:
            return (await bookie.ametrics()).get("pybk_bookie_damaged_entries", 0) >= 1

        await wait_for(damaged, 30, "the scrubber finds the damage")

        async def resolve(_b: str) -> str:
            return bookie.address

        transport = TcpTransport(resolve)
        try:
            info = await transport.send("b1", BookieInfoRequest(), 10)
            assert info.status == Status.OK and "damaged entries" in info.message, info
        finally:
            await transport.close()
        store = open_store(bookie.metadata)
        try:
            async def marked() -> bool:
                return lh.id in await store.list_under_replicated()

            await wait_for(marked, 10, "the ledger marked under-replicated")
        finally:
            await store.close()
        assert "scrubber: ledger" in bookie.log()
    finally:
        bookie.stop()  # (by PID: the second start is this test's to stop)
