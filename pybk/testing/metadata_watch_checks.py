"""Watches on a metadata backend (part of :data:`pybk.testing.metadata_conformance.CHECKS`):
a ledger, bookie membership or key/value watch fires after a change by another client and by
the store's own client, a cancelled watch never fires. The adversarial section (no settling
waits, races with the read) is :mod:`pybk.testing.watch_conformance`.
"""

from __future__ import annotations

import asyncio

from pybk.metadata.base import IN_RECOVERY, BookieRegistration
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_helpers import sample_metadata, wait_event

__all__ = [
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
