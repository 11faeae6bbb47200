"""Watches on a metadata backend (part of :data:`pybk.testing.metadata_conformance.CHECKS`):
a ledger, bookie membership or key/value watch fires after a change by another client and by
the store's own client, a cancelled watch never fires, ``sync_watches`` establishes them. The
adversarial section (no settling waits, races with the read) is
:mod:`pybk.testing.watch_conformance`.
"""

from __future__ import annotations

import asyncio

from pybk.metadata.base import IN_RECOVERY, BookieRegistration
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_helpers import sample_metadata, wait_event

__all__ = [
    "check_sync_watches_establishes_every_watch",
    "check_values_watch",
    "check_watch_bookies_fires_on_membership_change",
    "check_watch_ledger_fires_on_change_and_delete",
    "check_watches_fire_for_changes_made_through_the_same_store",
]


async def check_watch_ledger_fires_on_change_and_delete(backend: MetadataBackend) -> None:
    watcher, writer = await backend.open(), await backend.open()
    lid = await writer.allocate_ledger_id()
    md = await writer.create_ledger(sample_metadata(lid))
    seen = await watcher.read_ledger(lid)
    fired: list[int] = []
    event = asyncio.Event()
    cancelled_fired: list[int] = []

    def on_change(ledger_id: int) -> None:
        fired.append(ledger_id)
        event.set()

    watch = watcher.watch_ledger(lid, on_change)
    dead = watcher.watch_ledger(lid, cancelled_fired.append)
    dead.cancel()
    md = await writer.write_ledger(md.with_changes(state=IN_RECOVERY), seen.version)
    await wait_event(event, backend.bound, "ledger watch after a CAS write")
    assert set(fired) == {lid}
    assert (await watcher.read_ledger(lid)).state == IN_RECOVERY
    event.clear()
    await writer.delete_ledger(lid)
    await wait_event(event, backend.bound, "ledger watch after delete")
    watch.cancel()
    assert cancelled_fired == [], "a cancelled watch fired"


async def check_watch_bookies_fires_on_membership_change(backend: MetadataBackend) -> None:
    watcher, bookie = await backend.open(), await backend.open()
    event = asyncio.Event()
    watch = watcher.watch_bookies(event.set)
    await watcher.list_bookies()
    await bookie.register_bookie(BookieRegistration("bk-a", "127.0.0.1:3181"))
    await wait_event(event, backend.bound, "bookie watch after register")
    assert await watcher.writable_bookies() == ["bk-a"]
    event.clear()
    await bookie.register_bookie(BookieRegistration("bk-a", "127.0.0.1:3181", read_only=True))
    await wait_event(event, backend.bound, "bookie watch after flipping to read-only")
    event.clear()
    await bookie.unregister_bookie("bk-a")
    await wait_event(event, backend.bound, "bookie watch after unregister")
    assert await watcher.list_bookies() == []
    watch.cancel()


async def check_values_watch(backend: MetadataBackend) -> None:
    watcher, writer = await backend.open(), await backend.open()
    fired: list[str] = []
    event = asyncio.Event()
    cancelled: list[str] = []

    def on_change(key: str) -> None:
        fired.append(key)
        event.set()

    watch = watcher.watch_value("w/k", on_change)
    dead = watcher.watch_value("w/k", cancelled.append)
    dead.cancel()
    await watcher.list_keys()  # let a polling backend take its baseline
    created = await writer.create_value("w/k", b"1")
    await wait_event(event, backend.bound, "value watch after create")
    event.clear()
    seen = await watcher.read_value("w/k")
    assert seen.version == created.version
    await writer.write_value("w/k", b"2", seen.version)
    await wait_event(event, backend.bound, "value watch after a CAS write")
    assert (await watcher.read_value("w/k")).value == b"2"
    event.clear()
    await writer.delete_value("w/k")
    await wait_event(event, backend.bound, "value watch after delete")
    watch.cancel()
    assert set(fired) == {"w/k"} and cancelled == [], (fired, cancelled)


async def check_watches_fire_for_changes_made_through_the_same_store(
    backend: MetadataBackend,
) -> None:
    store = await backend.open()
    lid = await store.allocate_ledger_id()
    md = await store.create_ledger(sample_metadata(lid))
    await store.create_value("mine", b"0")
    ledger_event, value_event = asyncio.Event(), asyncio.Event()
    lw = store.watch_ledger(lid, lambda _lid: ledger_event.set())
    vw = store.watch_value("mine", lambda _key: value_event.set())
    await store.list_keys()  # let a polling backend take its baseline
    await store.write_ledger(md.with_changes(state=IN_RECOVERY), md.version)
    await store.update_value("mine", lambda cur: b"1")
    await wait_event(ledger_event, backend.bound, "a ledger watch after this store's own write")
    await wait_event(value_event, backend.bound, "a value watch after this store's own write")
    value_event.clear()
    await store.delete_value("mine")
    await wait_event(value_event, backend.bound, "a value watch after this store's own delete")
    lw.cancel()
    vw.cancel()


async def check_sync_watches_establishes_every_watch(backend: MetadataBackend) -> None:
    """Changes made between a read and the watch are reported once ``sync_watches`` returned
    (a baseline taken at the first poll would lose them); a second call has nothing to wait
    for (False), and a store with no watch has nothing either."""
    watcher, writer = await backend.open(), await backend.open()
    assert await watcher.sync_watches() is False, "sync_watches with no watch set"
    lid = await writer.allocate_ledger_id()
    md = await writer.create_ledger(sample_metadata(lid))
    await writer.create_value("sync/k", b"0")
    seen = await watcher.read_ledger(lid)
    await watcher.read_value("sync/k")
    await watcher.list_bookies()
    await writer.write_ledger(md.with_changes(state=IN_RECOVERY), seen.version)
    await writer.update_value("sync/k", lambda cur: b"1")
    ledger_event, value_event, bookies_event = asyncio.Event(), asyncio.Event(), asyncio.Event()
    watches = [watcher.watch_ledger(lid, lambda _lid: ledger_event.set()),
               watcher.watch_value("sync/k", lambda _key: value_event.set()),
               watcher.watch_bookies(bookies_event.set)]
    assert isinstance(await watcher.sync_watches(), bool)
    await wait_event(ledger_event, backend.bound, "a ledger watch after sync_watches")
    await wait_event(value_event, backend.bound, "a value watch after sync_watches")
    assert await watcher.sync_watches() is False, "sync_watches again, every watch established"
    await writer.register_bookie(BookieRegistration("bk-sync", "127.0.0.1:3181"))
    await wait_event(bookies_event, backend.bound, "a bookie watch after sync_watches")
    for w in watches:
        w.cancel()
