"""Placement: which bookies a ledger's ensemble, an ensemble change and a re-replication use.

BookKeeper's ``EnsemblePlacementPolicy`` seam, sans-IO: a :class:`PlacementPolicy` gets the
candidates (:class:`BookieNode`: id, rack, free disk when known) and an injected
``random.Random`` and answers with bookie ids; :func:`writable_nodes` is the one async
driver that turns the registry (and, for disk-weighted placement, the bookies' own disk
reports) into candidates. Three questions are asked of a policy:

* :meth:`~PlacementPolicy.new_ensemble` when a ledger is created;
* :meth:`~PlacementPolicy.replace_bookie` when a writer replaces a failed bookie (ensemble
  change) and when auto-recovery moves a lost bookie's fragment elsewhere;
* :meth:`~PlacementPolicy.read_order` for the replicas a read tries (local rack first).

Design notes: docs/internals.md, "pybk/client/placement.py".
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from pybk.errors import BKError, NotEnoughBookiesError
from pybk.runtime.eventloop import gather

if TYPE_CHECKING:
    from pybk.client.context import ClientContext

__all__ = [
    "DEFAULT_RACK",
    "RACK_PLAN_IGNORES_WRAP",
    "BookieNode",
    "DefaultPlacementPolicy",
    "PlacementPolicy",
    "RackAwarePlacementPolicy",
    "RegionAwarePlacementPolicy",
    "min_racks_per_write_set",
    "refresh_topology",
    "region_of",
    "writable_nodes",
]

log = logging.getLogger(__name__)

#: The location of a bookie that registered none (BookKeeper's default rack).
DEFAULT_RACK: Final = "/default-region/default-rack"

#: Search steps the rack-aware policy spends on one ensemble before settling for less.
_SEARCH_BUDGET: Final = 20_000

#: mutation switch (a name in ``mutations``; registry: ``pybk.testing.mutations``): the
#: rack plan forgets the write sets that wrap around the ensemble's end
RACK_PLAN_IGNORES_WRAP: Final = "rack_plan_ignores_wrap"


@dataclass(frozen=True, slots=True)
class BookieNode:
    """A candidate bookie: its id, its rack, its free disk in bytes when known, its
    isolation group ("" when in none)."""

    bookie_id: str
    rack: str = DEFAULT_RACK
    free_bytes: int | None = None
    group: str = ""


def region_of(rack: str) -> str:
    """A location's region: the first component of ``/region/rack``."""
    return (rack or DEFAULT_RACK).lstrip("/").split("/", 1)[0]


def write_sets(ensemble_size: int, write_quorum: int) -> list[list[int]]:
    """The ensemble slots of each distinct write set (entry ``e`` uses set ``e % E``)."""
    return [[(s + i) % ensemble_size for i in range(write_quorum)] for s in range(ensemble_size)]


def min_racks_per_write_set(
    ensemble: Sequence[str], write_quorum: int, rack_of: Mapping[str, str]
) -> int:
    """The fewest distinct racks any write set of ``ensemble`` spans."""
    if not ensemble:
        return 0
    return min(
        len({rack_of.get(ensemble[i], DEFAULT_RACK) for i in ws})
        for ws in write_sets(len(ensemble), write_quorum)
    )


def _check_sizes(ensemble_size: int, write_quorum: int) -> None:
    if not 1 <= write_quorum <= ensemble_size:
        raise ValueError(f"need 1 <= write_quorum <= ensemble_size, got {write_quorum}, "
                         f"{ensemble_size}")


def _ensemble_candidates(candidates: Sequence[BookieNode], ensemble_size: int,
                         write_quorum: int, exclude: Sequence[str]) -> list[BookieNode]:
    """The bookies a new ensemble may use (sizes checked); NotEnoughBookiesError when they
    are too few."""
    _check_sizes(ensemble_size, write_quorum)
    nodes = _eligible(candidates, exclude)
    if len(nodes) < ensemble_size:
        raise NotEnoughBookiesError(
            f"need {ensemble_size} writable bookies, have {len(nodes)}: "
            f"{[n.bookie_id for n in nodes]}")
    return nodes


