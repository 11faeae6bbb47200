"""A conformance suite any :class:`~pybk.metadata.base.MetadataStore` implementation can run.

In the spirit of ``trio.testing.check_two_way_stream``: you describe how to reach your backend
with a :class:`MetadataBackend` (open another client on the same store, make a client's owner
vanish, damage stored bytes), and :func:`run_check` / :func:`run_all` exercise the contract:
CAS conflicts, the update loop under concurrent updaters, unique ids under concurrency,
watches, ephemeral registrations, read-only flag, cookies, under-replication marks, the
serialization round trip including corrupt bytes, and the key/value namespace (create, CAS,
delete, versions never reused, listing by prefix, watches, the update loop).

Typical pytest use::

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
    async def test_conformance(check, my_backend):
        await check(my_backend)

Each check is independent and expects a backend whose store starts empty.
"""

from __future__ import annotations

import abc
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pybk.errors import (
    CorruptRecordError,
    KeyExistsError,
    LedgerExistsError,
    MetadataVersionError,
    NoSuchKeyError,
    NoSuchLedgerError,
)
from pybk.metadata.base import (
    CLOSED,
    IN_RECOVERY,
    MAX_VALUE_SIZE,
    BookieRegistration,
    LedgerMetadata,
    MetadataStore,
)
from pybk.testing.tenancy_conformance import TENANCY_CHECKS

__all__ = [
    "CHECKS",
    "DEFAULT_BOUND",
    "MemoryBackend",
    "MetadataBackend",
    "SqliteBackend",
    "ZooKeeperBackend",
    "check_bad_arguments_are_value_errors",
    "check_cas_conflict",
    "check_clean_close_unregisters",
    "check_cookies",
    "check_corrupt_metadata_is_an_error",
    "check_create_read_round_trip",
    "check_create_records_the_creation_time",
    "check_delete_and_list",
    "check_id_allocation_unique_under_concurrency",
    "check_read_only_flag",
    "check_registration_vanishes_with_its_owner",
    "check_under_replication_marks",
    "check_update_loop_under_concurrent_updaters",
    "check_values_bad_arguments",
    "check_values_create_read_cas",
    "check_values_list_by_prefix",
    "check_values_update_loop_under_concurrent_updaters",
    "check_values_watch",
    "check_watch_bookies_fires_on_membership_change",
    "check_watch_ledger_fires_on_change_and_delete",
    "check_watches_fire_for_changes_made_through_the_same_store",
    "conformance_test",
    "run_all",
    "run_check",
    "sample_metadata",
    "wait_until",
]

#: How long a check waits for something asynchronous (watch callbacks, lease expiry).
DEFAULT_BOUND = 10.0


