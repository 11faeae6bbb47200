"""Adds of ledgers a bookie does not hold, checked against the metadata first
(pybk.bookie.unknown, issue 34 "ledger-id squatting"): one metadata read per ledger however
many adds wait for it, each add judged by its own key, no read once the ledger is held, and
every kind of add (single, batched, batched over several loop turns, recovery, deferred
sync) checked the same way."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from pybk.bookie import Bookie, BookieConfig
from pybk.errors import MetadataStoreError, NoSuchLedgerError
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.runtime.origin import REQUEST_ORIGIN
from pybk.storage import MemFileSystem
from pybk.wire import (
    AddBatchRequest,
    AddOutcome,
    AddRequest,
    FenceRequest,
    ForceRequest,
    ReadRequest,
    Status,
    add_response,
    master_key,
)

from .conftest import KEY, frame

OTHER = master_key(b"guess")
CONFIG = BookieConfig(disk_check_interval=0, checkpoint_interval=0, gc_interval=0)


class Gate:
    """before_op hook: counts the metadata reads of ledgers; holds them while closed."""

    def __init__(self) -> None:
        self.reads: list[int] = []
        self.open = asyncio.Event()
        self.open.set()
        self.fail: Exception | None = None

    async def __call__(self, op: str, key: Any) -> None:
        if op == "read_ledger":
            self.reads.append(key)
            await self.open.wait()
            if self.fail is not None:
                raise self.fail


async def make(*ledgers: tuple[int, bytes]) -> tuple[Bookie, MemoryMetadataStore, Gate]:
    """A bookie whose metadata holds ``ledgers`` ((id, master key kept: b"" for none))."""
    gate = Gate()
    meta = MemoryMetadataStore()
    for lid, key in ledgers:
        await meta.create_ledger(LedgerMetadata(lid, 1, 1, 1, {0: ("b1",)}, master_key=key))
    bookie = Bookie("b1", "/d", fs=MemFileSystem(), config=CONFIG, cookie_store=meta,
                    rng=random.Random(1))
    await bookie.start()
    meta.before_op = gate  # (after the cookie: only the bookie's checks from here on)
    return bookie, meta, gate


def send(bookie: Bookie, request: AddRequest | AddBatchRequest) -> asyncio.Future[Status]:
    """``bookie.add_request`` as a transport drives it; the future gets the answer's status."""
    fut: asyncio.Future[Status] = asyncio.get_running_loop().create_future()

    def done(outcome: AddOutcome) -> None:
        fut.set_result(add_response(request, outcome).status)

    bookie.add_request(request, done)
    return fut


async def until(cond: Callable[[], bool], what: str, bound: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"not within {bound}s: {what}")
        await asyncio.sleep(0.001)


def add(lid: int, eid: int, key: bytes = KEY, **kw: Any) -> AddRequest:
    return AddRequest(lid, eid, key, frame(lid, eid), **kw)


def batch(lid: int, eids: range, key: bytes = KEY, **kw: Any) -> AddBatchRequest:
    return AddBatchRequest(lid, key, tuple(eids), tuple(frame(lid, e) for e in eids), **kw)


async def test_a_pipelined_writer_of_a_new_ledger_waits_for_one_read_and_is_never_refused():
    """10,000 adds (and batches) sent before the first answer share one metadata read and
    one of the check's slots: with a single slot, none is refused; once held, no more
    reads."""
    bookie, _, gate = await make((5, KEY))
    assert bookie.unknown_ledgers is not None
    bookie.unknown_ledgers.limit = 1
    try:
        gate.open.clear()
        futs = [send(bookie, add(5, e)) for e in range(10_000)]
        futs += [send(bookie, batch(5, range(e, e + 100))) for e in range(10_000, 12_000, 100)]
        await until(lambda: len(gate.reads) == 1, "the read under way")
        assert gate.reads == [5] and bookie.unknown_ledgers.in_flight == 1
        gate.open.set()
        assert set(await asyncio.gather(*futs)) == {Status.OK}
        assert bookie.store.state(5).last_entry == 11_999
        assert await send(bookie, add(5, 12_000)) == Status.OK
        assert await send(bookie, batch(5, range(12_001, 12_010))) == Status.OK
        assert gate.reads == [5] and bookie.unknown_ledgers.lookups == 1
        assert bookie.unknown_ledgers.refused == 0
    finally:
        await bookie.stop()


