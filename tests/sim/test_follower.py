"""The simulated collectors' metadata replica (pybk.sim.follower): a new ledger is unknown
to it for ``lag`` seconds, and the collector's age guard is what keeps such a ledger's data."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pybk.bookie import Bookie, BookieConfig
from pybk.bookie.gc import GC_IGNORES_MIN_AGE, metadata_liveness
from pybk.errors import NoSuchLedgerError
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.sim.follower import CreationLog, FollowerView
from pybk.storage import MemFileSystem
from pybk.testing.mutations import Mutations
from pybk.wire import AddRequest, DigestManager, ReadRequest, Status, master_key

KEY = master_key(b"pw")
CONFIG = BookieConfig(disk_check_interval=0, checkpoint_interval=0, gc_interval=0,
                      gc_min_ledger_age=1.0)


async def _store(now: list[float]) -> tuple[MemoryMetadataStore, CreationLog]:
    creations = CreationLog(lambda: now[0])

    async def applied(op: str, key: object) -> None:
        creations.applied(op, key)

    return MemoryMetadataStore(after_op=applied), creations


async def test_a_new_ledger_is_unknown_to_the_replica_for_its_lag() -> None:
    now = [100.0]
    store, creations = await _store(now)
    await store.create_ledger(LedgerMetadata(1, 1, 1, 1, {0: ("b1",)}))
    now[0] = 105.0
    await store.create_ledger(LedgerMetadata(2, 1, 1, 1, {0: ("b1",)}))
    view = FollowerView(store.session(), creations, lag=0.5)
    assert await view.list_ledgers() == [1]
    with pytest.raises(NoSuchLedgerError, match="not replicated yet"):
        await view.read_ledger(2)
    assert not await metadata_liveness(view)(2)
    now[0] = 105.5
    assert await view.list_ledgers() == [1, 2]
    assert (await view.read_ledger(2)).ledger_id == 2
    await store.delete_ledger(2)  # a deletion is seen at once
    assert await view.list_ledgers() == [1]


@pytest.mark.parametrize("mutated", [False, True])
async def test_the_age_guard_keeps_a_ledger_the_replica_does_not_list_yet(mutated: bool) -> None:
    now = [0.0]
    store, creations = await _store(now)
    config = dataclasses.replace(
        CONFIG, mutations=Mutations(GC_IGNORES_MIN_AGE) if mutated else Mutations())
    bookie = Bookie("b1", "/d", fs=MemFileSystem(), config=config, cookie_store=store,
                    rng=random.Random(1))
    await bookie.start()
    try:
        assert bookie.gc is not None
        view = FollowerView(store.session(), creations, lag=0.5)
        bookie.gc.is_live, bookie.gc.list_ledgers = metadata_liveness(view), view.list_ledgers
        await store.create_ledger(LedgerMetadata(7, 1, 1, 1, {0: ("b1",)}))
        body = DigestManager(7).frame(0, -1, 0, b"acknowledged")
        assert (await bookie.handle(AddRequest(7, 0, KEY, body))).status == Status.OK
        result = await bookie.gc.run(force=True)  # the replica has not learned of ledger 7
        status = (await bookie.handle(ReadRequest(7, 0))).status
        if mutated:
            assert result.ledgers_removed == [7] and status != Status.OK
        else:
            assert result.ledgers_removed == [] and status == Status.OK
    finally:
        await bookie.stop()
