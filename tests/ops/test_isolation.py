"""Isolation groups, region-aware placement and the ledger-count quota of a namespace."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest

import pybk
from pybk.client.context import ClientConfig
from pybk.client.isolation import (
    REREPLICATION_LEAVES_GROUP,
    IsolatedPlacementPolicy,
    placement_for,
    policy_for_namespace,
)
from pybk.client.placement import (
    BookieNode,
    RackAwarePlacementPolicy,
    RegionAwarePlacementPolicy,
    region_of,
    write_sets,
)
from pybk.cluster import LocalCluster
from pybk.errors import NoSuchNamespaceError, NotEnoughBookiesError, QuotaExceededError
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords
from pybk.metadata.tenancy_usage import namespace_usage
from pybk.ops import AutoRecoveryConfig
from pybk.storage.memfs import MemFileSystem
from pybk.testing import HookedTransport
from pybk.testing.metadata_helpers import wait_until

CLIENT = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0)
FAST = AutoRecoveryConfig(open_ledger_grace=0.5, worker_poll_interval=0.2, retry_backoff=0.2,
                          max_retry_backoff=1.0, bookie_check_interval=5.0,
                          ledger_check_interval=0.0)
GOLD = {f"bookie-{i}": "gold" for i in range(4)}  # bookie-4..6 are in no group
NS = {NAMESPACE_KEY: b"acme/orders"}


@asynccontextmanager
async def cluster(bookies: int = 7, groups: Mapping[str, str] = GOLD,
                  **kwargs: Any) -> AsyncIterator[LocalCluster]:
    kwargs.setdefault("client_config", CLIENT)
    c = LocalCluster("/c", bookies, metadata="memory://", fs=MemFileSystem(),
                     rng=random.Random(3), transport_wrapper=HookedTransport, groups=groups,
                     **kwargs)
    async with c:
        yield c


async def namespace(c: LocalCluster, **policies: Any) -> None:
    records = TenancyRecords(c.store)
    await records.create_tenant("acme")
    await records.create_namespace("acme/orders", policies=NamespacePolicies(**policies))


def used(md: Any) -> set[str]:
    return {b for ensemble in md.ensembles.values() for b in ensemble}


# -- the policies alone -----------------------------------------------------------------------


def nodes(spec: Mapping[str, tuple[str, str]]) -> list[BookieNode]:
    return [BookieNode(b, rack, group=group) for b, (rack, group) in spec.items()]


def test_an_isolated_policy_places_and_replaces_inside_its_group_only() -> None:
    cands = nodes({f"b{i}": (f"/r/k{i % 2}", "gold" if i < 4 else "") for i in range(8)})
    policy = IsolatedPlacementPolicy(RackAwarePlacementPolicy(), "gold")
    for seed in range(30):
        rng = random.Random(seed)
        ensemble = policy.new_ensemble(cands, 3, 2, rng)
        assert set(ensemble) <= {"b0", "b1", "b2", "b3"}
        spare = policy.replace_bookie(cands, ensemble, 1, 2, rng)
        assert spare in {"b0", "b1", "b2", "b3"} and spare not in ensemble
    ensemble = ["b0", "b1", "b2"]
    with pytest.raises(NotEnoughBookiesError,
                       match=r"'gold' has 4 writable .* 0 of them usable; replacing b0 "
                             r".*\(4 writable bookies outside"):
        policy.replace_bookie(cands, ensemble, 0, 2, random.Random(1), exclude=["b3"])
    with pytest.raises(NotEnoughBookiesError,
                       match=r"isolation group 'gold' has 4 .* 4 of them usable; an ensemble "
                             r"needs 5"):
        policy.new_ensemble(cands, 5, 2, random.Random(1))


def test_region_aware_write_sets_span_min_regions_then_racks() -> None:
    spec = {f"b{i}": (f"/reg{i % 3}/rack{i % 2}", "") for i in range(9)}
    cands = nodes(spec)
    policy = RegionAwarePlacementPolicy(min_regions=2)
    for seed in range(50):
        rng = random.Random(seed)
        for size, wq in ((3, 2), (5, 3), (4, 2), (6, 3)):
            ensemble = policy.new_ensemble(cands, size, wq, rng)
            for ws in write_sets(size, wq):
                assert len({region_of(spec[ensemble[i]][0]) for i in ws}) >= 2, ensemble
            target = policy.replace_bookie(cands, ensemble, 0, wq, rng)
            new = [target, *ensemble[1:]]
            for ws in write_sets(size, wq):
                assert len({region_of(spec[new[i]][0]) for i in ws}) >= 2, new
    three = RegionAwarePlacementPolicy(min_regions=3)
    ensemble = three.new_ensemble(cands, 3, 3, random.Random(0))
    assert {region_of(spec[b][0]) for b in ensemble} == {"reg0", "reg1", "reg2"}
    one_region = nodes({f"b{i}": ("/only/rack", "") for i in range(4)})
    assert len(policy.new_ensemble(one_region, 3, 2, random.Random(0))) == 3  # best effort
    with pytest.raises(NotEnoughBookiesError, match="2 regions"):
        RegionAwarePlacementPolicy(strict=True).new_ensemble(one_region, 3, 2,
                                                             random.Random(0))
    with pytest.raises(ValueError, match="min_regions"):
        RegionAwarePlacementPolicy(min_regions=0)
    assert region_of("") == "default-region" and region_of("/eu/r1") == "eu"


def test_a_namespace_chooses_its_policy() -> None:
    base = pybk.DefaultPlacementPolicy()
    assert isinstance(policy_for_namespace(base, NamespacePolicies()), RackAwarePlacementPolicy)
    region = policy_for_namespace(base, NamespacePolicies(placement="region-aware",
                                                          min_regions=3))
    assert isinstance(region, RegionAwarePlacementPolicy) and region.min_regions == 3
    iso = policy_for_namespace(base, NamespacePolicies(isolation_group="gold"))
    assert isinstance(iso, IsolatedPlacementPolicy) and iso.group == "gold"


# -- on a cluster -----------------------------------------------------------------------------


async def test_ledgers_of_a_bound_namespace_live_on_its_group_and_stay_there() -> None:
    async with cluster() as c:
        await namespace(c, isolation_group="gold")
        client = c.client()
        handles = [await client.create_ledger(3, 2, 2, custom_metadata=NS) for _ in range(6)]
        assert all(used(h.metadata) <= set(GOLD) for h in handles)
        free = await client.create_ledger(3, 2, 2)  # no namespace: anywhere, as before
        assert free.metadata.ensembles[0]
        # a bookie of the group fails under a writer: the replacement is from the group
        lh = handles[0]
        await lh.append(b"before")
        victim = lh.metadata.ensembles[0][0]
        await c.stop_bookie(victim)
        for i in range(5):
            await lh.append(b"after %d" % i)
        md = await c.store.read_ledger(lh.id)
        assert len(md.ensembles) == 2 and used(md) <= set(GOLD)
        assert victim not in md.ensembles[max(md.ensembles)]
        # the group is down to 3: another failure leaves no spare inside it, and the
        # writer does not spill out (it writes around, or fails naming the group)
        await c.stop_bookie(next(b for b in md.ensembles[max(md.ensembles)]))
        try:
            for i in range(3):
                await lh.append(b"later %d" % i)
        except NotEnoughBookiesError as exc:
            assert "gold" in str(exc)
        assert used(await c.store.read_ledger(lh.id)) <= set(GOLD)


async def test_a_group_too_small_fails_clearly_and_never_spills_out() -> None:
    async with cluster(groups={"bookie-0": "tiny", "bookie-1": "tiny"}) as c:
        await namespace(c, isolation_group="tiny")
        with pytest.raises(NotEnoughBookiesError,
                           match=r"isolation group 'tiny' has 2 .* needs 3 \(5 writable"):
            await c.client().create_ledger(3, 2, 2, custom_metadata=NS)
        assert (await namespace_usage(c.store, "acme/orders")).ledgers == 0
        with pytest.raises(NoSuchNamespaceError):
            await c.client().create_ledger(
                3, 2, 2, custom_metadata={NAMESPACE_KEY: b"acme/nope"})


async def rereplicate(config: ClientConfig) -> tuple[str, set[str]]:
    """Four closed ledgers of the gold namespace, one of their bookies lost for good:
    the lost bookie and the bookies the ledgers use once auto-recovery is done."""
    async with cluster(autorecovery=True, autorecovery_config=FAST,
                       client_config=config) as c:
        await namespace(c, isolation_group="gold")
        client = c.client()
        ids = []
        for n in range(4):
            lh = await client.create_ledger(3, 2, 2, custom_metadata=NS)
            await lh.append_many([b"ledger %d entry %d" % (n, i) for i in range(10)])
            await lh.close()
            ids.append(lh.id)
        lost = (await c.store.read_ledger(ids[0])).ensembles[0][0]
        await c.stop_bookie(lost)

        async def repaired() -> bool:
            if await c.store.list_under_replicated():
                return False
            for i in ids:
                if lost in used(await c.store.read_ledger(i)):
                    return False
            return True

        await wait_until(repaired, 20.0, f"every ledger to stop naming {lost}")
        bookies: set[str] = set()
        for i in ids:
            bookies |= used(await c.store.read_ledger(i))
            rh = await client.open_ledger(i)
            assert len(await rh.read(0, rh.last_add_confirmed)) == 10
        return lost, bookies


async def test_re_replication_keeps_a_group_s_fragments_inside_it() -> None:
    lost, bookies = await rereplicate(CLIENT)
    assert bookies <= set(GOLD) - {lost}


async def test_the_broken_build_re_replicates_out_of_the_group() -> None:
    broken = ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.0,
                          mutations=frozenset({REREPLICATION_LEAVES_GROUP}))
    _, bookies = await rereplicate(broken)
    assert not bookies <= set(GOLD)  # (this seed's replacements land outside)


async def test_the_mutation_drops_the_group_for_re_replication_only() -> None:
    broken = ClientConfig(mutations=frozenset({REREPLICATION_LEAVES_GROUP}))
    async with cluster(client_config=broken) as c:
        await namespace(c, isolation_group="gold")
        ctx = c.client()._context()
        assert isinstance(await placement_for(ctx, NS), IsolatedPlacementPolicy)
        assert not isinstance(await placement_for(ctx, NS, rereplication=True),
                              IsolatedPlacementPolicy)


async def test_a_region_aware_namespace_spreads_its_write_sets() -> None:
    racks = {f"bookie-{i}": f"/region-{i % 3}/rack-{i % 2}" for i in range(6)}
    async with cluster(6, groups={}, racks=racks) as c:
        await namespace(c, placement="region-aware", min_regions=3)
        client = c.client()
        for _ in range(5):
            lh = await client.create_ledger(3, 3, 2, custom_metadata=NS)
            assert {racks[b].split("/")[1] for b in lh.metadata.ensembles[0]} == {
                "region-0", "region-1", "region-2"}


# -- the ledger-count quota -------------------------------------------------------------------


async def test_concurrent_creates_never_pass_max_ledgers() -> None:
    async with cluster(5, groups={}) as c:
        await namespace(c, max_ledgers=4)
        clients = [c.client() for _ in range(3)]
        results = await asyncio.gather(
            *(clients[n % 3].create_ledger(3, 2, 2, custom_metadata=NS) for n in range(12)),
            return_exceptions=True)
        made = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, QuotaExceededError)]
        assert len(made) == 4 and len(refused) == 8, results
        assert "max_ledgers" in str(refused[0])
        assert (await namespace_usage(c.store, "acme/orders")).ledgers == 4
        await clients[0].delete_ledger(made[0].id)  # deleting frees a place
        assert (await namespace_usage(c.store, "acme/orders")).ledgers == 3
        await clients[1].create_ledger(3, 2, 2, custom_metadata=NS)
        with pytest.raises(QuotaExceededError):
            await clients[2].create_ledger(3, 2, 2, custom_metadata=NS)