def _replacements(candidates: Sequence[BookieNode], ensemble: Sequence[str], index: int,
                  exclude: Sequence[str]) -> list[BookieNode]:
    """The bookies that may take slot ``index`` of ``ensemble`` (none of its members, none of
    ``exclude``); NotEnoughBookiesError when there is none."""
    nodes = _eligible(candidates, [*ensemble, *exclude])
    if not nodes:
        raise NotEnoughBookiesError(
            f"no writable bookie left to replace {ensemble[index]} (slot {index}) of "
            f"{list(ensemble)}")
    return nodes


def _eligible(candidates: Sequence[BookieNode], exclude: Sequence[str]) -> list[BookieNode]:
    """Distinct candidates not excluded, in id order (the rng alone decides, not the input
    order: the simulator needs the same choice for the same seed)."""
    excluded = set(exclude)
    seen: dict[str, BookieNode] = {}
    for node in candidates:
        if node.bookie_id not in excluded and node.bookie_id not in seen:
            seen[node.bookie_id] = node
    return [seen[b] for b in sorted(seen)]


class PlacementPolicy(abc.ABC):
    """Chooses bookies; see the module doc. Implementations are pure (no I/O): all they
    know is passed in, and all their randomness comes from the ``rng`` argument."""

    #: ask :func:`writable_nodes` to fill in ``free_bytes`` (one BookieInfo request per
    #: candidate, cached)
    wants_disk_usage: bool = False

    @abc.abstractmethod
    def new_ensemble(
        self,
        candidates: Sequence[BookieNode],
        ensemble_size: int,
        write_quorum: int,
        rng: random.Random,
        exclude: Sequence[str] = (),
    ) -> list[str]:
        """``ensemble_size`` distinct bookies for a new ledger (NotEnoughBookiesError when
        the candidates cannot make one)."""

    @abc.abstractmethod
    def replace_bookie(
        self,
        candidates: Sequence[BookieNode],
        ensemble: Sequence[str],
        index: int,
        write_quorum: int,
        rng: random.Random,
        exclude: Sequence[str] = (),
    ) -> str:
        """A bookie for slot ``index`` of ``ensemble`` (whose other slots stay), never one
        already in the ensemble or in ``exclude`` (NotEnoughBookiesError when none fits)."""

    def read_order(self, replicas: Sequence[str], rack_of: Mapping[str, str]) -> list[str]:
        """The order a read tries ``replicas`` in (default: as given, the write set order)."""
        return list(replicas)

    #: the rack reads prefer (None: no preference); read by the read path to skip the
    #: per-entry reordering when there is nothing to prefer
    local_rack: str | None = None


