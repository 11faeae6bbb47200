"""The write path: creation checks, pipelined in-order acks, close, bad input."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pybk.client.reader import ReadHandle
from pybk.errors import (
    DigestMismatchError,
    EntryNotConfirmedError,
    LedgerClosedError,
    MetadataVersionError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from pybk.metadata.base import CLOSED, OPEN
from pybk.testing.mutations import ACK_OUT_OF_ORDER, Mutations
from pybk.wire import DigestManager, Op

from .conftest import FAST, mem_cluster, until


async def test_create_validates_arguments() -> None:
    async with mem_cluster(3) as cluster:
        client = cluster.client()
        with pytest.raises(ValueError, match="ack_quorum"):
            await client.create_ledger(3, 2, 0)
        with pytest.raises(ValueError, match=r"write_quorum \(1\) must be >= ack_quorum \(2\)"):
            await client.create_ledger(3, 1, 2)
        with pytest.raises(ValueError, match=r"ensemble_size \(2\) must be >= write_quorum"):
            await client.create_ledger(2, 3, 2)
        with pytest.raises(ValueError, match="digest_type"):
            await client.create_ledger(3, 2, 2, digest_type="SHA1")
        with pytest.raises(TypeError, match="password"):
            await client.create_ledger(3, 2, 2, password="secret")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="custom_metadata"):
            await client.create_ledger(3, 2, 2, custom_metadata={"k": "v"})  # type: ignore[dict-item]
        assert await client.list_ledgers() == []  # nothing was created by bad calls


async def test_not_enough_bookies_to_create() -> None:
    async with mem_cluster(2) as cluster:
        with pytest.raises(NotEnoughBookiesError, match="need 3 writable bookies, have 2"):
            await cluster.client().create_ledger(3, 2, 2)
        assert await cluster.client().list_ledgers() == []


async def test_append_assigns_ids_and_acks_in_order() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2, custom_metadata={"k": b"v"})
        assert lh.metadata.custom_metadata == {"k": b"v"}
        assert (lh.last_add_pushed, lh.last_add_confirmed) == (-1, -1)
        futs = [lh.append(b"e%d" % i) for i in range(5)]
        assert lh.last_add_pushed == 4  # ids assigned synchronously
        assert await asyncio.gather(*futs) == [0, 1, 2, 3, 4]
        assert lh.last_add_confirmed == 4
        assert await lh.append_many([b"a", bytearray(b"b"), memoryview(b"c")]) == [5, 6, 7]
        with pytest.raises(TypeError, match="bytes"):
            lh.append("text")  # type: ignore[arg-type]
        lh._check()


async def test_acks_wait_for_earlier_entries() -> None:
    """Entry 1 reaches Qa before entry 0; its future completes only after entry 0's."""
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 2)
        hold = cluster.transport.hooks.hold(op=Op.ADD, entry_id=0)
        f0 = lh.append(b"zero")
        f1 = lh.append(b"one")
        await hold.wait_held(3)
        await until(lambda: lh._pipeline.core.has_quorum(1))
        await asyncio.sleep(0)
        assert not f1.done() and lh.last_add_confirmed == -1
        order: list[int] = []
        f0.add_done_callback(lambda f: order.append(0))
        f1.add_done_callback(lambda f: order.append(1))
        hold.release(2)  # Qa for entry 0
        assert await f1 == 1 and await f0 == 0
        assert order == [0, 1]
        hold.remove()


async def test_ack_out_of_order_mutation_breaks_ordering() -> None:
    """The deliberately broken build completes entry 1 while entry 0 is still pending."""
    async with mem_cluster(3) as cluster:
        broken = dataclasses.replace(FAST, mutations=Mutations(ACK_OUT_OF_ORDER))
        lh = await cluster.client(config=broken).create_ledger(3, 3, 2)
        hold = cluster.transport.hooks.hold(op=Op.ADD, entry_id=0)
        f0 = lh.append(b"zero")
        f1 = lh.append(b"one")
        assert await f1 == 1
        assert not f0.done()
        hold.release()
        assert await f0 == 0


async def test_close_seals_ledger_and_readers_agree() -> None:
    async with mem_cluster(3) as cluster:
        client = cluster.client()
        lh = await client.create_ledger(3, 2, 2, password=b"pw")
        payloads = [bytes([i]) * (i + 1) for i in range(20)]
        await lh.append_many(payloads)
        await lh.close()
        md = await client.ledger_metadata(lh.id)
        assert (md.state, md.last_entry_id, md.length) == (CLOSED, 19, sum(map(len, payloads)))
        with pytest.raises(LedgerClosedError):
            lh.append(b"late")
        await lh.close()  # idempotent
        for recovery in (False, True):
            rh = await cluster.client().open_ledger(lh.id, password=b"pw", recovery=recovery)
            assert rh.is_closed and rh.last_add_confirmed == 19
            assert [e.data for e in await rh.read(0, 19)] == payloads
            assert [e.entry_id for e in await rh.read(5, 7)] == [5, 6, 7]


async def test_close_empty_ledger() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger()
        await lh.close()
        md = await cluster.client().ledger_metadata(lh.id)
        assert (md.state, md.last_entry_id, md.length) == (CLOSED, -1, 0)


