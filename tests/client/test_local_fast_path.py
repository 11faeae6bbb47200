"""LocalTransport's add fast path: answers come straight from the bookie's journal, nothing
answered stays referenced by the timeout table, and timeouts still fire."""

from __future__ import annotations

import asyncio

import pytest

from pybk.errors import BookieUnavailableError, TimeoutError
from pybk.metadata.base import LedgerMetadata
from pybk.wire import AddRequest, AddResponse, DigestManager, Op, Status, master_key

from .conftest import mem_cluster

KEY = master_key(b"")


def add(lid: int, eid: int) -> AddRequest:
    return AddRequest(lid, eid, KEY, DigestManager(lid).frame(eid, eid - 1, 0, b"x"))


async def in_metadata(cluster, *ledger_ids: int) -> None:  # type: ignore[no-untyped-def]
    """Create the ledgers in the metadata, as a client does before its first add (a bookie
    refuses adds of ledgers the metadata lacks: pybk.bookie.unknown)."""
    for lid in ledger_ids:
        await cluster.store.create_ledger(LedgerMetadata(lid, 1, 1, 1, {0: ("b1",)}))


def pending(t) -> int:  # type: ignore[no-untyped-def]
    """Requests in the local transport's timeout table (under the test hooks' wrapper)."""
    return len(t.inner._deadlines)


async def test_answered_adds_leave_the_timeout_table_at_once() -> None:
    async with mem_cluster(["b1"]) as cluster:
        await in_metadata(cluster, 1)
        t = cluster.local_transport()
        futs = [t.send("b1", add(1, e), 30.0) for e in range(50)]
        assert pending(t) == 50
        replies = await asyncio.wait_for(asyncio.gather(*futs), 5)
        assert replies == [AddResponse(Status.OK, 1, e) for e in range(50)]
        assert pending(t) == 0  # no sweep needed: nothing answered is kept alive
        await t.close()


async def test_an_unanswered_add_still_times_out_and_the_rest_are_answered() -> None:
    async with mem_cluster(["b1"]) as cluster:
        await in_metadata(cluster, 2)
        t = cluster.local_transport()
        rule = t.hooks.drop("b1", op=Op.ADD, entry_id=1, times=1)
        futs = [t.send("b1", add(2, e), 0.05) for e in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*futs, return_exceptions=True), 5)
        assert isinstance(results[1], TimeoutError) and rule.matched == 1
        assert [r.status for i, r in enumerate(results) if i != 1] == [Status.OK, Status.OK]
        assert pending(t) == 0
        await t.close()


async def test_add_to_a_crashed_bookie_is_unavailable_not_an_error_status() -> None:
    async with mem_cluster(["b1"]) as cluster:
        await in_metadata(cluster, 3)
        t = cluster.local_transport()
        bookie = cluster.bookie("b1")
        bookie.fs.sync_delay = 0.01  # the add sits in the journal a while
        fut = t.send("b1", add(3, 0), 5.0)
        bookie.crash()
        with pytest.raises(BookieUnavailableError):
            await asyncio.wait_for(fut, 5)
        assert pending(t) == 0
        await t.close()
