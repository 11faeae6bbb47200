"""The etcd store on a real one-member etcd: its URI, lease expiry, outages, the watch stream
resuming without missing a change."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from pybk.errors import MetadataStoreError
from pybk.metadata import open_store
from pybk.metadata.base import BookieRegistration
from pybk.metadata.etcd import EtcdMetadataStore
from pybk.metadata.uri import session_options
from pybk.testing.etcd import EtcdCluster
from pybk.testing.metadata_helpers import sample_metadata, wait_until

pytestmark = pytest.mark.integration

_roots = itertools.count()
BOUND = 15.0


def _store(etcd: EtcdCluster, root: str, **kw: float) -> EtcdMetadataStore:
    store = open_store(etcd.uri(root), **kw)
    assert isinstance(store, EtcdMetadataStore)
    return store


@pytest.fixture
def root() -> str:
    return f"/etcd-test-{next(_roots)}"


async def test_uri_opens_an_etcd_store_with_its_session_timeout(etcd: EtcdCluster) -> None:
    store = _store(etcd, "/a/b", **session_options(etcd.uri("/a/b"), 3.0))
    assert (store.hosts, store.root, store.session_timeout) == (etcd.hosts, "/a/b", 3.0)
    await store.create_value("k", b"v")
    assert (await store.read_value("k")).value == b"v"
    await store.close()
    assert session_options("etcd://h:1/r", 0.2) == {"session_timeout": 1.0}  # TTLs are >= 1 s


@pytest.mark.parametrize("uri", [
    "etcd://", "etcd://127.0.0.1:2379", "etcd://127.0.0.1:2379/", "etcd://127.0.0.1/root",
    "etcd://127.0.0.1:0/root", "etcd://127.0.0.1:70000/root", "etcd://h:1,:2/root",
    "etcd://h:1/bad root", "etcd://h:1/a//b", "etcd://h:1/é",
])
def test_bad_etcd_uris_are_value_errors_naming_the_form(uri: str) -> None:
    with pytest.raises(ValueError, match="etcd://"):
        open_store(uri)


@pytest.mark.parametrize(("kw", "match"), [
    ({"session_timeout": 0.5}, "TTL must be >= 1"),
    ({"id_block": 0}, "id_block"),
])
def test_bad_etcd_options_are_value_errors(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EtcdMetadataStore("127.0.0.1:2379", "/r", **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="absolute path"):
        EtcdMetadataStore("127.0.0.1:2379", "relative")
    with pytest.raises(ValueError, match="bad key"):
        EtcdMetadataStore("127.0.0.1:2379", "/a b")
    with pytest.raises(ValueError, match="bad etcd endpoint"):
        EtcdMetadataStore("127.0.0.1", "/r")


async def test_expired_lease_loses_locks_and_registers_again(
    etcd: EtcdCluster, root: str
) -> None:
    bookie = _store(etcd, root, session_timeout=2.0)
    observer = _store(etcd, root, session_timeout=2.0)
    await bookie.register_bookie(BookieRegistration("bk-1", "127.0.0.1:3181", read_only=True))
    assert await bookie.try_lock("auditor", "bk-1")
    assert await observer.read_only_bookies() == ["bk-1"]
    changed = asyncio.Event()
    observer.watch_bookies(changed.set)
    lock_changed = asyncio.Event()
    observer.watch_lock("auditor", lambda _n: lock_changed.set())
    old = bookie.lease_id
    await bookie.expire_lease()  # as if it lapsed during a pause
    await asyncio.wait_for(changed.wait(), BOUND)
    await asyncio.wait_for(lock_changed.wait(), BOUND)

    async def noticed() -> bool:
        return bookie.lease_losses == 1

    await wait_until(noticed, BOUND, "the store to notice its lease is gone")
    assert not bookie.holds_lock("auditor")
    assert await observer.try_lock("auditor", "observer")  # free: the lease took it along

    async def back() -> bool:
        return await observer.read_only_bookies() == ["bk-1"]

    await wait_until(back, BOUND, "the registration to come back under a new lease")
    assert bookie.lease_id not in (0, old)
    assert await bookie.lock_owner("auditor") == "observer"
    await bookie.close()

    async def gone() -> bool:
        return await observer.list_bookies() == []

    await wait_until(gone, BOUND, "a clean close to unregister")
    await observer.close()


async def test_outage_fails_calls_in_bound_and_the_watch_stream_misses_nothing(
    tmp_path: object,
) -> None:
    """etcd stops; calls fail with MetadataStoreError within op_timeout; a change made
    right after it is back, before the watcher's stream reconnected, still fires."""
    with EtcdCluster(1) as cluster:
        watcher = _store(cluster, "/outage", op_timeout=1.0)
        writer = _store(cluster, "/outage", op_timeout=10.0)
        await writer.create_value("k", b"0")
        seen = await watcher.read_value("k")
        fired = asyncio.Event()
        watcher.watch_value("k", lambda _k: fired.set())
        assert await watcher.sync_watches()
        fired.clear()  # an early, extra fire is allowed; what counts comes next
        cluster.kill(0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(MetadataStoreError, match="etcd"):
            await watcher.read_value("k")
        assert loop.time() - t0 < 1.0 + 1.5
        await asyncio.to_thread(cluster.start, 0)
        await writer.write_value("k", b"1", seen.version)
        await asyncio.wait_for(fired.wait(), BOUND)
        assert (await watcher.read_value("k")).value == b"1"
        await watcher.close()
        await writer.close()


async def test_watches_after_reads_see_changes_made_before_the_stream_started(
    etcd: EtcdCluster, root: str
) -> None:
    """A store's watch stream starts with its first watch, and replays from the first
    revision the store saw: a change made after an earlier read of another key (before the
    stream ran, and before later answers moved the store's revision on) fires that key's
    watch when it is set later."""
    reader = _store(etcd, root)
    writer = _store(etcd, root)
    await writer.create_value("a", b"0")
    await writer.create_value("b", b"0")
    await reader.read_value("a")
    seen = await reader.read_value("b")
    await writer.write_value("b", b"1", seen.version)
    await reader.create_value("other", b"x")  # the reader's revision moves past the change
    reader.watch_value("a", lambda _k: None)  # starts the stream
    assert await reader.sync_watches()
    fired = asyncio.Event()
    reader.watch_value("b", lambda _k: fired.set())
    await asyncio.wait_for(fired.wait(), BOUND)
    await reader.close()
    await writer.close()


async def test_id_allocation_skips_ids_created_by_hand(etcd: EtcdCluster, root: str) -> None:
    store = _store(etcd, root, id_block=8)
    other = _store(etcd, root, id_block=8)
    for lid in (0, 3, 9):
        await store.create_ledger(sample_metadata(lid))
    got = [await store.allocate_ledger_id() for _ in range(10)]
    got += [await other.allocate_ledger_id() for _ in range(10)]
    assert not {0, 3, 9} & set(got), got
    assert len(set(got)) == len(got), got
    await store.close()
    await other.close()


async def test_a_lock_holder_cut_off_from_etcd_stops_holding_within_its_ttl() -> None:
    """Renewals cannot reach etcd: the store stops claiming its lock once the TTL etcd last
    granted has run out (``holds_lock`` needs no I/O), and its election's leader steps
    down (at its next campaign round)."""
    with EtcdCluster(1) as cluster:
        store = _store(cluster, "/cut-off", session_timeout=2.0, op_timeout=0.5)
        assert await store.try_lock("workers/1", "me")
        election = store.election("auditor", "me")
        await election.join()
        await asyncio.wait_for(election.wait_leader(), BOUND)
        cluster.kill(0)
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def lost() -> bool:
            return not store.holds_lock("workers/1")

        await wait_until(lost, BOUND, "the holder to give its lock up")
        assert loop.time() - t0 < 2.0 + 0.3  # the TTL from the last renewal sent, at most

        async def stepped_down() -> bool:
            return not election.is_leader

        await wait_until(stepped_down, BOUND, "the leader to step down")
        await election.resign()
        await store.close()