class MetadataBackend(abc.ABC):
    """What the suite needs to know about one backend (one shared store, many clients)."""

    #: Seconds within which watches must fire and a dead owner's registration must vanish.
    bound: float = DEFAULT_BOUND

    @abc.abstractmethod
    async def open(self) -> MetadataStore:
        """A new client (its own session/owner) of the one store under test."""

    @abc.abstractmethod
    async def kill_owner(self, store: MetadataStore) -> None:
        """Make ``store``'s owner disappear without a clean unregister (crash, lost session).
        The suite does not use ``store`` afterwards."""

    @abc.abstractmethod
    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        """Overwrite the stored bytes of a ledger's metadata."""

    async def check_invariants(self) -> None:  # noqa: B027 - optional hook
        """Assert the backend's internal invariants (called after each check)."""

    async def cleanup(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend holds (called once after a check)."""


# -- backends shipped with pybk ---------------------------------------------------------------


class MemoryBackend(MetadataBackend):
    """``memory://``: clients are sessions of one shared state. ``watch_delivery``: a
    :class:`~pybk.metadata.memory_watches.PolledDelivery` makes watches poll."""

    bound = 2.0

    def __init__(self, watch_delivery: object = None) -> None:
        from pybk.metadata.memory import MemoryMetadataStore
        from pybk.metadata.memory_watches import PolledDelivery

        assert watch_delivery is None or isinstance(watch_delivery, PolledDelivery)
        self._root = MemoryMetadataStore(watch_delivery=watch_delivery)
        self._opened: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        store = self._root.session()
        self._opened.append(store)
        return store

    async def check_invariants(self) -> None:
        self._root._check()

    async def kill_owner(self, store: MetadataStore) -> None:
        from pybk.metadata.memory import MemoryMetadataStore

        assert isinstance(store, MemoryMetadataStore)
        store.expire_session()
        await store.close()  # the owner is gone for good: nothing campaigns for it again

    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        self._root.corrupt_ledger(ledger_id, data)

    async def cleanup(self) -> None:
        for s in self._opened:
            await s.close()


class SqliteBackend(MetadataBackend):
    """``sqlite:///``: clients are separate connections to one file, short leases."""

    def __init__(self, path: str | None = None, *, ttl: float = 1.0) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="pybk-meta-")
            path = str(Path(self._tmp.name) / "metadata.db")
        self.path = path
        self.ttl = ttl
        self.bound = ttl * 5 + 2.0
        self._opened: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        from pybk.metadata.sqlite import SqliteMetadataStore

        store = SqliteMetadataStore(
            self.path, ttl=self.ttl, heartbeat_interval=self.ttl / 5, poll_interval=0.02
        )
        self._opened.append(store)
        return store

    async def kill_owner(self, store: MetadataStore) -> None:
        from pybk.metadata.sqlite import SqliteMetadataStore

        assert isinstance(store, SqliteMetadataStore)
        await store.crash()

    async def check_invariants(self) -> None:
        from pybk.metadata.sqlite import SqliteMetadataStore

        checker = SqliteMetadataStore(self.path)
        try:
            await checker.check_invariants()
        finally:
            await checker.close()

    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        from pybk.metadata.sqlite import SqliteMetadataStore

        assert isinstance(store, SqliteMetadataStore)
        await store.corrupt_ledger(ledger_id, data)

    async def cleanup(self) -> None:
        for s in self._opened:
            await s.close()
        if self._tmp is not None:
            self._tmp.cleanup()


# -- helpers -----------------------------------------------------------------------------------