async def test_adds_of_ledgers_the_metadata_lacks_or_keys_it_does_not_know_are_refused():
    bookie, _, gate = await make((5, KEY), (6, b""))
    try:
        for request in (add(9, 0), batch(9, range(3)), add(9, 0, recovery=True),
                        batch(9, range(3), recovery=True), add(9, 0, deferred_sync=True)):
            assert await send(bookie, request) == Status.UNKNOWN_LEDGER_STATE, request
        for request in (add(5, 0, OTHER), batch(5, range(3), OTHER),
                        add(5, 0, OTHER, recovery=True)):
            assert await send(bookie, request) == Status.UNAUTHORIZED, request
        assert bookie.store.find(9) is None and bookie.store.find(5) is None
        # the metadata keeps no key for ledger 6: only its existence is checked
        assert await send(bookie, add(6, 0, OTHER)) == Status.OK
        # the owner's adds of ledger 5 are its own
        assert await send(bookie, add(5, 0)) == Status.OK
        assert (await bookie.handle(ReadRequest(5, 0))).status == Status.OK
        assert await send(bookie, add(5, 1, OTHER)) == Status.UNAUTHORIZED  # (held: its key)
        assert gate.reads.count(5) == 4  # (three refused, then the owner's; none once held)
    finally:
        await bookie.stop()


async def test_a_squatter_and_the_owner_sharing_one_read_are_judged_by_their_own_keys():
    bookie, _, gate = await make((5, KEY))
    try:
        gate.open.clear()
        squat = [send(bookie, add(5, 0, OTHER)), send(bookie, batch(5, range(5), OTHER))]
        owner = [send(bookie, add(5, e)) for e in range(5)]
        fence = asyncio.ensure_future(bookie.handle(FenceRequest(5, OTHER)))
        await until(lambda: len(gate.reads) == 1, "the read under way")
        gate.open.set()
        assert await asyncio.gather(*squat) == [Status.UNAUTHORIZED] * 2
        assert await asyncio.gather(*owner) == [Status.OK] * 5
        assert (await fence).status == Status.UNAUTHORIZED
        assert gate.reads == [5] and bookie.store.find(5).master_key == KEY
    finally:
        await bookie.stop()


async def test_a_deleted_ledger_stays_refused_without_a_metadata_read():
    bookie, _, gate = await make((5, KEY))
    try:
        assert await send(bookie, add(5, 0)) == Status.OK
        await bookie.delete_ledger(5)
        assert await send(bookie, add(5, 1)) == Status.FENCED
        assert await send(bookie, batch(5, range(2, 4))) == Status.FENCED
        assert gate.reads == [5]
    finally:
        await bookie.stop()


async def test_the_slots_count_ledgers_and_a_full_set_refuses_a_new_one():
    bookie, _, gate = await make((5, KEY), (6, KEY), (7, KEY))
    assert bookie.unknown_ledgers is not None
    bookie.unknown_ledgers.limit = 2
    try:
        gate.open.clear()
        waiting = [send(bookie, add(5, 0)), send(bookie, add(6, 0)), send(bookie, add(5, 1))]
        assert await send(bookie, add(7, 0)) == Status.TOO_MANY_REQUESTS
        gate.open.set()
        assert await asyncio.gather(*waiting) == [Status.OK] * 3
        assert await send(bookie, add(7, 0)) == Status.OK  # (a slot is free again)
        assert bookie.unknown_ledgers.in_flight == 0
    finally:
        await bookie.stop()


async def test_a_failed_read_fails_its_adds_and_the_next_add_reads_again():
    bookie, _, gate = await make((5, KEY))
    try:
        gate.fail = MetadataStoreError("metadata unreachable")
        statuses = await asyncio.gather(send(bookie, add(5, 0)), send(bookie, add(5, 1)))
        assert len(set(statuses)) == 1 and statuses[0] != Status.OK
        assert bookie.store.find(5) is None and gate.reads == [5]
        gate.fail = None
        assert await send(bookie, add(5, 0)) == Status.OK
        assert gate.reads == [5, 5]
    finally:
        await bookie.stop()


async def test_a_stop_answers_the_adds_waiting_for_the_metadata():
    bookie, _, gate = await make((5, KEY))
    gate.open.clear()
    waiting = [send(bookie, add(5, e)) for e in range(3)]
    fence = asyncio.ensure_future(bookie.handle(FenceRequest(5, KEY)))
    await until(lambda: len(gate.reads) == 1, "the read under way")
    await bookie.stop()
    assert await asyncio.gather(*waiting) == [Status.UNAVAILABLE] * 3
    assert (await fence).status == Status.UNAVAILABLE
    gate.open.set()
    assert bookie.unknown_ledgers is not None and bookie.unknown_ledgers.in_flight == 0


@pytest.mark.parametrize("deferred", [False, True])
async def test_a_large_batch_over_several_turns_and_a_deferred_add_are_checked_once(deferred):
    bookie, _, gate = await make((5, KEY))
    bookie.admit_chunk = 16
    try:
        gate.open.clear()
        big = send(bookie, batch(5, range(100), deferred_sync=deferred))
        one = send(bookie, add(5, 100, deferred_sync=deferred))
        await until(lambda: len(gate.reads) == 1, "the read under way")
        gate.open.set()
        assert [await big, await one] == [Status.OK, Status.OK]
        assert gate.reads == [5]
        assert (await bookie.handle(ForceRequest(5, KEY))).status == Status.OK
        assert (await bookie.handle(ReadRequest(5, 100))).status == Status.OK
    finally:
        await bookie.stop()


