"""A bookie's identity (rule R4: the cookie in its data directory and in the metadata) and
life cycle: refused starts, restarts of the same object, state callbacks, the checkpoint
timer."""

from __future__ import annotations

import asyncio
import random

import pytest

from pybk.bookie import Bookie, BookieConfig
from pybk.errors import BookieStateError
from pybk.metadata import open_store
from pybk.storage import MemFileSystem
from pybk.wire import AddRequest, DigestManager, Status, master_key

# --------------------------------------------------------------------------- identity (R4)


async def test_cookie_emptied_directory_is_refused(harness_cls):
    store = open_store("memory://")
    h = harness_cls(cookie_store=store)
    await h.start()
    await h.add(1, 0)
    await h.bookie.stop()
    h.fs = MemFileSystem()  # the disk was replaced by an empty one
    with pytest.raises(BookieStateError, match="emptied"):
        await h.start()


async def test_cookie_swapped_directory_is_refused(harness_cls):
    store = open_store("memory://")
    a = harness_cls(cookie_store=store, seed=1)
    await a.start()
    await a.bookie.stop()
    await store.delete_cookie("b1")
    b = harness_cls(cookie_store=store, seed=2)  # a fresh bookie b1 registers anew
    await b.start()
    await b.bookie.stop()
    a.cookie_store = store  # the old disk comes back under the same identity
    with pytest.raises(BookieStateError, match="swapped"):
        await a.start()


async def test_cookie_of_another_bookie_is_refused(harness_cls):
    h = harness_cls()
    await h.start()
    await h.bookie.stop()
    h.bookie_id = "b2"
    with pytest.raises(BookieStateError, match="belongs to bookie"):
        await h.start()


async def test_a_bookie_refuses_metadata_that_does_not_know_it(harness_cls):
    """Issue 34, item 10: the metadata database was lost and made anew; the bookie whose
    cookie names the old cluster used to adopt its old data silently (and new ledgers then
    collided with old ids). It refuses, naming the cluster it belongs to."""
    from pybk.bookie.cookie import CLUSTER_KEY
    from pybk.metadata.base import LedgerMetadata

    old = open_store("memory://")
    await old.create_ledger(LedgerMetadata(1, 1, 1, 1, {0: ("b1",)}))
    h = harness_cls(cookie_store=old)
    await h.start()
    assert await h.add(1, 0) == Status.OK
    await h.bookie.stop()
    cluster = (await old.read_value(CLUSTER_KEY)).value.decode()
    h.cookie_store = open_store("memory://")  # the metadata, lost and made anew
    with pytest.raises(BookieStateError, match=f"(belongs to|of) cluster {cluster}"):
        await h.start()
    h.cookie_store = old  # with its own metadata it starts, its data intact
    await h.start()
    assert await h.read(1, 0) == (Status.OK, h.frame(1, 0))


async def test_a_cookie_from_before_cluster_ids_learns_its_cluster_or_is_refused(harness_cls):
    from pybk.bookie.cookie import decode_cookie, encode_cookie

    store = open_store("memory://")
    h = harness_cls(cookie_store=store)
    await h.start()
    iid = h.bookie.instance_id
    await h.bookie.stop()
    legacy = encode_cookie("b1", iid)  # no cluster: an older pybk's cookie
    await h.fs.write_file_atomic(h.DATA_DIR + "/COOKIE", legacy)
    await store.write_cookie("b1", legacy)
    await h.start()  # known to its metadata: it learns the cluster id
    await h.bookie.stop()
    assert decode_cookie(h.fs.read_file(h.DATA_DIR + "/COOKIE"), "x")["cluster"]
    await h.fs.write_file_atomic(h.DATA_DIR + "/COOKIE", legacy)
    h.cookie_store = open_store("memory://")  # lost metadata, legacy cookie: refused
    with pytest.raises(BookieStateError, match="has no cookie for this bookie"):
        await h.start()


async def test_damaged_cookie_is_refused_clearly(harness_cls):
    h = harness_cls()
    await h.start()
    await h.add(1, 0)
    await h.bookie.stop()
    h.fs.flip_bit(h.DATA_DIR + "/COOKIE", 40)
    with pytest.raises(BookieStateError, match="damaged cookie"):
        await h.start()
    h.fs.flip_bit(h.DATA_DIR + "/COOKIE", 40)
    await h.start()
    assert await h.read(1, 0) == (Status.OK, h.frame(1, 0))


async def test_restart_keeps_instance_id(harness):
    iid = harness.bookie.instance_id
    assert len(iid) == 36
    b = await harness.crash_restart()
    assert b.instance_id == iid


# --------------------------------------------------------------------------- life cycle


async def test_same_object_restarts_and_state_callbacks_fire(harness):
    bookie = harness.bookie
    seen: list[str] = []
    bookie.on_state_change = seen.append
    await harness.add(1, 0)
    await bookie.stop()
    with pytest.raises(BookieStateError):
        bookie._store()  # stopped: no storage to serve from
    await bookie.start()
    with pytest.raises(BookieStateError, match="already started"):
        await bookie.start()
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))
    assert seen == ["stopped", "writable"]


async def test_checkpoint_timer_covers_new_writes():
    fs = MemFileSystem()
    bookie = Bookie("b1", "/d", fs=fs, rng=random.Random(1),
                    config=BookieConfig(disk_check_interval=0, checkpoint_interval=0.001))
    await bookie.start()
    dm = DigestManager(1)
    for e in range(3):
        resp = await bookie.handle(AddRequest(1, e, master_key(b""), dm.frame(e, e - 1, 0, b"x")))
        assert resp.status == Status.OK
    store = bookie.store
    for _ in range(2000):
        if store._cp_pos == store.journal.position:
            break
        await asyncio.sleep(0.001)
    assert store._cp_pos == store.journal.position
    bookie.crash()
    fs.crash("drop")
    bookie = Bookie("b1", "/d", fs=fs, rng=random.Random(1),
                    config=BookieConfig(disk_check_interval=0, checkpoint_interval=0))
    await bookie.start()
    assert bookie.store.report.checkpoint_loaded and bookie.store.report.records_replayed == 0
    await bookie.stop()
