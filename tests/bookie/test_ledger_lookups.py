"""The tenancy gate and the unknown-ledger check share one metadata read of a new ledger
(pybk.bookie.lookups, issue 34): one read on its first add, not two, with neither check
weakened (another key, a ledger the metadata lacks, a stale finding are judged as before),
and the reads themselves: shared while under way, errors raised, a cancelled reader's
waiters read again."""

from __future__ import annotations

import asyncio

import pytest

import pybk
from pybk.bookie import Bookie
from pybk.bookie.lookups import LedgerLookups
from pybk.bookie.tenancy import ANONYMOUS, enable_tenancy
from pybk.errors import MetadataStoreError
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.metadata.tenancy import NAMESPACE_KEY, TenancyRecords
from pybk.wire import AddRequest, Response, Status

from .conftest import KEY
from .test_unknown_ledgers import OTHER, Gate, add, make, send, until


async def gated(bookie: Bookie, request: AddRequest) -> Status:
    """An add as a transport handles it: the tenancy gate first, then the bookie."""
    verdict = bookie.tenancy.check(ANONYMOUS, request)
    if verdict is not None and not isinstance(verdict, Response):
        verdict = await verdict
    if verdict is not None:
        return verdict.status  # type: ignore[no-any-return]
    return await send(bookie, request)


@pytest.mark.parametrize("tenancy", [False, True], ids=["check_alone", "gate_and_check"])
async def test_the_first_add_of_a_new_ledger_reads_its_metadata_once(tenancy: bool) -> None:
    bookie, meta, gate = await make((5, KEY))
    try:
        if tenancy:
            await enable_tenancy(bookie, meta, authenticated=False)
            assert bookie.tenancy.lookups is bookie.ledger_lookups
            assert await gated(bookie, add(5, 0)) == Status.OK
        else:
            assert await send(bookie, add(5, 0)) == Status.OK
        assert gate.reads == [5]  # (both on: 2 before the reads were shared)
        assert bookie.ledger_lookups is not None and bookie.ledger_lookups.reads == 1
        if tenancy:
            assert await gated(bookie, add(5, 1)) == Status.OK
        assert gate.reads == [5]
    finally:
        await bookie.stop()


async def test_a_shared_read_still_judges_the_key_and_absence_is_read_again() -> None:
    bookie, meta, gate = await make((5, KEY), (6, KEY))
    try:
        await enable_tenancy(bookie, meta, authenticated=False)
        assert await gated(bookie, add(5, 0, OTHER)) == Status.UNAUTHORIZED
        assert gate.reads == [5]
        assert await gated(bookie, add(5, 0)) == Status.OK  # the owner, same finding
        assert gate.reads == [5]
        # absence is never handed on: the check reads for itself before it refuses
        assert await gated(bookie, add(9, 0)) == Status.UNKNOWN_LEDGER_STATE
        assert gate.reads == [5, 9, 9]
        assert bookie.store.find(9) is None
    finally:
        await bookie.stop()


async def test_a_deleted_ledger_is_not_vouched_for_by_an_old_finding() -> None:
    bookie, meta, gate = await make((5, KEY))
    try:
        await enable_tenancy(bookie, meta, authenticated=False)
        lookups = bookie.ledger_lookups
        assert lookups is not None
        lookups.fresh = 0.05
        assert await bookie.tenancy.namespace_of(5) is None  # the gate's read: found
        meta.before_op = None
        await meta.delete_ledger(5)
        meta.before_op = gate
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while lookups.recent(5) is not None:  # (poll the bound's passing)
            assert loop.time() < deadline
            await asyncio.sleep(0.01)
        assert await send(bookie, add(5, 0)) == Status.UNKNOWN_LEDGER_STATE
        assert gate.reads == [5, 5]  # (the check read again, and found it gone)
    finally:
        await bookie.stop()


async def test_end_to_end_each_bookie_reads_a_new_ledgers_metadata_once(tmp_path) -> None:
    """A LocalCluster (tenancy gate and unknown-ledger check on by default): the first add
    of a ledger in a namespace costs each of its 3 bookies one metadata read (6 before)."""
    cluster = pybk.LocalCluster(tmp_path, bookies=3)
    await cluster.start()
    try:
        await TenancyRecords(cluster.store).create_tenant("acme")
        await TenancyRecords(cluster.store).create_namespace("acme/orders")
        client = cluster.client()
        lh = await client.create_ledger(custom_metadata={NAMESPACE_KEY: b"acme/orders"},
                                        ensemble_size=3, write_quorum=3, ack_quorum=3)
        reads: list[int] = []
        store = cluster.store  # (every bookie's, SQLite: counted on its way in)
        real = store.read_ledger

        async def counted(ledger_id: int) -> LedgerMetadata:
            if ledger_id == lh.id:
                reads.append(ledger_id)
            return await real(ledger_id)

        store.read_ledger = counted  # type: ignore[method-assign]
        await lh.append(b"first")
        await asyncio.gather(*(lh.append(b"more") for _ in range(50)))
        assert len(reads) == 3, reads
    finally:
        await cluster.close()


async def test_reads_under_way_are_shared_and_errors_reach_every_waiter() -> None:
    gate = Gate()
    meta = MemoryMetadataStore(before_op=gate)
    meta.before_op = None
    await meta.create_ledger(LedgerMetadata(5, 1, 1, 1, {0: ("b1",)}, master_key=KEY))
    meta.before_op = gate
    lookups = LedgerLookups(meta)
    gate.open.clear()
    first = asyncio.ensure_future(lookups.read(5))
    others = [asyncio.ensure_future(lookups.read(5)) for _ in range(3)]
    await until(lambda: gate.reads == [5], "the read under way")
    await asyncio.sleep(0)  # (the others ask meanwhile)
    assert gate.reads == [5]
    gate.open.set()
    found = await asyncio.gather(first, *others)
    assert {md.master_key for md in found if md is not None} == {KEY} and None not in found
    assert lookups.reads == 1 and lookups.recent(5) is None  # (not asked to remember)
    assert await lookups.read(5, remember=True) is not None and lookups.recent(5) is not None
    assert await lookups.read(6) is None and lookups.recent(6) is None
    gate.fail = MetadataStoreError("store down")
    gate.open.clear()
    waiting = [asyncio.ensure_future(lookups.read(7)) for _ in range(2)]
    await until(lambda: gate.reads[-1] == 7, "the read under way")
    gate.open.set()
    for result in await asyncio.gather(*waiting, return_exceptions=True):
        assert isinstance(result, MetadataStoreError)
    assert gate.reads == [5, 5, 6, 7]


async def test_a_cancelled_reader_leaves_its_waiters_to_read_again() -> None:
    gate = Gate()
    meta = MemoryMetadataStore()
    await meta.create_ledger(LedgerMetadata(5, 1, 1, 1, {0: ("b1",)}, master_key=KEY))
    meta.before_op = gate
    lookups = LedgerLookups(meta)
    gate.open.clear()
    first = asyncio.ensure_future(lookups.read(5))
    second = asyncio.ensure_future(lookups.read(5))
    await until(lambda: gate.reads == [5], "the read under way")
    first.cancel()
    await until(lambda: gate.reads == [5, 5], "the waiter's own read")
    gate.open.set()
    md = await second
    assert md is not None and md.master_key == KEY
    assert first.cancelled()


def test_bad_settings_are_value_errors() -> None:
    with pytest.raises(ValueError, match="fresh"):
        LedgerLookups(MemoryMetadataStore(), fresh=-1)
    with pytest.raises(ValueError, match="capacity"):
        LedgerLookups(MemoryMetadataStore(), capacity=0)