async def test_the_awaitable_and_callback_forms_are_checked_too():
    bookie, _, gate = await make((5, KEY))
    try:
        with pytest.raises(Exception, match="refused") as refused:
            await bookie.add(8, 0, KEY, frame(8, 0))
        assert refused.value.status == Status.UNKNOWN_LEDGER_STATE
        got: list[AddOutcome] = []
        bookie.add_batch(5, [0, 1], [frame(5, 0), frame(5, 1)], KEY, got.append)
        await until(lambda: bool(got), "the batch answered")
        assert got == [None] and gate.reads == [8, 5]
    finally:
        await bookie.stop()


class LaggingReplica(MemoryMetadataStore):
    """A session whose reads miss the ledgers created since its last ``sync_reads`` (a
    ZooKeeper server behind the leader)."""

    def __init__(self, primary: MemoryMetadataStore) -> None:
        super().__init__(_state=primary._state)
        self.seen: set[int] = set()
        self.syncs = 0

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        if ledger_id not in self.seen:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist (yet, here)")
        return await super().read_ledger(ledger_id)

    async def sync_reads(self) -> bool:
        self.syncs += 1
        self.seen = set(await self.list_ledgers())
        return True


async def test_a_lagging_metadata_session_is_caught_up_before_a_ledger_is_called_absent():
    primary = MemoryMetadataStore()
    replica = LaggingReplica(primary)
    bookie = Bookie("b1", "/d", fs=MemFileSystem(), config=CONFIG, cookie_store=replica,
                    rng=random.Random(1))
    await bookie.start()
    try:
        await primary.create_ledger(LedgerMetadata(5, 1, 1, 1, {0: ("b1",)}, master_key=KEY))
        assert await send(bookie, add(5, 0)) == Status.OK
        assert replica.syncs == 1
        assert await send(bookie, add(6, 0)) == Status.UNKNOWN_LEDGER_STATE
        assert replica.syncs == 2  # (one catch-up per "absent", then the refusal)
    finally:
        await bookie.stop()


async def test_one_peer_holding_every_slot_cannot_refuse_another_peers_first_add():
    """A peer (a connection: REQUEST_ORIGIN) keeps lookups of absent ids in flight, as many
    as it may: another peer's first add of a real ledger still gets a slot, and the slots
    are then shared between them."""
    bookie, _, gate = await make((5, KEY), (6, KEY))
    check = bookie.unknown_ledgers
    assert check is not None
    check.limit = 8
    gate.open.clear()

    def as_peer(peer: str, request: AddRequest) -> asyncio.Future[Status]:
        token = REQUEST_ORIGIN.set(peer)
        try:
            return send(bookie, request)
        finally:
            REQUEST_ORIGIN.reset(token)

    try:
        squats = [as_peer("squatter", add(1000 + i, 0)) for i in range(8)]
        assert check.in_flight == 8  # alone, it may take every slot
        assert await as_peer("squatter", add(2000, 0)) == Status.TOO_MANY_REQUESTS
        writer = as_peer("writer", add(5, 0))  # holds none: gets one beyond the limit
        assert check.in_flight == 9
        # two peers now: the writer's share is 8 // 2, but the set is over the limit
        assert await as_peer("writer", add(6, 0)) == Status.TOO_MANY_REQUESTS
        assert await as_peer("squatter", add(2001, 0)) == Status.TOO_MANY_REQUESTS
        gate.open.set()
        assert await writer == Status.OK
        assert set(await asyncio.gather(*squats)) == {Status.UNKNOWN_LEDGER_STATE}
        assert check.in_flight == 0
    finally:
        await bookie.stop()


async def test_the_slots_are_shared_between_the_peers_holding_some():
    bookie, _, gate = await make()
    check = bookie.unknown_ledgers
    assert check is not None
    check.limit = 8
    gate.open.clear()
    started: dict[str, int] = {"a": 0, "b": 0}
    try:
        answers = []
        for i in range(12):  # in turn, as two busy peers would
            for peer in ("a", "b"):
                token = REQUEST_ORIGIN.set(peer)
                try:
                    before = check.lookups
                    answers.append(send(bookie, add(100 * (peer == "b") + 1000 + i, 0)))
                    started[peer] += check.lookups - before
                finally:
                    REQUEST_ORIGIN.reset(token)
        assert started == {"a": 4, "b": 4}  # 8 // 2 each
        gate.open.set()
        await asyncio.gather(*answers)
    finally:
        await bookie.stop()