def sample_metadata(ledger_id: int, **changes: object) -> LedgerMetadata:
    """Metadata with every field set to something non-default."""
    md = LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles={0: ("bk-1", "bk-2", "bk-3"), 17: ("bk-1", "bk-4", "bk-3")},
        digest_type="MAC",
        password_hash=b"\x00\xffsecret-hash",
        custom_metadata={"app": b"\x01\x02", "name": b"ledger"},
        ctime_ms=1_700_000_000_123,
        master_key=bytes(range(32)),
        mac_key=bytes(range(32, 64)),
    )
    return md.with_changes(**changes) if changes else md


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], bound: float, what: str
) -> None:
    """Poll ``predicate`` until it holds; AssertionError naming ``what`` after ``bound`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {bound}s waiting for {what}")
        await asyncio.sleep(0.01)


async def _wait_event(event: asyncio.Event, bound: float, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), bound)
    except TimeoutError:
        raise AssertionError(f"timed out after {bound}s waiting for {what}") from None


def _same(a: LedgerMetadata, b: LedgerMetadata) -> bool:
    return a.with_changes(version=-1) == b.with_changes(version=-1)


# -- the checks ----------------------------------------------------------------------------------


async def check_create_read_round_trip(backend: MetadataBackend) -> None:
    store = await backend.open()
    lid = await store.allocate_ledger_id()
    md = sample_metadata(lid)
    created = await store.create_ledger(md)
    assert created.version >= 0, created.version
    read = await store.read_ledger(lid)
    assert _same(read, md), (read, md)
    assert read.version == created.version
    other = await backend.open()
    assert _same(await other.read_ledger(lid), md)
    try:
        await other.create_ledger(sample_metadata(lid, length=5))
    except LedgerExistsError:
        pass
    else:
        raise AssertionError("creating an existing ledger did not raise LedgerExistsError")
    assert (await store.read_ledger(lid)).length == 0
    try:
        await store.read_ledger(lid + 1_000_000)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("reading a missing ledger did not raise NoSuchLedgerError")


async def check_create_records_the_creation_time(backend: MetadataBackend) -> None:
    """A ledger created without a creation time gets the store's wall clock at creation (a
    given one is kept: :func:`check_create_read_round_trip`)."""
    store = await backend.open()
    lid = await store.allocate_ledger_id()
    before = int(time.time() * 1000)
    created = await store.create_ledger(sample_metadata(lid, ctime_ms=0))
    after = int(time.time() * 1000)
    assert before - 1000 <= created.ctime_ms <= after + 1000, (before, created.ctime_ms, after)
    assert (await store.read_ledger(lid)).ctime_ms == created.ctime_ms
    updated = await store.update_ledger(lid, lambda md: md.with_changes(length=7))
    assert updated.ctime_ms == created.ctime_ms  # (an update keeps it)


async def check_cas_conflict(backend: MetadataBackend) -> None:
    a, b = await backend.open(), await backend.open()
    lid = await a.allocate_ledger_id()
    v0 = await a.create_ledger(sample_metadata(lid))
    v1 = await b.write_ledger(v0.with_changes(state=IN_RECOVERY), v0.version)
    assert v1.version != v0.version
    try:
        await a.write_ledger(v0.with_changes(state=CLOSED, last_entry_id=9), v0.version)
    except MetadataVersionError:
        pass
    else:
        raise AssertionError("a CAS with a stale version did not raise MetadataVersionError")
    for never_stored in (-1, -7):  # "never stored" is never the current version
        try:
            await a.write_ledger(v0.with_changes(length=3), never_stored)
        except MetadataVersionError:
            pass
        else:
            raise AssertionError(f"a CAS with version {never_stored} was accepted")
        try:
            await a.delete_ledger(lid, expected_version=never_stored)
        except MetadataVersionError:
            pass
        else:
            raise AssertionError(f"a delete with version {never_stored} was accepted")
    now = await a.read_ledger(lid)
    assert now.state == IN_RECOVERY and now.version == v1.version, now
    v2 = await a.write_ledger(now.with_changes(state=CLOSED, last_entry_id=9), now.version)
    assert (await b.read_ledger(lid)).version == v2.version
    try:
        await a.write_ledger(sample_metadata(lid + 1_000_000), 0)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("a CAS on a missing ledger did not raise NoSuchLedgerError")


async def check_update_loop_under_concurrent_updaters(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    lid = await stores[0].allocate_ledger_id()
    await stores[0].create_ledger(sample_metadata(lid))
    per_store, updaters = 5, 4

    async def bump(store: MetadataStore, amount: int) -> None:
        for _ in range(per_store):
            await store.update_ledger(lid, lambda m: m.with_changes(length=m.length + amount))

    await asyncio.gather(*(bump(s, i + 1) for s in stores for i in range(updaters)))
    final = await stores[1].read_ledger(lid)
    expected = len(stores) * per_store * sum(range(1, updaters + 1))
    assert final.length == expected, (final.length, expected)
    same = await stores[2].update_ledger(lid, lambda m: None)
    assert same.version == final.version and same.length == expected
    try:
        await stores[0].update_ledger(lid + 1_000_000, lambda m: m)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("update_ledger on a missing ledger did not raise")


async def check_delete_and_list(backend: MetadataBackend) -> None:
    store = await backend.open()
    ids = [await store.allocate_ledger_id() for _ in range(4)]
    created = {lid: await store.create_ledger(sample_metadata(lid)) for lid in reversed(ids)}
    assert await store.list_ledgers() == sorted(ids)
    victim = ids[1]
    old = created[victim]
    updated = await store.write_ledger(old.with_changes(length=1), old.version)
    try:
        await store.delete_ledger(victim, expected_version=created[victim].version)
    except MetadataVersionError:
        pass
    else:
        raise AssertionError("delete with a stale version did not raise MetadataVersionError")
    await store.delete_ledger(victim, expected_version=updated.version)
    await store.delete_ledger(ids[2])
    assert await store.list_ledgers() == sorted([ids[0], ids[3]])
    for gone in (victim, ids[2]):
        try:
            await store.read_ledger(gone)
        except NoSuchLedgerError:
            pass
        else:
            raise AssertionError(f"deleted ledger {gone} still readable")
    try:
        await store.delete_ledger(victim)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("deleting a missing ledger did not raise NoSuchLedgerError")


async def check_id_allocation_unique_under_concurrency(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    per_store = 40
    results = await asyncio.gather(
        *(s.allocate_ledger_id() for s in stores for _ in range(per_store))
    )
    assert len(set(results)) == len(results), sorted(results)
    assert all(isinstance(i, int) and i >= 0 for i in results)
    # ids handed out are usable and never collide with a created ledger
    await stores[0].create_ledger(sample_metadata(results[0]))
    more = [await stores[1].allocate_ledger_id() for _ in range(5)]
    assert not set(more) & set(results)


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
    await _wait_event(event, backend.bound, "ledger watch after a CAS write")
    assert set(fired) == {lid}
    assert (await watcher.read_ledger(lid)).state == IN_RECOVERY
    event.clear()
    await writer.delete_ledger(lid)
    await _wait_event(event, backend.bound, "ledger watch after delete")
    watch.cancel()
    assert cancelled_fired == [], "a cancelled watch fired"


async def check_watch_bookies_fires_on_membership_change(backend: MetadataBackend) -> None:
    watcher, bookie = await backend.open(), await backend.open()
    event = asyncio.Event()
    watch = watcher.watch_bookies(event.set)
    await watcher.list_bookies()
    await bookie.register_bookie(BookieRegistration("bk-a", "127.0.0.1:3181"))
    await _wait_event(event, backend.bound, "bookie watch after register")
    assert await watcher.writable_bookies() == ["bk-a"]
    event.clear()
    await bookie.register_bookie(BookieRegistration("bk-a", "127.0.0.1:3181", read_only=True))
    await _wait_event(event, backend.bound, "bookie watch after flipping to read-only")
    event.clear()
    await bookie.unregister_bookie("bk-a")
    await _wait_event(event, backend.bound, "bookie watch after unregister")
    assert await watcher.list_bookies() == []
    watch.cancel()


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
        await _raises(ValueError, lambda bad=bad: store.register_bookie(  # type: ignore[misc]
            BookieRegistration("bk-3", "h:3", rack=bad)), f"rack {bad!r}")


# -- locks and elections -----------------------------------------------------------------------


async def check_locks_are_exclusive_and_released(backend: MetadataBackend) -> None:
    a, b = await backend.open(), await backend.open()
    fired = asyncio.Event()
    watch = b.watch_lock("replication/ledger-1", lambda _n: fired.set())
    assert await b.lock_owner("replication/ledger-1") is None
    assert await a.try_lock("replication/ledger-1", "worker-a")
    assert a.holds_lock("replication/ledger-1") and not b.holds_lock("replication/ledger-1")
    assert await a.try_lock("replication/ledger-1", "worker-a")  # again: still ours
    await _wait_event(fired, backend.bound, "lock watch after the lock was taken")
    assert not await b.try_lock("replication/ledger-1", "worker-b")
    assert not b.holds_lock("replication/ledger-1")
    assert await b.lock_owner("replication/ledger-1") == "worker-a"
    assert await b.try_lock("replication/ledger-2", "worker-b")
    assert await a.list_locks("replication/") == {
        "replication/ledger-1": "worker-a", "replication/ledger-2": "worker-b"}
    assert await a.list_locks("other/") == {}
    fired.clear()
    await b.unlock("replication/ledger-1")  # not b's: nothing happens
    assert await a.lock_owner("replication/ledger-1") == "worker-a"
    await a.unlock("replication/ledger-1")
    assert not a.holds_lock("replication/ledger-1")
    await _wait_event(fired, backend.bound, "lock watch after the lock was released")
    assert await b.lock_owner("replication/ledger-1") is None
    assert await b.try_lock("replication/ledger-1", "worker-b")
    assert await a.list_locks() == {
        "replication/ledger-1": "worker-b", "replication/ledger-2": "worker-b"}
    watch.cancel()
    await _raises(ValueError, lambda: a.try_lock("bad//name", "x"), "a bad lock name")
    await _raises(ValueError, lambda: a.try_lock("ok", ""), "an empty owner")


async def check_lock_vanishes_with_its_owner(backend: MetadataBackend) -> None:
    doomed, other = await backend.open(), await backend.open()
    closing = await backend.open()
    assert await doomed.try_lock("auditor-lock", "doomed")
    assert await closing.try_lock("closing-lock", "closing")
    await closing.close()  # a clean close releases at once
    assert await other.lock_owner("closing-lock") is None
    await backend.kill_owner(doomed)

    async def taken() -> bool:
        return await other.try_lock("auditor-lock", "other")

    await wait_until(taken, backend.bound, "a dead holder's lock to become free")
    assert other.holds_lock("auditor-lock")
    assert await other.lock_owner("auditor-lock") == "other"


async def check_election_has_one_leader_and_fails_over(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    observer = await backend.open()
    elections = [s.election("auditor", f"candidate-{i}") for i, s in enumerate(stores)]
    changes: list[tuple[str, bool]] = []
    for e in elections:
        e.on_change = lambda leading, e=e: changes.append((e.candidate, leading))
        await e.join()

    async def one_leader() -> bool:
        return sum(e.is_leader for e in elections) == 1

    await wait_until(one_leader, backend.bound, "one leader among three candidates")
    first = next(e for e in elections if e.is_leader)
    await asyncio.wait_for(first.wait_leader(), backend.bound)  # returns at once
    assert await observer.election_leader("auditor") == first.candidate
    assert (first.candidate, True) in changes
    # the leader resigns: another one takes over
    await first.resign()
    assert not first.is_leader
    rest = [e for e in elections if e is not first]

    async def another() -> bool:
        return sum(e.is_leader for e in rest) == 1

    await wait_until(another, backend.bound, "a new leader after the first resigned")
    second = next(e for e in rest if e.is_leader)
    assert await observer.election_leader("auditor") == second.candidate
    assert not first.is_leader
    # the second leader's process dies: the last candidate takes over
    await backend.kill_owner(stores[elections.index(second)])
    last = next(e for e in rest if e is not second)
    await asyncio.wait_for(last.wait_leader(), backend.bound)

    async def reported() -> bool:
        return await observer.election_leader("auditor") == last.candidate

    await wait_until(reported, backend.bound, "the observer to see the last candidate lead")
    await last.resign()

    async def nobody() -> bool:
        return await observer.election_leader("auditor") is None

    await wait_until(nobody, backend.bound, "no leader once every candidate left")


async def check_corrupt_metadata_is_an_error(backend: MetadataBackend) -> None:
    store = await backend.open()
    lid = await store.allocate_ledger_id()
    await store.create_ledger(sample_metadata(lid))
    good = sample_metadata(lid).to_bytes()
    flipped = bytearray(good)
    flipped[-3] ^= 0x20
    for bad in (bytes(flipped), good[:-1], b"", b"not metadata at all", good[:8]):
        await backend.corrupt_ledger(store, lid, bad)
        try:
            await store.read_ledger(lid)
        except CorruptRecordError:
            pass
        else:
            raise AssertionError(f"corrupt bytes {bad[:16]!r}... were accepted")
    # update_ledger must not paper over corruption either
    try:
        await store.update_ledger(lid, lambda m: m.with_changes(length=1))
    except CorruptRecordError:
        pass
    else:
        raise AssertionError("update_ledger accepted corrupt metadata")


async def check_bad_arguments_are_value_errors(backend: MetadataBackend) -> None:
    store = await backend.open()
    for call in (
        lambda: store.read_ledger(-1),
        lambda: store.delete_ledger(-5),
        lambda: store.create_ledger(sample_metadata(-2)),
        lambda: store.create_ledger(sample_metadata(1, state="BOGUS")),
        lambda: store.register_bookie(BookieRegistration("a/b", "")),
        lambda: store.read_cookie(""),
    ):
        try:
            await call()
        except ValueError as exc:
            assert str(exc), "ValueError without a message"
        else:
            raise AssertionError("bad argument accepted")
    assert await store.list_ledgers() == []


async def _raises(
    exc: type[BaseException], call: Callable[[], Awaitable[object]], what: str
) -> None:
    try:
        await call()
    except exc:
        return
    raise AssertionError(f"{what} did not raise {exc.__name__}")


async def check_values_create_read_cas(backend: MetadataBackend) -> None:
    a, b = await backend.open(), await backend.open()
    created = await a.create_value("logs/ns/orders", b"v0")
    assert (created.key, created.value) == ("logs/ns/orders", b"v0"), created
    read = await b.read_value("logs/ns/orders")
    assert (read.value, read.version) == (b"v0", created.version), read
    await _raises(KeyExistsError, lambda: b.create_value("logs/ns/orders", b"other"),
                  "creating an existing key")
    v1 = await b.write_value("logs/ns/orders", b"v1", created.version)
    assert v1.version != created.version and v1.value == b"v1"
    await _raises(MetadataVersionError, lambda: a.write_value("logs/ns/orders", b"x",
                                                              created.version), "a stale CAS")
    for never in (-1, -7):
        await _raises(MetadataVersionError, lambda n=never: a.write_value(  # type: ignore[misc]
            "logs/ns/orders", b"x", n), f"a CAS with version {never}")
        await _raises(MetadataVersionError, lambda n=never: a.delete_value(  # type: ignore[misc]
            "logs/ns/orders", n), f"a delete with version {never}")
    assert (await a.read_value("logs/ns/orders")).value == b"v1"
    await _raises(NoSuchKeyError, lambda: a.read_value("logs/ns/missing"), "reading a missing key")
    await _raises(NoSuchKeyError, lambda: a.write_value("logs/ns/missing", b"x", v1.version),
                  "a CAS on a missing key")
    await _raises(NoSuchKeyError, lambda: a.delete_value("logs/ns/missing"),
                  "deleting a missing key")
    # empty values and binary values round-trip
    empty = await a.create_value("e", b"")
    assert (await b.read_value("e")).value == b"" and empty.value == b""
    blob = bytes(range(256)) * 3
    await a.write_value("e", blob, empty.version)
    assert (await b.read_value("e")).value == blob
    # delete, then create again: the new incarnation's versions are new, a stale CAS fails
    await _raises(MetadataVersionError, lambda: a.delete_value("logs/ns/orders",
                                                               created.version), "stale delete")
    await a.delete_value("logs/ns/orders", v1.version)
    await _raises(NoSuchKeyError, lambda: b.read_value("logs/ns/orders"), "reading a deleted key")
    again = await b.create_value("logs/ns/orders", b"again")
    assert again.version not in (created.version, v1.version), (again, created, v1)
    for stale in (created.version, v1.version):
        await _raises(MetadataVersionError, lambda s=stale: a.write_value(  # type: ignore[misc]
            "logs/ns/orders", b"x", s), "a CAS with a version of the old incarnation")
    await a.delete_value("logs/ns/orders")
    await _raises(NoSuchKeyError, lambda: a.read_value("logs/ns/orders"), "reading a deleted key")


async def check_values_update_loop_under_concurrent_updaters(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    await stores[0].create_value("counter", b"0")
    per_store, updaters = 4, 3

    def add(amount: int) -> Callable[[object], bytes]:
        return lambda cur: str(int(cur.value) + amount).encode()  # type: ignore[attr-defined]

    async def bump(store: MetadataStore, amount: int) -> None:
        for _ in range(per_store):
            await store.update_value("counter", add(amount))

    await asyncio.gather(*(bump(s, i + 1) for s in stores for i in range(updaters)))
    final = await stores[1].read_value("counter")
    assert int(final.value) == len(stores) * per_store * sum(range(1, updaters + 1)), final
    same = await stores[2].update_value("counter", lambda cur: None)
    assert same.version == final.version
    await _raises(NoSuchKeyError, lambda: stores[0].update_value("nope", lambda c: b"x"),
                  "update_value on a missing key")


async def check_values_list_by_prefix(backend: MetadataBackend) -> None:
    store, other = await backend.open(), await backend.open()
    assert await store.list_keys() == []
    keys = ["logs/a/x", "logs/a/y", "logs/a/y/deeper", "logs/b/z", "logs/a.b/q", "logsx", "top"]
    for k in reversed(keys):
        await store.create_value(k, k.encode())
    assert await other.list_keys("logs/a/") == ["logs/a/x", "logs/a/y", "logs/a/y/deeper"]
    assert await other.list_keys("logs/") == sorted(k for k in keys if k.startswith("logs/"))
    assert await other.list_keys("") == sorted(keys)
    assert await other.list_keys("nothing/") == []
    # a key with keys below it: deleting it leaves them; creating it again works
    await store.delete_value("logs/a/y")
    assert await other.list_keys("logs/a/") == ["logs/a/x", "logs/a/y/deeper"]
    assert (await other.read_value("logs/a/y/deeper")).value == b"logs/a/y/deeper"
    await _raises(NoSuchKeyError, lambda: other.read_value("logs/a/y"), "reading a deleted key")
    await other.create_value("logs/a/y", b"back")
    assert (await store.read_value("logs/a/y")).value == b"back"
    # a parent that was never a key is not listed and cannot be read
    await store.create_value("p/q/r", b"1")
    assert await store.list_keys("p/") == ["p/q/r"]
    await _raises(NoSuchKeyError, lambda: store.read_value("p/q"), "reading a bare parent path")


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
    await _wait_event(event, backend.bound, "value watch after create")
    event.clear()
    seen = await watcher.read_value("w/k")
    assert seen.version == created.version
    await writer.write_value("w/k", b"2", seen.version)
    await _wait_event(event, backend.bound, "value watch after a CAS write")
    assert (await watcher.read_value("w/k")).value == b"2"
    event.clear()
    await writer.delete_value("w/k")
    await _wait_event(event, backend.bound, "value watch after delete")
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
    await _wait_event(ledger_event, backend.bound, "a ledger watch after this store's own write")
    await _wait_event(value_event, backend.bound, "a value watch after this store's own write")
    value_event.clear()
    await store.delete_value("mine")
    await _wait_event(value_event, backend.bound, "a value watch after this store's own delete")
    lw.cancel()
    vw.cancel()


async def check_values_bad_arguments(backend: MetadataBackend) -> None:
    store = await backend.open()
    bad_keys: list[object] = ["", "/a", "a/", "a//b", "a/../b", ".", "a/./b", "sp ace", "é",
                              "a" * 600, 7, None, b"bytes"]
    for key in bad_keys:
        for call in (
            lambda k=key: store.create_value(k, b"x"),
            lambda k=key: store.read_value(k),
            lambda k=key: store.write_value(k, b"x", 1),
            lambda k=key: store.delete_value(k),
        ):
            try:
                await call()
            except (ValueError, TypeError) as exc:
                assert str(exc), "an error without a message"
            else:
                raise AssertionError(f"bad key {key!r} accepted")
    for prefix in ("a", "/", "a//", 3):
        try:
            await store.list_keys(prefix)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            pass
        else:
            raise AssertionError(f"bad prefix {prefix!r} accepted")
    for value in ("text", 5, None):
        try:
            await store.create_value("k", value)  # type: ignore[arg-type]
        except TypeError:
            pass
        else:
            raise AssertionError(f"value {value!r} accepted")
    try:
        await store.create_value("k", bytes(MAX_VALUE_SIZE + 1))
    except ValueError as exc:
        assert str(MAX_VALUE_SIZE) in str(exc), exc
    else:
        raise AssertionError("an oversized value was accepted")
    await store.create_value("k", bytes(MAX_VALUE_SIZE))  # the limit itself is fine
    assert await store.list_keys() == ["k"]


CHECKS: list[Callable[[MetadataBackend], Awaitable[None]]] = [
    check_create_read_round_trip, check_create_records_the_creation_time, check_cas_conflict,
    check_update_loop_under_concurrent_updaters, check_delete_and_list,
    check_id_allocation_unique_under_concurrency, check_watch_ledger_fires_on_change_and_delete,
    check_watch_bookies_fires_on_membership_change, check_read_only_flag,
    check_registration_vanishes_with_its_owner, check_clean_close_unregisters, check_cookies,
    check_under_replication_marks, check_under_replication_marks_clear_only_what_was_repaired,
    check_registration_carries_its_rack, check_locks_are_exclusive_and_released,
    check_lock_vanishes_with_its_owner, check_election_has_one_leader_and_fails_over,
    check_corrupt_metadata_is_an_error, check_bad_arguments_are_value_errors,
    check_values_create_read_cas, check_values_update_loop_under_concurrent_updaters,
    check_values_list_by_prefix, check_values_watch,
    check_watches_fire_for_changes_made_through_the_same_store, check_values_bad_arguments,
    *TENANCY_CHECKS,  # tenants and namespaces (pybk.testing.tenancy_conformance)
]


async def run_check(
    make_backend: Callable[[], MetadataBackend],
    check: Callable[[MetadataBackend], Awaitable[None]],
) -> None:
    """Run one check on a fresh backend and clean it up afterwards."""
    backend = make_backend()
    try:
        await check(backend)
        await backend.check_invariants()
    finally:
        await backend.cleanup()


async def run_all(make_backend: Callable[[], MetadataBackend]) -> None:
    """Run every check, each on a fresh backend."""
    for check in CHECKS:
        await run_check(make_backend, check)


class ZooKeeperBackend(MetadataBackend):
    """``zk://``: clients are separate kazoo sessions under one fresh root path.

    ``hosts`` is a running server (e.g. :class:`pybk.testing.zookeeper.ZooKeeperServer`).
    """

    _counter = 0

    def __init__(self, hosts: str, root: str | None = None, *, session_timeout: float = 4.0):
        if root is None:
            ZooKeeperBackend._counter += 1
            root = f"/conformance-{id(self):x}-{ZooKeeperBackend._counter}"
        self.hosts = hosts
        self.root = root
        self.session_timeout = session_timeout
        self.bound = 15.0
        self._opened: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        from pybk.metadata.zookeeper import ZooKeeperMetadataStore

        store = ZooKeeperMetadataStore(
            self.hosts, self.root, session_timeout=self.session_timeout
        )
        self._opened.append(store)
        return store

    async def kill_owner(self, store: MetadataStore) -> None:
        """The owner dies: it stops re-registering and its session is expired."""
        from pybk.metadata.zookeeper import ZooKeeperMetadataStore
        from pybk.testing.zookeeper import force_session_expiry

        assert isinstance(store, ZooKeeperMetadataStore)
        store.forget_registrations()
        client_id = store.client_id
        assert client_id is not None, "store never connected"
        await asyncio.to_thread(force_session_expiry, self.hosts, client_id)
        await store.close()

    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        from pybk.metadata.zookeeper import ZooKeeperMetadataStore

        assert isinstance(store, ZooKeeperMetadataStore)
        await store.corrupt_ledger(ledger_id, data)

    async def cleanup(self) -> None:
        for s in self._opened:
            await s.close()


def conformance_test(
    make_backend: Callable[[], MetadataBackend],
) -> Callable[..., Awaitable[None]]:
    """A pytest test (parametrized over :data:`CHECKS`) for a backend that needs no fixture::

        test_my_store = conformance_test(MyBackend)

    Needs pytest-asyncio (or another runner for ``async def`` tests).
    """
    import pytest

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
    async def test_metadata_conformance(
        check: Callable[[MetadataBackend], Awaitable[None]],
    ) -> None:
        await run_check(make_backend, check)

    return test_metadata_conformance
