"""One connection keeping lookups of absent ledger ids in flight cannot make another
connection's first add of a real ledger be refused TOO_MANY_REQUESTS: the unknown-ledger
check's metadata slots are shared per connection (pybk.bookie.unknown, issue 34)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from pybk.bookie import Bookie, BookieConfig
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.storage import MemFileSystem
from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport
from pybk.wire import AddRequest, DigestManager, FenceRequest, Status, master_key

KEY = master_key(b"pw")
REAL = 7
pytestmark = pytest.mark.timeout(60)


async def test_absent_id_lookups_of_one_connection_leave_a_slot_for_a_writer() -> None:
    meta = MemoryMetadataStore()
    await meta.create_ledger(LedgerMetadata(REAL, 1, 1, 1, {0: ("b1",)}, master_key=KEY))
    bookie = Bookie("b1", "/d", fs=MemFileSystem(), cookie_store=meta, rng=random.Random(1),
                    config=BookieConfig(disk_check_interval=0, checkpoint_interval=0,
                                        gc_interval=0))
    await bookie.start()
    release = asyncio.Event()
    held: list[int] = []

    async def hold_absent_reads(op: str, key: Any) -> None:
        if op == "read_ledger" and key != REAL:  # the squatter's reads stay under way
            held.append(key)
            await release.wait()

    meta.before_op = hold_absent_reads
    check = bookie.unknown_ledgers
    assert check is not None
    squatter = writer = None
    try:
        async with BookieServer(bookie.handle, add=bookie.add_request) as server:
            host, port = server.address

            async def resolve(_: str) -> str:
                return f"{host}:{port}"

            squatter, writer = TcpTransport(resolve), TcpTransport(resolve)
            fences = [asyncio.ensure_future(squatter.send(
                "b1", FenceRequest(1000 + i, master_key(b"guess")), 30.0))
                for i in range(check.limit + 8)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while check.in_flight < check.limit or len(held) < check.limit:
                assert loop.time() < deadline, (check.in_flight, len(held))
                await asyncio.sleep(0.005)
            body = DigestManager(REAL).frame(0, -1, 0, b"first")
            answer = await writer.send("b1", AddRequest(REAL, 0, KEY, body), 10.0)
            assert answer.status == Status.OK, answer
            release.set()
            statuses = {(await f).status for f in fences}
            assert statuses <= {Status.UNKNOWN_LEDGER_STATE, Status.TOO_MANY_REQUESTS}
            assert Status.TOO_MANY_REQUESTS in statuses  # the squatter itself is bounded
    finally:
        for t in (squatter, writer):
            if t is not None:
                await t.close()
        await bookie.stop()