async def test_close_waits_for_pending_adds() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        hold = cluster.transport.hooks.hold(op=Op.ADD)
        futs = [lh.append(b"x") for _ in range(3)]
        closing = asyncio.ensure_future(lh.close())
        await hold.wait_held(6)
        assert not closing.done()
        hold.remove()
        await closing
        assert [f.result() for f in futs] == [0, 1, 2]
        md = await cluster.client().ledger_metadata(lh.id)
        assert (md.last_entry_id, md.length) == (2, 3)


async def test_close_adopts_identical_close_and_rejects_different() -> None:
    async with mem_cluster(3) as cluster:
        client = cluster.client()
        lh = await client.create_ledger()
        await lh.append_many([b"a", b"b"])
        md = await client.ledger_metadata(lh.id)
        await cluster.store.write_ledger(
            md.with_changes(state=CLOSED, last_entry_id=1, length=2), md.version
        )
        await lh.close()  # identical: success

        lh2 = await client.create_ledger()
        await lh2.append_many([b"a", b"b"])
        md = await client.ledger_metadata(lh2.id)
        await cluster.store.write_ledger(
            md.with_changes(state=CLOSED, last_entry_id=0, length=1), md.version
        )
        with pytest.raises(MetadataVersionError, match="closed by another client at last entry 0"):
            await lh2.close()


async def test_close_survives_cas_conflicts() -> None:
    """Another client bumps the version while the writer closes: the CAS loop retries."""
    async with mem_cluster(3) as cluster:
        client = cluster.client()
        lh = await client.create_ledger()
        await lh.append(b"a")
        bumps = 0
        store = cluster.store

        async def bump(op: str, key: object) -> None:
            nonlocal bumps
            if op == "write_ledger" and bumps < 3:
                bumps += 1
                store.before_op = None  # type: ignore[attr-defined]
                md = await store.read_ledger(lh.id)
                await store.write_ledger(md.with_changes(custom_metadata={"n": b"%d" % bumps}),
                                         md.version)
                store.before_op = bump  # type: ignore[attr-defined]

        store.before_op = bump  # type: ignore[attr-defined]
        await lh.close()
        store.before_op = None  # type: ignore[attr-defined]
        md = await client.ledger_metadata(lh.id)
        assert bumps == 3
        assert (md.state, md.last_entry_id, md.custom_metadata) == (CLOSED, 0, {"n": b"3"})


async def test_wrong_password_and_mac_digest() -> None:
    async with mem_cluster(3) as cluster:
        client = cluster.client()
        lh = await client.create_ledger(3, 2, 2, digest_type="MAC", password=b"right")
        await lh.append_many([b"secret-0", b"secret-1"])
        await lh.close()
        with pytest.raises(UnauthorizedError, match="wrong password"):
            await client.open_ledger(lh.id, password=b"wrong")
        # bypass the metadata check: the MAC digest itself rejects a wrong key
        md = await client.ledger_metadata(lh.id)
        ctx = client._context()
        bad = ReadHandle(ctx, md, DigestManager(lh.id, "MAC", b"wrong"), md.last_entry_id)
        with pytest.raises(DigestMismatchError):
            await bad.read(0, 1)
        good = await client.open_ledger(lh.id, password=b"right")
        assert [e.data for e in await good.read(0, 1)] == [b"secret-0", b"secret-1"]


async def test_delete_and_list_ledgers() -> None:
    async with mem_cluster(3) as cluster:
        client = cluster.client()
        ids = [(await client.create_ledger()).id for _ in range(3)]
        assert await client.list_ledgers() == sorted(ids)
        await client.delete_ledger(ids[1])
        assert await client.list_ledgers() == [ids[0], ids[2]]
        with pytest.raises(NoSuchLedgerError):
            await client.open_ledger(ids[1])
        with pytest.raises(NoSuchLedgerError):
            await client.delete_ledger(ids[1])


async def test_state_open_until_closed() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger()
        await lh.append(b"x")
        assert (await cluster.client().ledger_metadata(lh.id)).state == OPEN
        assert isinstance(lh.metadata.version, int)
        await lh.close()
        assert lh.is_closed



async def test_writer_reads_back_confirmed_entries() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2)
        await lh.append_many([b"a", b"b", b"c"])
        assert [e.data for e in await lh.read(0, 2)] == [b"a", b"b", b"c"]
        with pytest.raises(EntryNotConfirmedError, match="last add confirmed is 2"):
            await lh.read(0, 3)
        await lh.close()


async def test_append_many_checks_items_and_handles_empty() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger()
        assert await lh.append_many([]) == []
        with pytest.raises(TypeError, match="append_many"):
            await lh.append_many([b"ok", 3])  # type: ignore[list-item]
        assert lh.last_add_pushed == -1  # nothing was queued by the bad call
        assert await lh.append_many([b"a"] * 300) == list(range(300))
        await lh.close()
        with pytest.raises(LedgerClosedError):
            await lh.append_many([b"late"])


def test_client_and_config_reject_bad_arguments() -> None:
    from pybk.client import Client
    from pybk.client.context import ClientConfig

    with pytest.raises(ValueError, match="add_timeout"):
        ClientConfig(add_timeout=0)
    with pytest.raises(ValueError, match="speculative_read_delay"):
        ClientConfig(speculative_read_delay=-1)
    with pytest.raises(ValueError, match="recovery_read_batch_size"):
        ClientConfig(recovery_read_batch_size=0)
    with pytest.raises(TypeError, match="metadata must be a URI string or a MetadataStore"):
        Client(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bad metadata URI"):
        Client("nosuchscheme").store  # noqa: B018
