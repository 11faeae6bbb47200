"""Ensemble changes on bookie failure (BookKeeper's HandleFailuresTest, against real bookies).

The metadata store's ``before_op`` hook (:class:`MetaGate`) holds the ensemble-change CAS
so each interleaving is pinned down; the transport hooks fail or hold adds per bookie.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from pybk.client.context import ClientConfig
from pybk.client.writer import LedgerHandle
from pybk.errors import (
    LedgerClosedError,
    LedgerFencedError,
    MetadataStoreError,
    NotEnoughBookiesError,
)
from pybk.metadata.base import CLOSED, IN_RECOVERY
from pybk.metadata.memory import MemoryMetadataStore
from pybk.wire import ListEntriesRequest, ListEntriesResponse, Op, Status

from .conftest import MetaGate, mem_cluster, until


@asynccontextmanager
async def gated(spares: int = 1, config: ClientConfig | None = None) -> AsyncIterator[
    tuple[object, MetaGate, MemoryMetadataStore]
]:
    gate = MetaGate()
    store = MemoryMetadataStore(before_op=gate)
    kwargs = {} if config is None else {"client_config": config}
    async with mem_cluster(["b1", "b2", "b3"], metadata=store, **kwargs) as cluster:
        yield cluster, gate, store
        await store.close()


async def new_ledger(cluster: object, e: int, w: int, a: int, spares: list[str]) -> LedgerHandle:
    lh: LedgerHandle = await cluster.client().create_ledger(e, w, a)  # type: ignore[attr-defined]
    for s in spares:
        await cluster.add_bookie(s)  # type: ignore[attr-defined]
    return lh


async def entries_on(cluster: object, bookie: str, ledger_id: int) -> tuple[tuple[int, int], ...]:
    resp = await cluster.transport.send(bookie, ListEntriesRequest(ledger_id), 5)  # type: ignore[attr-defined]
    assert isinstance(resp, ListEntriesResponse)
    return resp.ranges if resp.status == Status.OK else ()


async def entries_reach(cluster: object, bookie: str, ledger_id: int,
                        want: tuple[tuple[int, int], ...]) -> None:
    """Wait (bounded) until ``bookie`` holds exactly ``want``: an add beyond the ack quorum
    may land after the writer was answered (a bookie first checks a new ledger against the
    metadata, and its tenancy gate looks the ledger's namespace up)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while (got := await entries_on(cluster, bookie, ledger_id)) != want:
        assert loop.time() < deadline, got
        await asyncio.sleep(0.005)


async def stored(store: MemoryMetadataStore, ledger_id: int) -> dict[int, tuple[str, ...]]:
    return dict((await store.read_ledger(ledger_id)).ensembles)


async def test_one_failure_nothing_confirmed_replaces_in_place() -> None:
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        cluster.transport.hooks.fail(b[1], op=Op.ADD, times=1)
        assert await lh.append(b"e0") == 0
        assert await stored(store, lh.id) == {0: (b[0], "b4", b[2])}
        assert gate.writes == 1  # exactly one metadata update for one failure
        await entries_reach(cluster, "b4", lh.id, ((0, 0),))  # resent to the new bookie
        lh._check()
        await lh.close()


async def test_one_failure_after_one_entry_adds_fragment() -> None:
    async with gated() as (cluster, _gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        await lh.append(b"e0")
        cluster.transport.hooks.fail(b[0], op=Op.ADD, entry_id=1)
        assert await lh.append(b"e1") == 1
        assert await stored(store, lh.id) == {0: b, 1: ("b4", b[1], b[2])}
        await lh.close()
        rh = await cluster.client().open_ledger(lh.id, recovery=False)
        assert [e.data for e in await rh.read(0, 1)] == [b"e0", b"e1"]


async def test_second_failure_while_first_is_handled() -> None:
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4", "b5"])
        b = lh.metadata.ensembles[0]
        gate.close()
        cluster.transport.hooks.fail(b[1], op=Op.ADD, times=1)
        hold2 = cluster.transport.hooks.hold(b[2], op=Op.ADD, times=1)
        fut = lh.append(b"e0")
        await until(lambda: gate.waiting == 1)
        await hold2.wait_held(1)
        hold2.fail_held(Status.IO_ERROR)  # b[2] fails while the first change is in flight
        await until(lambda: 2 in lh._pipeline.core.failed or not lh._pipeline.core.failed)
        assert not fut.done()
        gate.open()
        assert await fut == 0
        ens = await stored(store, lh.id)
        assert list(ens) == [0]
        assert ens[0][0] == b[0] and sorted(ens[0][1:]) == ["b4", "b5"]
        assert gate.writes == 2
        await lh.close()


async def test_no_adds_complete_while_change_in_progress() -> None:
    """R3: the add reaches Qa on surviving bookies but is not acknowledged until the new
    ensemble is durable in the metadata store."""
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        gate.close()
        cluster.transport.hooks.fail(b[2], op=Op.ADD, times=1)
        fut = lh.append(b"e0")
        await until(lambda: gate.waiting == 1)
        await until(lambda: lh._pipeline.core.pending > 0 and lh._pipeline.core.has_quorum(0))
        await asyncio.sleep(0)
        assert not fut.done() and lh.last_add_confirmed == -1
        gate.open()
        assert await fut == 0
        assert await stored(store, lh.id) == {0: (b[0], b[1], "b4")}
        await lh.close()


async def test_failure_of_bookie_not_in_write_set_is_not_resent() -> None:
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 2, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        await lh.append(b"e0")
        hold1 = cluster.transport.hooks.hold(op=Op.ADD, entry_id=1)  # write set {b1, b2}
        f1 = lh.append(b"e1")
        await hold1.wait_held(2)
        cluster.transport.hooks.fail(b[0], op=Op.ADD, entry_id=2)  # write set {b2, b0}
        f2 = lh.append(b"e2")
        await until(lambda: gate.writes == 1 and not lh._pipeline.changing)
        assert await stored(store, lh.id) == {0: b, 1: ("b4", b[1], b[2])}
        hold1.remove()
        assert (await f1, await f2) == (1, 2)
        assert await entries_on(cluster, "b4", lh.id) == ((2, 2),)  # e1 was not resent
        await lh.close()


async def test_not_enough_bookies_fails_pending_adds() -> None:
    async with gated() as (cluster, _gate, store):
        lh = await new_ledger(cluster, 3, 3, 3, ["b4"])
        b = lh.metadata.ensembles[0]
        await lh.append(b"e0")
        cluster.transport.hooks.unavailable(b[1], op=Op.ADD)
        cluster.transport.hooks.unavailable(b[2], op=Op.ADD)
        futs = [lh.append(b"x"), lh.append(b"y")]
        for f in futs:
            with pytest.raises(NotEnoughBookiesError) as info:
                await f
            # the error names what made the change necessary, not only "no spare bookie"
            assert "replacing failed bookies" in str(info.value)
            assert b[1] in str(info.value) and "BookieUnavailableError" in str(info.value)
        with pytest.raises(NotEnoughBookiesError):
            lh.append(b"z")
        assert lh.last_add_confirmed == 0
        await lh.close()  # closes at the last confirmed entry
        md = await store.read_ledger(lh.id)
        assert (md.state, md.last_entry_id) == (CLOSED, 0)


async def test_metadata_closed_during_change() -> None:
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        gate.close()
        cluster.transport.hooks.fail(b[1], op=Op.ADD, times=1)
        fut = lh.append(b"e0")
        await until(lambda: gate.waiting == 1)
        store.before_op = None
        md = await store.read_ledger(lh.id)
        await store.write_ledger(md.with_changes(state=CLOSED), md.version)
        gate.open()
        with pytest.raises(LedgerClosedError, match="closed by another client"):
            await fut
        with pytest.raises(LedgerClosedError):
            lh.append(b"late")
        assert await stored(store, lh.id) == {0: b}  # the change was not applied
        await lh.close()


async def test_metadata_in_recovery_during_change() -> None:
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        gate.close()
        cluster.transport.hooks.fail(b[1], op=Op.ADD, times=1)
        fut = lh.append(b"e0")
        await until(lambda: gate.waiting == 1)
        store.before_op = None
        md = await store.read_ledger(lh.id)
        await store.write_ledger(md.with_changes(state=IN_RECOVERY), md.version)
        gate.open()
        with pytest.raises(LedgerFencedError, match="being recovered"):
            await fut
        await lh.close()  # fenced handle: local close only
        assert (await store.read_ledger(lh.id)).state == IN_RECOVERY


async def test_client_closes_while_change_in_progress() -> None:
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        gate.close()
        cluster.transport.hooks.fail(b[1], op=Op.ADD, times=1)
        fut = lh.append(b"e0")
        await until(lambda: gate.waiting == 1)
        closing = asyncio.ensure_future(lh.close())
        await asyncio.sleep(0)
        assert not closing.done()
        gate.open()
        await closing
        assert await fut == 0
        md = await store.read_ledger(lh.id)
        assert (md.state, md.last_entry_id, dict(md.ensembles)) == (
            CLOSED, 0, {0: (b[0], "b4", b[2])}
        )


async def test_metadata_store_failure_fails_adds() -> None:
    async with gated() as (cluster, gate, _store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]

        def boom() -> None:
            raise MetadataStoreError("store down")

        gate.on_write = boom
        cluster.transport.hooks.fail(b[1], op=Op.ADD, times=1)
        with pytest.raises(MetadataStoreError, match="store down"):
            await lh.append(b"e0")
        gate.on_write = None


async def test_timeout_triggers_change() -> None:
    config = ClientConfig(add_timeout=0.2, read_timeout=2.0, speculative_read_delay=0)
    async with gated(config=config) as (cluster, _gate, store):
        lh = await new_ledger(cluster, 3, 2, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        cluster.transport.hooks.drop(b[1], op=Op.ADD)  # b1 never answers: the add times out
        assert await lh.append(b"e0") == 0
        assert await stored(store, lh.id) == {0: (b[0], "b4", b[2])}
        await lh.close()



async def test_ensemble_change_retries_on_cas_conflict() -> None:
    async with gated() as (cluster, gate, store):
        lh = await new_ledger(cluster, 3, 3, 2, ["b4"])
        b = lh.metadata.ensembles[0]
        bumps = 0

        def bump() -> object:
            async def go() -> None:
                nonlocal bumps
                if bumps >= 2:
                    return
                bumps += 1
                gate.on_write = None
                md = await store.read_ledger(lh.id)
                await store.write_ledger(
                    md.with_changes(custom_metadata={"bump": b"%d" % bumps}), md.version
                )
                gate.on_write = bump

            return go()

        gate.on_write = bump
        cluster.transport.hooks.fail(b[1], op=Op.ADD, times=1)
        assert await lh.append(b"e0") == 0
        gate.on_write = None
        md = await store.read_ledger(lh.id)
        assert bumps == 2
        assert dict(md.ensembles) == {0: (b[0], "b4", b[2])}
        assert md.custom_metadata == {"bump": b"2"}  # the other update survived
        await lh.close()