def _weights(nodes: Sequence[BookieNode], max_multiple: float) -> list[float]:
    """Free-disk weights, each at most ``max_multiple`` x the median of the known ones;
    a bookie that did not report gets the median."""
    known = sorted(n.free_bytes for n in nodes if n.free_bytes is not None)
    if not known:
        return [1.0] * len(nodes)
    median = float(known[len(known) // 2]) or 1.0
    cap = median * max_multiple
    return [min(float(n.free_bytes), cap) if n.free_bytes is not None else median
            for n in nodes]


def _sample(nodes: Sequence[BookieNode], count: int, rng: random.Random,
            weights: Sequence[float] | None) -> list[BookieNode]:
    """``count`` distinct nodes, uniformly or by weight (without replacement)."""
    if weights is None:
        return rng.sample(list(nodes), count)
    pool = list(zip(nodes, weights, strict=True))
    out: list[BookieNode] = []
    for _ in range(count):
        total = sum(max(w, 0.0) for _, w in pool)
        if total <= 0:
            picked = rng.randrange(len(pool))
        else:
            x = rng.random() * total
            picked = len(pool) - 1
            for i, (_, w) in enumerate(pool):
                x -= max(w, 0.0)
                if x < 0:
                    picked = i
                    break
        out.append(pool.pop(picked)[0])
    return out


class DefaultPlacementPolicy(PlacementPolicy):
    """Random among writable bookies; optionally weighted by their free disk."""

    def __init__(self, *, disk_weighted: bool = False, max_weight_multiple: float = 3.0,
                 local_rack: str | None = None) -> None:
        if max_weight_multiple < 1:
            raise ValueError(f"max_weight_multiple must be >= 1, got {max_weight_multiple}")
        self.disk_weighted = disk_weighted
        self.wants_disk_usage = disk_weighted
        self.max_weight_multiple = max_weight_multiple
        self.local_rack = local_rack

    def _pick(self, nodes: Sequence[BookieNode], count: int, rng: random.Random) -> list[str]:
        weights = _weights(nodes, self.max_weight_multiple) if self.disk_weighted else None
        return [n.bookie_id for n in _sample(nodes, count, rng, weights)]

    def new_ensemble(self, candidates: Sequence[BookieNode], ensemble_size: int,
                     write_quorum: int, rng: random.Random,
                     exclude: Sequence[str] = ()) -> list[str]:
        nodes = _ensemble_candidates(candidates, ensemble_size, write_quorum, exclude)
        return self._pick(nodes, ensemble_size, rng)

    def replace_bookie(self, candidates: Sequence[BookieNode], ensemble: Sequence[str],
                       index: int, write_quorum: int, rng: random.Random,
                       exclude: Sequence[str] = ()) -> str:
        nodes = _replacements(candidates, ensemble, index, exclude)
        return self._pick(nodes, 1, rng)[0]

    def read_order(self, replicas: Sequence[str], rack_of: Mapping[str, str]) -> list[str]:
        return _local_first(replicas, rack_of, self.local_rack)


def _local_first(replicas: Sequence[str], rack_of: Mapping[str, str],
                 local: str | None) -> list[str]:
    if local is None:
        return list(replicas)
    near = [b for b in replicas if rack_of.get(b) == local]
    return near + [b for b in replicas if rack_of.get(b) != local]


class RackAwarePlacementPolicy(DefaultPlacementPolicy):
    """Spread each write set over racks (see the module doc).

    ``racks`` overrides or supplies locations by bookie id (BookKeeper's static
    DNS-to-switch table); otherwise a bookie's registered rack is used, and
    :data:`DEFAULT_RACK` when it registered none.
    """

    def __init__(self, *, min_racks_per_write_quorum: int = 2, strict: bool = False,
                 racks: Mapping[str, str] | None = None, local_rack: str | None = None,
                 disk_weighted: bool = False, max_weight_multiple: float = 3.0,
                 mutations: frozenset[str] = frozenset()) -> None:
        super().__init__(disk_weighted=disk_weighted, max_weight_multiple=max_weight_multiple,
                         local_rack=local_rack)
        #: deliberately broken builds for the simulator's checks (empty in production)
        self.mutations = mutations
        if min_racks_per_write_quorum < 1:
            raise ValueError(
                f"min_racks_per_write_quorum must be >= 1, got {min_racks_per_write_quorum}")
        self.min_racks = min_racks_per_write_quorum
        self.strict = strict
        self.racks = dict(racks or {})

    def rack(self, node: BookieNode) -> str:
        return self.racks.get(node.bookie_id) or node.rack or DEFAULT_RACK

    # -- new ensembles ---------------------------------------------------------------------

    def new_ensemble(self, candidates: Sequence[BookieNode], ensemble_size: int,
                     write_quorum: int, rng: random.Random,
                     exclude: Sequence[str] = ()) -> list[str]:
        nodes = _ensemble_candidates(candidates, ensemble_size, write_quorum, exclude)
        by_rack: dict[str, list[BookieNode]] = {}
        for node in nodes:
            by_rack.setdefault(self.rack(node), []).append(node)
        wanted = min(self.min_racks, write_quorum)
        best = min(wanted, len(by_rack))
        for target in range(best, 0, -1):
            plan = _rack_plan(by_rack, ensemble_size, write_quorum, target, rng,
                              wrap=RACK_PLAN_IGNORES_WRAP not in self.mutations)
            if plan is not None:
                if self.strict and target < wanted:
                    break
                return self._fill(plan, by_rack, rng)
        raise NotEnoughBookiesError(
            f"cannot spread each write set of {write_quorum} over {wanted} racks with "
            f"{ensemble_size} bookies from {len(nodes)} writable ones in racks "
            f"{ {r: len(b) for r, b in sorted(by_rack.items())} } (strict placement)")

    def _fill(self, plan: list[str], by_rack: Mapping[str, list[BookieNode]],
              rng: random.Random) -> list[str]:
        """Bookies for a sequence of racks: within each rack, chosen like the default
        policy (uniform or by free disk)."""
        need: dict[str, int] = {}
        for rack in plan:
            need[rack] = need.get(rack, 0) + 1
        chosen = {rack: self._pick(by_rack[rack], n, rng) for rack, n in need.items()}
        return [chosen[rack].pop() for rack in plan]

    # -- replacements ----------------------------------------------------------------------

    def replace_bookie(self, candidates: Sequence[BookieNode], ensemble: Sequence[str],
                       index: int, write_quorum: int, rng: random.Random,
                       exclude: Sequence[str] = ()) -> str:
        nodes = _replacements(candidates, ensemble, index, exclude)
        rack_of = {n.bookie_id: self.rack(n) for n in candidates}
        size = len(ensemble)
        windows = [ws for ws in write_sets(size, write_quorum) if index in ws]

        def score(rack: str) -> int:  # the fewest racks a write set through the slot spans
            return min(len({rack} | {rack_of.get(ensemble[i], DEFAULT_RACK)
                                     for i in ws if i != index}) for ws in windows)

        racks = sorted({self.rack(n) for n in nodes})
        scores = {r: score(r) for r in racks}
        top = max(scores.values())
        wanted = min(self.min_racks, write_quorum)
        if self.strict and top < wanted:
            raise NotEnoughBookiesError(
                f"no writable bookie keeps every write set through slot {index} of "
                f"{list(ensemble)} on {wanted} racks (strict placement); candidates' racks: "
                f"{racks}")
        best = [n for n in nodes if scores[self.rack(n)] == top]
        return self._pick(best, 1, rng)[0]


class RegionAwarePlacementPolicy(RackAwarePlacementPolicy):
    """Spread each write set over regions (the first component of ``/region/rack``), then
    over racks within a region: every write set spans ``min_regions`` regions when the
    writable bookies allow it (fewer when not, unless ``strict``)."""

    def __init__(self, *, min_regions: int = 2, strict: bool = False,
                 racks: Mapping[str, str] | None = None, local_rack: str | None = None,
                 disk_weighted: bool = False, max_weight_multiple: float = 3.0,
                 mutations: frozenset[str] = frozenset()) -> None:
        super().__init__(strict=strict, racks=racks, local_rack=local_rack,
                         disk_weighted=disk_weighted, max_weight_multiple=max_weight_multiple,
                         mutations=mutations)
        if isinstance(min_regions, bool) or not isinstance(min_regions, int) \
                or min_regions < 1:
            raise ValueError(f"min_regions must be an int >= 1, got {min_regions!r}")
        self.min_regions = min_regions

    def region(self, node: BookieNode) -> str:
        return region_of(self.rack(node))

    def new_ensemble(self, candidates: Sequence[BookieNode], ensemble_size: int,
                     write_quorum: int, rng: random.Random,
                     exclude: Sequence[str] = ()) -> list[str]:
        nodes = _ensemble_candidates(candidates, ensemble_size, write_quorum, exclude)
        by_region: dict[str, list[BookieNode]] = {}
        for node in nodes:
            by_region.setdefault(self.region(node), []).append(node)
        wanted = min(self.min_regions, write_quorum)
        for target in range(min(wanted, len(by_region)), 0, -1):
            if self.strict and target < wanted:
                break
            plan = _rack_plan(by_region, ensemble_size, write_quorum, target, rng)
            if plan is not None:
                need: dict[str, int] = {}
                for region in plan:
                    need[region] = need.get(region, 0) + 1
                chosen = {r: self._spread(by_region[r], n, rng) for r, n in need.items()}
                return [chosen[region].pop(0) for region in plan]
        raise NotEnoughBookiesError(
            f"cannot spread each write set of {write_quorum} over {wanted} regions with "
            f"{ensemble_size} bookies from {len(nodes)} writable ones in regions "
            f"{ {r: len(b) for r, b in sorted(by_region.items())} } (strict placement)")

    def _spread(self, nodes: Sequence[BookieNode], count: int,
                rng: random.Random) -> list[str]:
        """``count`` bookies of one region, taken from its racks in turn."""
        by_rack: dict[str, list[BookieNode]] = {}
        for node in nodes:
            by_rack.setdefault(self.rack(node), []).append(node)
        racks = sorted(by_rack)
        rng.shuffle(racks)
        pools = {r: self._pick(by_rack[r], len(by_rack[r]), rng) for r in racks}
        out: list[str] = []
        while len(out) < count:
            for rack in racks:
                if pools[rack] and len(out) < count:
                    out.append(pools[rack].pop(0))
        return out

    def replace_bookie(self, candidates: Sequence[BookieNode], ensemble: Sequence[str],
                       index: int, write_quorum: int, rng: random.Random,
                       exclude: Sequence[str] = ()) -> str:
        nodes = _replacements(candidates, ensemble, index, exclude)
        rack_of = {n.bookie_id: self.rack(n) for n in candidates}
        windows = [ws for ws in write_sets(len(ensemble), write_quorum) if index in ws]
        others = [[rack_of.get(ensemble[i], DEFAULT_RACK) for i in ws if i != index]
                  for ws in windows]

        def score(rack: str) -> tuple[int, int]:  # fewest regions, then racks, of a window
            return (min(len({region_of(r) for r in [rack, *o]}) for o in others),
                    min(len({rack, *o}) for o in others))

        scores = {self.rack(n): score(self.rack(n)) for n in nodes}
        top = max(scores.values())
        wanted = min(self.min_regions, write_quorum)
        if self.strict and top[0] < wanted:
            raise NotEnoughBookiesError(
                f"no writable bookie keeps every write set through slot {index} of "
                f"{list(ensemble)} on {wanted} regions (strict placement)")
        return self._pick([n for n in nodes if scores[self.rack(n)] == top], 1, rng)[0]


def _rack_plan(by_rack: Mapping[str, list[BookieNode]], size: int, write_quorum: int,
               target: int, rng: random.Random, wrap: bool = True) -> list[str] | None:
    """A rack for each ensemble slot such that every cyclic window of ``write_quorum`` slots
    spans at least ``target`` racks and no rack is used more often than it has bookies;
    None when there is none (or the search budget ran out). Depth-first, racks tried in an
    order shuffled by ``rng`` (so equal choices spread), racks with more bookies left first
    (they are the ones that run out last)."""
    capacity = {r: len(b) for r, b in by_rack.items()}
    names = sorted(capacity)
    plan: list[str] = []
    steps = 0

    def window_ok(start: int) -> bool:
        return len({plan[(start + i) % size] for i in range(write_quorum)}) >= target

    def place(pos: int) -> bool:
        nonlocal steps
        if pos == size:  # the windows that wrap around the end
            return not wrap or all(window_ok(s)
                                   for s in range(max(0, size - write_quorum + 1), size))
        order = names[:]
        rng.shuffle(order)
        order.sort(key=lambda r: -capacity[r])
        for rack in order:
            steps += 1
            if steps > _SEARCH_BUDGET:
                return False
            if capacity[rack] == 0:
                continue
            plan.append(rack)
            capacity[rack] -= 1
            start = pos - write_quorum + 1
            if (start < 0 or window_ok(start)) and _prefix_can_finish(plan, pos, write_quorum,
                                                                      target) and place(pos + 1):
                return True
            plan.pop()
            capacity[rack] += 1
        return False

    return plan if place(0) else None


def _prefix_can_finish(plan: Sequence[str], pos: int, write_quorum: int, target: int) -> bool:
    """Prune: the window still being filled (ending at ``pos``) must be able to reach
    ``target`` racks with the slots it has left."""
    start = max(0, pos - write_quorum + 1)
    have = len(set(plan[start:pos + 1]))
    left = write_quorum - (pos + 1 - start)
    return have + left >= target


async def writable_nodes(ctx: ClientContext, policy: PlacementPolicy | None = None,
                         exclude: Sequence[str] = ()) -> list[BookieNode]:
    """The candidates for placement: writable registered bookies with their racks, and
    their free disk when the policy weighs by it (asked with BookieInfo requests, cached
    for ``ctx.config.disk_usage_cache_ttl`` seconds of loop time)."""
    policy = policy if policy is not None else ctx.policy
    regs = await ctx.store.list_bookies()
    ctx.topology.update({r.bookie_id: r.rack or DEFAULT_RACK for r in regs})
    excluded = set(exclude)
    nodes = [BookieNode(r.bookie_id, r.rack or DEFAULT_RACK, group=r.group) for r in regs
             if not r.read_only and r.bookie_id not in excluded]
    if policy.wants_disk_usage and nodes:
        free = await _free_bytes(ctx, [n.bookie_id for n in nodes])
        nodes = [BookieNode(n.bookie_id, n.rack, free.get(n.bookie_id), n.group)
                 for n in nodes]
    return nodes


async def explain_shortage(ctx: ClientContext,
                           exc: NotEnoughBookiesError) -> NotEnoughBookiesError:
    """``exc`` with the reason a user needs first: no bookie registered at all, or registered
    bookies that are read-only (a disk past its ``disk_usage_threshold``, 95% by default, or
    a failed journal: the bookie's log says which)."""
    regs = await ctx.store.list_bookies()
    if not regs:
        return NotEnoughBookiesError(f"{exc}; no bookie is registered in the metadata store")
    read_only = sorted(r.bookie_id for r in regs if r.read_only)
    if not read_only:  # (more than chosen from: a registration back, a state flipped)
        return NotEnoughBookiesError(
            f"{exc}; registered now, none read-only: {sorted(r.bookie_id for r in regs)}")
    return NotEnoughBookiesError(
        f"{exc}; read-only: {read_only} (a bookie turns read-only when its disk is fuller "
        f"than its disk_usage_threshold, 95% by default, or its journal failed: its log "
        f"says which)")


async def refresh_topology(ctx: ClientContext) -> None:
    """Learn every registered bookie's rack (reads that prefer the local rack need them)."""
    regs = await ctx.store.list_bookies()
    ctx.topology.update({r.bookie_id: r.rack or DEFAULT_RACK for r in regs})


async def _free_bytes(ctx: ClientContext, bookies: list[str]) -> dict[str, int]:
    from pybk.wire import BookieInfoRequest, BookieInfoResponse, Status

    loop = asyncio.get_running_loop()
    now = loop.time()
    cache = ctx.disk_usage
    stale = [b for b in bookies if b not in cache or cache[b][1] <= now]
    if stale:
        timeout = min(ctx.config.read_timeout, 2.0)
        futures = [ctx.transport.send(b, BookieInfoRequest(), timeout) for b in stale]
        results = await gather(*futures, return_exceptions=True)
        expires = now + ctx.config.disk_usage_cache_ttl
        for bookie, result in zip(stale, results, strict=True):
            if isinstance(result, BookieInfoResponse) and result.status == Status.OK:
                cache[bookie] = (int(result.free_bytes), expires)
            elif isinstance(result, BaseException) and not isinstance(result, BKError):
                raise result
            else:
                cache.pop(bookie, None)  # unknown: weighted as the median
    return {b: cache[b][0] for b in bookies if b in cache}
