"""Placement under a namespace's policies: isolation groups and the rack/region choice.

A ledger whose custom metadata names a namespace (:data:`pybk.metadata.tenancy.NAMESPACE_KEY`)
is placed by that namespace's policies: ``placement`` picks the rack-aware or the
region-aware policy, and ``isolation_group`` confines every ensemble, ensemble change and
re-replication to the bookies registered in that group (:class:`IsolatedPlacementPolicy`).
A group too small fails with :class:`~pybk.errors.NotEnoughBookiesError` naming the group;
placement never spills out of it. :func:`placement_for` is the one lookup every caller
(ledger creation, the writer's ensemble change, the replicator) goes through; it caches a
namespace's policies per client for :data:`POLICY_CACHE_SECONDS` of loop time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from pybk.client.placement import (
    BookieNode,
    PlacementPolicy,
    RackAwarePlacementPolicy,
    RegionAwarePlacementPolicy,
)
from pybk.errors import NoSuchNamespaceError, NotEnoughBookiesError
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords

if TYPE_CHECKING:
    from pybk.client.context import ClientContext

__all__ = [
    "POLICY_CACHE_SECONDS",
    "REREPLICATION_LEAVES_GROUP",
    "IsolatedPlacementPolicy",
    "ledger_namespace",
    "namespace_policies",
    "placement_for",
    "policy_for_namespace",
]

#: how long (loop seconds) a client trusts the namespace policies it read
POLICY_CACHE_SECONDS: Final = 2.0

#: mutation switch (registry: ``pybk.testing.mutations``): re-replication forgets the
#: namespace's isolation group and may move a fragment to any writable bookie
REREPLICATION_LEAVES_GROUP: Final = "rereplication_leaves_group"


class IsolatedPlacementPolicy(PlacementPolicy):
    """``inner``, restricted to the candidates of one isolation group."""

    def __init__(self, inner: PlacementPolicy, group: str) -> None:
        self.inner = inner
        self.group = group
        self.wants_disk_usage = inner.wants_disk_usage
        self.local_rack = inner.local_rack

    def members(self, candidates: Sequence[BookieNode]) -> list[BookieNode]:
        return [n for n in candidates if n.group == self.group]

    def _short(self, what: str, usable: Sequence[str], need: int,
               candidates: Sequence[BookieNode]) -> NotEnoughBookiesError:
        members = {n.bookie_id for n in self.members(candidates)}
        others = len({n.bookie_id for n in candidates} - members)
        return NotEnoughBookiesError(
            f"isolation group {self.group!r} has {len(members)} writable bookies "
            f"{sorted(members)}, {len(usable)} of them usable; {what} needs {need} "
            f"({others} writable bookies outside the group are not used)")

    def new_ensemble(self, candidates: Sequence[BookieNode], ensemble_size: int,
                     write_quorum: int, rng: random.Random,
                     exclude: Sequence[str] = ()) -> list[str]:
        mine = self.members(candidates)
        usable = sorted({n.bookie_id for n in mine} - set(exclude))
        if len(usable) < ensemble_size:
            raise self._short("an ensemble", usable, ensemble_size, candidates)
        return self.inner.new_ensemble(mine, ensemble_size, write_quorum, rng, exclude)

    def replace_bookie(self, candidates: Sequence[BookieNode], ensemble: Sequence[str],
                       index: int, write_quorum: int, rng: random.Random,
                       exclude: Sequence[str] = ()) -> str:
        mine = self.members(candidates)
        usable = sorted({n.bookie_id for n in mine} - set(ensemble) - set(exclude))
        if not usable:
            raise self._short(f"replacing {ensemble[index]} (slot {index})", usable, 1,
                              candidates)
        return self.inner.replace_bookie(mine, ensemble, index, write_quorum, rng, exclude)

    def read_order(self, replicas: Sequence[str], rack_of: Mapping[str, str]) -> list[str]:
        return self.inner.read_order(replicas, rack_of)


def ledger_namespace(custom_metadata: Mapping[str, bytes] | None) -> str | None:
    """The namespace (``tenant/ns``) a ledger's custom metadata names, or None."""
    raw = (custom_metadata or {}).get(NAMESPACE_KEY)
    if raw is None:
        return None
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        raise ValueError(f"custom_metadata[{NAMESPACE_KEY!r}] is not UTF-8: {raw!r}") from None


async def namespace_policies(ctx: ClientContext, namespace: str) -> NamespacePolicies:
    """The namespace's policies (cached per client briefly); NoSuchNamespaceError."""
    now = asyncio.get_running_loop().time()
    cached = ctx.namespace_policies.get(namespace)
    if cached is not None and cached[1] > now:
        return cached[0]
    info = await TenancyRecords(ctx.store).namespace(namespace)
    ctx.namespace_policies[namespace] = (info.policies, now + POLICY_CACHE_SECONDS)
    return info.policies


def policy_for_namespace(base: PlacementPolicy, policies: NamespacePolicies,
                         mutations: frozenset[str] = frozenset()) -> PlacementPolicy:
    """The policy a namespace's ledgers are placed by, given the client's own ``base``."""
    disk = bool(getattr(base, "disk_weighted", False))
    policy: PlacementPolicy
    if policies.placement == "region-aware":
        policy = RegionAwarePlacementPolicy(
            min_regions=policies.min_regions, local_rack=base.local_rack, disk_weighted=disk,
            racks=getattr(base, "racks", None), mutations=mutations)
    elif isinstance(base, RackAwarePlacementPolicy):
        policy = base
    else:
        policy = RackAwarePlacementPolicy(local_rack=base.local_rack, disk_weighted=disk,
                                          mutations=mutations)
    if policies.isolation_group is not None:
        policy = IsolatedPlacementPolicy(policy, policies.isolation_group)
    return policy


async def placement_for(ctx: ClientContext, custom_metadata: Mapping[str, bytes] | None, *,
                        creating: bool = False, rereplication: bool = False
                        ) -> PlacementPolicy:
    """The policy for a ledger with this custom metadata: the client's own when it names
    no namespace. ``creating``: a namespace that does not exist is an error
    (NoSuchNamespaceError); for an existing ledger whose namespace was deleted since, the
    client's own policy applies."""
    namespace = ledger_namespace(custom_metadata)
    if namespace is None:
        return ctx.policy
    try:
        policies = await namespace_policies(ctx, namespace)
    except NoSuchNamespaceError:
        if creating:
            raise
        return ctx.policy
    if rereplication and REREPLICATION_LEAVES_GROUP in ctx.config.mutations:
        policies = NamespacePolicies.from_dict({**policies.to_dict(), "isolation_group": None})
    return policy_for_namespace(ctx.policy, policies, ctx.config.mutations)
