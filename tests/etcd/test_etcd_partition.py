"""A live etcd member partitioned from the other two (issue 40: require a leader).

The members talk through cuttable peer proxies (``EtcdCluster(peer_links=True)``); clients
reach each member directly. The partitioned member stays alive and keeps its client
connections, but it hears no change made on the majority side:

* a store whose watch stream is served by it sees every change made meanwhile through the
  other members, each exactly once, within a bound (the member cancels the stream with
  "no leader" and the store resumes on another member from the revision it reached);
* calls sent to it move on to another member at once, and a write is never left with an
  unknown outcome because that member had no leader.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator

import pytest

from pybk.metadata.base import BookieRegistration
from pybk.metadata.etcd import EtcdMetadataStore
from pybk.testing.etcd import EtcdCluster
from pybk.testing.metadata_helpers import sample_metadata

pytestmark = pytest.mark.integration

BOUND = 30.0
#: election timeout of this cluster (1 s, etcd's default): a cut member notices it has no
#: leader 1-2 timeouts after its last heartbeat, then cancels the watch streams that
#: require one after 3 more
ELECTION = 1.0
FAILOVER = 12.0  # the bound asserted (about 5 s expected)
_roots = itertools.count()


@pytest.fixture(scope="module")
def etcd3p() -> Iterator[EtcdCluster]:
    with EtcdCluster(3, peer_links=True, heartbeat_ms=100,
                     election_ms=int(ELECTION * 1000)) as cluster:
        yield cluster


def _until(cond: object, what: str, bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out after {bound}s waiting for {what}"
        time.sleep(0.02)


def _pick(cluster: EtcdCluster, role: str) -> int:
    """The member to partition: the leader, or a follower."""
    _until(lambda: cluster.leader() is not None, "an etcd leader")
    leader = cluster.leader()
    assert leader is not None
    return leader if role == "leader" else (leader + 1) % 3


def _hosts(cluster: EtcdCluster, first: int) -> str:
    """``host:port`` of every member, ``first`` first (the store starts there)."""
    order = [first] + [i for i in range(3) if i != first]
    return ",".join(f"127.0.0.1:{cluster.client_ports[i]}" for i in order)


def _others(cluster: EtcdCluster, cut: int) -> str:
    return ",".join(f"127.0.0.1:{p}" for i, p in enumerate(cluster.client_ports) if i != cut)


async def _heal(cluster: EtcdCluster, member: int) -> None:
    await asyncio.to_thread(cluster.heal, member)
    await asyncio.to_thread(_until, lambda: cluster.healthy(member), "the member to rejoin")


@pytest.mark.parametrize("role", ["follower", "leader"])
async def test_a_watch_on_a_partitioned_member_fails_over_and_misses_nothing(
    etcd3p: EtcdCluster, role: str
) -> None:
    cut = await asyncio.to_thread(_pick, etcd3p, role)
    root = f"/part-{next(_roots)}"
    watcher = EtcdMetadataStore(_hosts(etcd3p, cut), root)
    writer = EtcdMetadataStore(_others(etcd3p, cut), root)
    lid = await writer.allocate_ledger_id()
    await writer.create_ledger(sample_metadata(lid))
    await writer.create_value("marker", b"0")
    await watcher.read_ledger(lid)
    fires = {"ledger": 0, "bookies": 0, "marker": 0}
    at_marker: list[tuple[int, float]] = []
    marked = asyncio.Event()

    def on_marker(_k: str) -> None:
        fires["marker"] += 1
        at_marker.append((fires["ledger"], time.monotonic()))
        marked.set()

    watcher.watch_ledger(lid, lambda _l: fires.__setitem__("ledger", fires["ledger"] + 1))
    watcher.watch_bookies(lambda: fires.__setitem__("bookies", fires["bookies"] + 1))
    watcher.watch_value("marker", on_marker)
    assert await watcher.sync_watches()
    for k in fires:  # (a new watch may fire once at once: an extra fire is allowed)
        fires[k] = 0
    at_marker.clear()
    marked.clear()
    assert watcher.watch_resumes == 0  # the stream is still the first, on the cut member
    try:
        await asyncio.to_thread(etcd3p.isolate, cut)
        t0 = time.monotonic()
        changes = 5
        for _ in range(changes):  # acknowledged by the majority while the member lags
            await writer.update_ledger(lid, lambda m: m.with_changes(length=m.length + 1))
        await writer.register_bookie(BookieRegistration("bk-p", "h:1"))
        marker = await writer.read_value("marker")
        await writer.write_value("marker", b"1", marker.version)
        await asyncio.wait_for(marked.wait(), BOUND)
        took = at_marker[0][1] - t0
        # stream order: every ledger change is in before the marker, each exactly once
        assert at_marker[0][0] == changes, (at_marker, fires)
        assert fires["bookies"] == 1, fires
        assert took < FAILOVER, f"the watch failed over after {took:.2f}s"
        assert watcher.watch_resumes >= 1
        assert (await watcher.read_ledger(lid)).length == sample_metadata(lid).length + changes
        print(f"{role}: watch failed over {took:.2f}s after the partition")
    finally:
        await _heal(etcd3p, cut)
    marker = await writer.read_value("marker")
    await writer.write_value("marker", b"2", marker.version)
    await asyncio.wait_for(_count(fires, "marker", 2), BOUND)
    assert fires == {"ledger": changes, "bookies": 1, "marker": 2}, fires
    await watcher.close()
    await writer.close()


async def _count(fires: dict[str, int], key: str, n: int) -> None:
    while fires[key] < n:
        await asyncio.sleep(0.02)


async def test_calls_to_a_leaderless_member_move_on_at_once(etcd3p: EtcdCluster) -> None:
    cut = await asyncio.to_thread(_pick, etcd3p, "follower")
    root = f"/part-{next(_roots)}"
    store = EtcdMetadataStore(_hosts(etcd3p, cut), root, op_timeout=5.0)
    await store.create_value("k", b"0")  # served by the member about to be cut
    try:
        await asyncio.to_thread(etcd3p.isolate, cut)
        await asyncio.to_thread(_until, lambda: not etcd3p.has_leader(cut),
                                "the cut member to lose its leader")
        t0 = time.monotonic()
        seen = await store.read_value("k")
        await store.write_value("k", b"1", seen.version)  # never "outcome unknown"
        await store.create_value("k2", b"x")
        await store.register_bookie(BookieRegistration("bk-q", "h:1"))  # a lease grant
        assert [b.bookie_id for b in await store.list_bookies()] == ["bk-q"]
        took = time.monotonic() - t0
        assert took < 2.5, f"five calls took {took:.2f}s"  # (5 s each, unanswered)
    finally:
        await _heal(etcd3p, cut)
    await store.close()


async def test_a_lease_outlives_a_partition_of_the_member_it_is_renewed_through(
    etcd3p: EtcdCluster,
) -> None:
    """Renewals go to the member the store last used; it is cut off. A renewal sent before
    it noticed it has no leader (1-2 election timeouts; the lease is renewed every third of
    its 2 s TTL, so one always is) waits there until etcd cancels it for want of a leader,
    3 election timeouts later, longer than the TTL, unless the attempt is given up in time
    for another member."""
    cut = await asyncio.to_thread(_pick, etcd3p, "follower")
    root = f"/part-{next(_roots)}"
    bookie = EtcdMetadataStore(_hosts(etcd3p, cut), root, session_timeout=2.0)
    observer = EtcdMetadataStore(_others(etcd3p, cut), root)
    await bookie.register_bookie(BookieRegistration("bk-l", "h:1"))
    changed = asyncio.Event()
    observer.watch_bookies(changed.set)
    assert await observer.sync_watches()
    assert [b.bookie_id for b in await observer.list_bookies()] == ["bk-l"]
    changed.clear()
    try:
        await asyncio.to_thread(etcd3p.isolate, cut)
        # four TTLs: the registration must stay (a fire means it went, or came back)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(changed.wait(), 4 * 2.0)
        assert bookie.lease_losses == 0
        assert [b.bookie_id for b in await observer.list_bookies()] == ["bk-l"]
    finally:
        await _heal(etcd3p, cut)
    await bookie.close()
    await observer.close()
