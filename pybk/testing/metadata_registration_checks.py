"""Bookie records on a metadata backend (part of :data:`pybk.testing.metadata_conformance.CHECKS`):
registrations (the read-only flag, the rack, gone with a dead owner or a clean close), cookies
and under-replication marks (cleared only as far as the repair saw them).
"""

from __future__ import annotations

from pybk.metadata.base import BookieRegistration
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_helpers import raises, wait_until

__all__ = [
    "check_clean_close_unregisters",
    "check_cookies",
    "check_read_only_flag",
    "check_registration_carries_its_rack",
    "check_registration_vanishes_with_its_owner",
    "check_under_replication_marks",
    "check_under_replication_marks_clear_only_what_was_repaired",
]


async def check_read_only_flag(backend: MetadataBackend) -> None:
    store, reader = await backend.open(), await backend.open()
    await store.register_bookie(BookieRegistration("bk-2", "10.0.0.2:3181"))
    await store.register_bookie(BookieRegistration("bk-1", "10.0.0.1:3181"))
    assert await reader.writable_bookies() == ["bk-1", "bk-2"]
    assert await reader.read_only_bookies() == []
    await store.register_bookie(BookieRegistration("bk-2", "10.0.0.2:3181", read_only=True))
    assert await reader.writable_bookies() == ["bk-1"]
    assert await reader.read_only_bookies() == ["bk-2"]
    assert await reader.list_bookies() == [
        BookieRegistration("bk-1", "10.0.0.1:3181"),
        BookieRegistration("bk-2", "10.0.0.2:3181", read_only=True),
    ]
    await store.register_bookie(BookieRegistration("bk-2", "10.0.0.2:3181"))
    assert await reader.writable_bookies() == ["bk-1", "bk-2"]
    await store.unregister_bookie("bk-1")
    await store.unregister_bookie("bk-never")  # unknown id: nothing to do
    assert await reader.writable_bookies() == ["bk-2"]


async def check_registration_vanishes_with_its_owner(backend: MetadataBackend) -> None:
    observer, doomed, survivor = await backend.open(), await backend.open(), await backend.open()
    await doomed.register_bookie(BookieRegistration("bk-doomed", "h:1"))
    await survivor.register_bookie(BookieRegistration("bk-alive", "h:2"))
    assert await observer.writable_bookies() == ["bk-alive", "bk-doomed"]
    await backend.kill_owner(doomed)

    async def gone() -> bool:
        return await observer.writable_bookies() == ["bk-alive"]

    await wait_until(gone, backend.bound, "the dead owner's registration to disappear")
    # and the live one stays (its heartbeat/session keeps it)
    assert await observer.writable_bookies() == ["bk-alive"]


async def check_clean_close_unregisters(backend: MetadataBackend) -> None:
    observer, bookie = await backend.open(), await backend.open()
    await bookie.register_bookie(BookieRegistration("bk-x", "h:1"))
    assert await observer.writable_bookies() == ["bk-x"]
    await bookie.close()
    assert await observer.writable_bookies() == []


async def check_cookies(backend: MetadataBackend) -> None:
    store, other = await backend.open(), await backend.open()
    assert await store.read_cookie("bk-1") is None
    await store.write_cookie("bk-1", b"cookie-v1\x00")
    assert await other.read_cookie("bk-1") == b"cookie-v1\x00"
    await other.write_cookie("bk-1", b"cookie-v2")
    assert await store.read_cookie("bk-1") == b"cookie-v2"
    assert await store.read_cookie("bk-2") is None
    await store.delete_cookie("bk-1")
    assert await other.read_cookie("bk-1") is None
    await store.delete_cookie("bk-1")  # idempotent


async def check_under_replication_marks(backend: MetadataBackend) -> None:
    store, other = await backend.open(), await backend.open()
    assert await store.list_under_replicated() == {}
    await store.mark_under_replicated(12, ["bk-3"])
    await other.mark_under_replicated(12, ["bk-1", "bk-3"])
    await other.mark_under_replicated(5, ["bk-2"])
    assert await store.list_under_replicated() == {5: ["bk-2"], 12: ["bk-1", "bk-3"]}
    await store.clear_under_replicated(12)
    await store.clear_under_replicated(99)  # no mark: nothing to do
    assert await other.list_under_replicated() == {5: ["bk-2"]}


async def check_under_replication_marks_clear_only_what_was_repaired(
    backend: MetadataBackend,
) -> None:
    """A worker clears the mark it repaired; a mark widened meanwhile stays."""
    worker, auditor = await backend.open(), await backend.open()
    await auditor.mark_under_replicated(7, ["bk-1"])
    seen = (await worker.list_under_replicated())[7]
    await auditor.mark_under_replicated(7, ["bk-2"])  # widened after the worker looked
    assert await worker.clear_under_replicated(7, expected=seen) is False
    assert await auditor.list_under_replicated() == {7: ["bk-1", "bk-2"]}
    assert await worker.clear_under_replicated(7, expected=["bk-2", "bk-1"]) is True
    assert await auditor.list_under_replicated() == {}
    assert await worker.clear_under_replicated(7, expected=["bk-1"]) is False
    assert await worker.clear_under_replicated(7) is False
    await auditor.mark_under_replicated(8, ["bk-3"])
    assert await worker.clear_under_replicated(8) is True


async def check_registration_carries_its_rack(backend: MetadataBackend) -> None:
    store, reader = await backend.open(), await backend.open()
    await store.register_bookie(BookieRegistration("bk-1", "h:1", rack="/eu/rack-1"))
    await store.register_bookie(BookieRegistration("bk-2", "h:2"))
    assert await reader.list_bookies() == [
        BookieRegistration("bk-1", "h:1", rack="/eu/rack-1"),
        BookieRegistration("bk-2", "h:2", rack=""),
    ]
    await store.register_bookie(BookieRegistration("bk-1", "h:1", True, "/eu/rack-2"))
    assert (await reader.list_bookies())[0] == BookieRegistration("bk-1", "h:1", True,
                                                                  "/eu/rack-2")
    for bad in ("rack-1", "/eu//r", "/eu/"):
        await raises(ValueError, lambda bad=bad: store.register_bookie(  # type: ignore[misc]
            BookieRegistration("bk-3", "h:3", rack=bad)), f"rack {bad!r}")
