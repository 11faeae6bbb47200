"""Memory backend specifics: sessions, the simulator's fault hook, URIs, determinism."""

from __future__ import annotations

import asyncio

import pytest

from pybk.errors import ClientClosedError, CorruptRecordError, MetadataStoreError
from pybk.metadata import MemoryDirectory, MemoryMetadataStore, open_store
from pybk.metadata.base import BookieRegistration, LedgerMetadata


def _md(lid: int) -> LedgerMetadata:
    return LedgerMetadata(lid, 3, 2, 2, {0: ("b1", "b2", "b3")})


async def test_registration_lives_until_its_session_expires() -> None:
    store = MemoryMetadataStore()
    bookie_side = store.session()
    fired: list[int] = []
    store.watch_bookies(lambda: fired.append(1))
    await bookie_side.register_bookie(BookieRegistration("b1", "h:1"))
    await store.register_bookie(BookieRegistration("b2", "h:2"))
    assert await store.writable_bookies() == ["b1", "b2"]
    assert bookie_side.expire_session() == ["b1"]
    assert await store.writable_bookies() == ["b2"]
    await asyncio.sleep(0)
    assert len(fired) == 3
    # the expired session's store keeps working under a new session: it may register again
    await bookie_side.register_bookie(BookieRegistration("b1", "h:1"))
    assert await store.writable_bookies() == ["b1", "b2"]
    store._check()


async def test_close_drops_own_registrations_and_refuses_further_use() -> None:
    store = MemoryMetadataStore()
    other = store.session()
    await other.register_bookie(BookieRegistration("b1", ""))
    await other.close()
    await other.close()  # idempotent
    assert await store.list_bookies() == []
    with pytest.raises(ClientClosedError):
        await other.read_ledger(1)


async def test_before_op_hook_can_fail_an_operation_before_it_takes_effect() -> None:
    seen: list[tuple[str, object]] = []

    async def hook(op: str, key: object) -> None:
        seen.append((op, key))
        if op == "write_ledger":
            raise MetadataStoreError("injected")

    store = MemoryMetadataStore(before_op=hook)
    created = await store.create_ledger(_md(7))
    with pytest.raises(MetadataStoreError, match="injected"):
        await store.write_ledger(created.with_changes(state="CLOSED"), created.version)
    assert (await store.read_ledger(7)).state == "OPEN"
    assert ("create_ledger", 7) in seen and ("write_ledger", 7) in seen


async def test_before_op_hook_can_stall_an_operation() -> None:
    gate = asyncio.Event()

    async def hook(op: str, key: object) -> None:
        if op == "create_ledger":
            await gate.wait()

    store = MemoryMetadataStore(before_op=hook)
    task = asyncio.create_task(store.create_ledger(_md(1)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    assert await store.list_ledgers() == []
    gate.set()
    assert (await task).version > 0
    assert await store.list_ledgers() == [1]


async def test_corrupt_bytes_raise_corrupt_record_error() -> None:
    store = MemoryMetadataStore()
    await store.create_ledger(_md(3))
    raw = store.raw_ledger(3)
    store.corrupt_ledger(3, raw[:-1] + bytes([raw[-1] ^ 1]))
    with pytest.raises(CorruptRecordError):
        await store.read_ledger(3)


async def test_named_memory_uri_shares_data_between_opens() -> None:
    directory = MemoryDirectory()
    a = open_store("memory://t-shared", memory=directory)
    b = open_store("memory://t-shared", memory=directory)
    await a.create_ledger(_md(5))
    assert await b.list_ledgers() == [5]
    c = open_store("memory://")
    assert await c.list_ledgers() == []
    # separate sessions: closing one does not take the other's bookies away
    await b.register_bookie(BookieRegistration("bk", ""))
    await a.close()
    assert await b.writable_bookies() == ["bk"]
    directory.forget("t-shared")
    assert await open_store("memory://t-shared", memory=directory).list_ledgers() == []


def test_a_named_memory_uri_without_a_directory_is_refused() -> None:
    with pytest.raises(ValueError, match="MemoryDirectory"):
        open_store("memory://t-shared")


def test_same_operations_same_result_deterministic() -> None:
    """Two runs of the same concurrent workload give identical versions and ids."""

    async def run() -> list[object]:
        store = MemoryMetadataStore()
        ids = await asyncio.gather(*(store.allocate_ledger_id() for _ in range(5)))
        for i in ids:
            await store.create_ledger(_md(i))

        async def bump(i: int) -> LedgerMetadata:
            return await store.update_ledger(
                ids[0], lambda m: m.with_changes(length=m.length + i)
            )

        results = await asyncio.gather(*(bump(i) for i in range(1, 6)))
        return [*ids, *(r.version for r in results), (await store.read_ledger(ids[0])).length]

    assert asyncio.run(run()) == asyncio.run(run())


async def test_after_op_hook_models_a_write_whose_reply_was_lost() -> None:
    async def lose_reply(op: str, key: object) -> None:
        if op == "write_ledger":
            raise MetadataStoreError("reply lost")

    store = MemoryMetadataStore(after_op=lose_reply)
    created = await store.create_ledger(_md(4))
    with pytest.raises(MetadataStoreError, match="reply lost"):
        await store.write_ledger(created.with_changes(state="CLOSED"), created.version)
    now = await store.session().read_ledger(4)
    assert now.state == "CLOSED" and now.version != created.version  # it did take effect
