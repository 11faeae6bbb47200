"""Placement policies: properties (hypothesis) and their use by the client."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.client.context import ClientConfig
from pybk.client.placement import (
    DEFAULT_RACK,
    BookieNode,
    DefaultPlacementPolicy,
    RackAwarePlacementPolicy,
    min_racks_per_write_set,
    write_sets,
)
from pybk.client.quorum import plan_ensemble_change
from pybk.cluster import LocalCluster
from pybk.errors import NotEnoughBookiesError
from pybk.storage.memfs import MemFileSystem


def feasible(capacity: dict[str, int], size: int, write_quorum: int, target: int) -> bool:
    """Brute force: is there a rack for each slot, within capacity, such that every write
    set spans ``target`` racks?"""
    racks = sorted(capacity)
    for plan in itertools.product(racks, repeat=size):
        used = Counter(plan)
        if any(used[r] > capacity[r] for r in used):
            continue
        if all(len({plan[i] for i in ws}) >= target for ws in write_sets(size, write_quorum)):
            return True
    return False


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[BookieNode], int, int]:
    """Up to 4 racks of 0..4 bookies, an ensemble size and write quorum that fit."""
    rack_sizes = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
    nodes = [BookieNode(f"b{r}-{i}", f"/region/rack-{r}")
             for r, n in enumerate(rack_sizes) for i in range(n)]
    total = len(nodes)
    size = draw(st.integers(1, max(1, min(total, 6))))
    write_quorum = draw(st.integers(1, size))
    return nodes, size, write_quorum


@settings(max_examples=300, deadline=None)
@given(clusters(), st.integers(1, 4), st.integers(0, 2**32))
def test_rack_aware_ensembles_span_racks_whenever_the_cluster_allows(
    cluster: tuple[list[BookieNode], int, int], min_racks: int, seed: int
) -> None:
    nodes, size, write_quorum = cluster
    policy = RackAwarePlacementPolicy(min_racks_per_write_quorum=min_racks)
    rng = random.Random(seed)
    if len(nodes) < size:
        with pytest.raises(NotEnoughBookiesError):
            policy.new_ensemble(nodes, size, write_quorum, rng)
        return
    ensemble = policy.new_ensemble(nodes, size, write_quorum, rng)
    assert len(ensemble) == len(set(ensemble)) == size
    assert set(ensemble) <= {n.bookie_id for n in nodes}
    capacity = Counter(n.rack for n in nodes)
    rack_of = {n.bookie_id: n.rack for n in nodes}
    got = min_racks_per_write_set(ensemble, write_quorum, rack_of)
    # the best any placement could do, capped at what was asked for
    best = max(t for t in range(1, min(min_racks, write_quorum) + 1)
               if feasible(dict(capacity), size, write_quorum, t))
    assert got >= best, (ensemble, got, best)


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(1, 3), st.integers(0, 2**32))
def test_strict_rack_aware_refuses_exactly_when_the_racks_cannot_do_it(
    cluster: tuple[list[BookieNode], int, int], min_racks: int, seed: int
) -> None:
    nodes, size, write_quorum = cluster
    if len(nodes) < size:
        return
    policy = RackAwarePlacementPolicy(min_racks_per_write_quorum=min_racks, strict=True)
    wanted = min(min_racks, write_quorum)
    possible = feasible(dict(Counter(n.rack for n in nodes)), size, write_quorum, wanted)
    if not possible:
        with pytest.raises(NotEnoughBookiesError, match="strict"):
            policy.new_ensemble(nodes, size, write_quorum, random.Random(seed))
        return
    ensemble = policy.new_ensemble(nodes, size, write_quorum, random.Random(seed))
    rack_of = {n.bookie_id: n.rack for n in nodes}
    assert min_racks_per_write_set(ensemble, write_quorum, rack_of) >= wanted


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(0, 2**32), st.data())
def test_a_replacement_keeps_the_write_sets_through_its_slot_on_as_many_racks_as_possible(
    cluster: tuple[list[BookieNode], int, int], seed: int, data: st.DataObject
) -> None:
    nodes, size, write_quorum = cluster
    if len(nodes) < size + 1:
        return
    rng = random.Random(seed)
    policy = RackAwarePlacementPolicy(min_racks_per_write_quorum=write_quorum)
    ensemble = policy.new_ensemble(nodes, size, write_quorum, rng)
    index = data.draw(st.integers(0, size - 1))
    new = policy.replace_bookie(nodes, ensemble, index, write_quorum, rng)
    assert new not in ensemble
    rack_of = {n.bookie_id: n.rack for n in nodes}
    spare = [n.bookie_id for n in nodes if n.bookie_id not in ensemble]

    def through_slot(bookie: str) -> int:
        e = list(ensemble)
        e[index] = bookie
        return min(len({rack_of[e[i]] for i in ws})
                   for ws in write_sets(size, write_quorum) if index in ws)

    assert through_slot(new) == max(through_slot(b) for b in spare)


def test_rack_aware_uses_every_rack_of_a_three_rack_cluster() -> None:
    nodes = [BookieNode(f"b{i}", f"/dc/r{i % 3}") for i in range(9)]
    policy = RackAwarePlacementPolicy(min_racks_per_write_quorum=3)
    for seed in range(50):
        ensemble = policy.new_ensemble(nodes, 6, 3, random.Random(seed))
        rack_of = {n.bookie_id: n.rack for n in nodes}
        assert min_racks_per_write_set(ensemble, 3, rack_of) == 3


def test_unknown_racks_are_the_default_rack_and_a_static_table_overrides() -> None:
    nodes = [BookieNode("a", ""), BookieNode("b"), BookieNode("c", "/r/x")]
    policy = RackAwarePlacementPolicy(racks={"a": "/r/y"})
    assert [policy.rack(n) for n in nodes] == ["/r/y", DEFAULT_RACK, "/r/x"]


def test_default_policy_is_uniform_and_disk_weighting_follows_free_space() -> None:
    nodes = [BookieNode("small", free_bytes=1 << 30), BookieNode("big", free_bytes=3 << 30),
             BookieNode("mid", free_bytes=2 << 30), BookieNode("unknown")]
    rng = random.Random(7)
    uniform = Counter(DefaultPlacementPolicy().new_ensemble(nodes, 1, 1, rng)[0]
                      for _ in range(4000))
    assert all(900 < uniform[b] < 1100 for b in ("small", "big", "mid", "unknown")), uniform
    weighted = Counter(DefaultPlacementPolicy(disk_weighted=True).new_ensemble(
        nodes, 1, 1, rng)[0] for _ in range(8000))
    # weights 1 : 3 : 2 : 2 (an unknown bookie weighs the median, 2 GiB)
    assert weighted["big"] > 2.5 * weighted["small"], weighted
    assert 1.6 < weighted["mid"] / weighted["small"] < 2.5, weighted
    assert 1.6 < weighted["unknown"] / weighted["small"] < 2.5, weighted


def test_disk_weight_is_capped_at_a_multiple_of_the_median() -> None:
    nodes = [BookieNode("empty-new", free_bytes=1000 << 30)] + [
        BookieNode(f"b{i}", free_bytes=1 << 30) for i in range(4)]
    rng = random.Random(3)
    picks = Counter(DefaultPlacementPolicy(disk_weighted=True, max_weight_multiple=2)
                    .new_ensemble(nodes, 1, 1, rng)[0] for _ in range(6000))
    # weight 2 against 4 x 1: a third of the picks, not (nearly) all of them
    assert 1700 < picks["empty-new"] < 2300, picks


def test_excluded_and_duplicate_candidates_are_never_chosen() -> None:
    nodes = [BookieNode("a"), BookieNode("a"), BookieNode("b"), BookieNode("c")]
    policy = DefaultPlacementPolicy()
    for seed in range(20):
        assert sorted(policy.new_ensemble(nodes, 2, 2, random.Random(seed), exclude=["c"])) \
            == ["a", "b"]
    with pytest.raises(NotEnoughBookiesError):
        policy.new_ensemble(nodes, 3, 2, random.Random(0), exclude=["c"])
    with pytest.raises(NotEnoughBookiesError):
        policy.replace_bookie(nodes, ["a", "b", "c"], 0, 2, random.Random(0))


def test_reads_try_the_local_rack_first_keeping_the_write_set_order_otherwise() -> None:
    rack_of = {"a": "/r/1", "b": "/r/2", "c": "/r/1", "d": "/r/3"}
    local = RackAwarePlacementPolicy(local_rack="/r/1")
    assert local.read_order(["b", "a", "d", "c"], rack_of) == ["a", "c", "b", "d"]
    assert RackAwarePlacementPolicy().read_order(["b", "a"], rack_of) == ["b", "a"]
    assert DefaultPlacementPolicy(local_rack="/r/2").read_order(["a", "b"], rack_of) == [
        "b", "a"]


def test_an_ensemble_change_through_a_rack_aware_policy_refills_the_lost_rack() -> None:
    nodes = [BookieNode(f"{r}{i}", f"/dc/{r}") for r in "xyz" for i in range(3)]
    policy = RackAwarePlacementPolicy(min_racks_per_write_quorum=3)
    rack_of = {n.bookie_id: n.rack for n in nodes}
    for seed in range(30):
        rng = random.Random(seed)
        ensemble = policy.new_ensemble(nodes, 3, 3, rng)
        lost = ensemble[1]
        change = plan_ensemble_change({0: ensemble}, 9, {1: lost},
                                      [n for n in nodes if n.bookie_id != lost], rng,
                                      policy, 3)
        assert change is not None
        new = change.ensembles[10]
        assert new[1] != lost and rack_of[new[1]] == rack_of[lost]


async def test_a_cluster_with_racks_places_every_ledger_across_racks() -> None:
    racks = {f"bookie-{i}": f"/dc-1/rack-{i % 3}" for i in range(6)}
    config = ClientConfig(placement=RackAwarePlacementPolicy(min_racks_per_write_quorum=3,
                                                             strict=True))
    async with LocalCluster("/c", 6, metadata="memory://", fs=MemFileSystem(), racks=racks,
                            client_config=config) as cluster:
        client = cluster.client()
        for _ in range(10):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            assert {racks[b] for b in lh.metadata.ensembles[0]} == {
                "/dc-1/rack-0", "/dc-1/rack-1", "/dc-1/rack-2"}
            await lh.append(b"x")
            await lh.close()
        # a whole rack goes: strict placement refuses what it cannot spread
        for b in ("bookie-0", "bookie-3"):
            await cluster.stop_bookie(b)
        with pytest.raises(NotEnoughBookiesError, match="strict"):
            await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        best_effort = cluster.client(config=ClientConfig(
            placement=RackAwarePlacementPolicy(min_racks_per_write_quorum=3)))
        lh = await best_effort.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        assert len({racks[b] for b in lh.metadata.ensembles[0]}) == 2
        await lh.close()


async def test_disk_weighted_placement_asks_the_bookies_and_caches_their_answers() -> None:
    from pybk.client.placement import writable_nodes
    from pybk.testing import HookedTransport
    from pybk.wire import Op

    config = ClientConfig(placement=DefaultPlacementPolicy(disk_weighted=True),
                          disk_usage_cache_ttl=30.0)
    async with LocalCluster("/c", 4, metadata="memory://", fs=MemFileSystem(),
                            client_config=config, transport_wrapper=HookedTransport) as cluster:
        client = cluster.client()
        asked = cluster.transport.hooks.before(None, op=Op.BOOKIE_INFO,
                                               callback=_nothing)
        lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        assert asked.matched == 4  # one BookieInfo per writable bookie
        nodes = await writable_nodes(client._context())
        assert all(n.free_bytes is not None and n.free_bytes > 0 for n in nodes)
        assert asked.matched == 4  # cached: not asked again within the TTL
        await lh.close()
        # a bookie that does not answer is weighed as the median, never blocks placement
        asked.remove()
        cluster.transport.hooks.fail("bookie-0", op=Op.BOOKIE_INFO, status=None)
        client._context().disk_usage.clear()
        nodes = await writable_nodes(client._context())
        assert {n.bookie_id: n.free_bytes is None for n in nodes}["bookie-0"] is True
        await (await client.create_ledger(ensemble_size=3, write_quorum=2,
                                          ack_quorum=2)).close()


async def _nothing(bookie: str, request: object) -> None:
    return None


async def test_reads_go_to_the_local_rack_first() -> None:
    from pybk.testing import HookedTransport
    from pybk.wire import Op

    racks = {"bookie-0": "/dc/a", "bookie-1": "/dc/b", "bookie-2": "/dc/c"}
    async with LocalCluster("/c", 3, metadata="memory://", fs=MemFileSystem(), racks=racks,
                            transport_wrapper=HookedTransport) as cluster:
        writer = cluster.client()
        lh = await writer.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await lh.append_many([b"e%d" % i for i in range(30)])
        await lh.close()
        for local in ("/dc/a", "/dc/c"):
            reader = cluster.client(config=ClientConfig(
                speculative_read_delay=0.0,
                placement=RackAwarePlacementPolicy(local_rack=local)))
            seen: list[str] = []

            async def note(bookie: str, request: object, seen: list[str] = seen) -> None:
                seen.append(bookie)

            rule = cluster.transport.hooks.before(None, op=Op.READ, callback=note)
            rh = await reader.open_ledger(lh.id, recovery=False)
            seen.clear()
            assert len(await rh.read(0, 29)) == 30
            rule.remove()
            want = next(b for b, r in racks.items() if r == local)
            assert seen and set(seen) == {want}, seen  # every entry from the local replica
