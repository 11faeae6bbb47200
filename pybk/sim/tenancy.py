"""Tenancy in the simulator (``Workload(tenancy=True)``): bookies in regions and an
isolation group, and half the writers' ledgers in a namespace bound to that group and placed
region-aware, under every fault the seed draws (auto-recovery included).

Invariants, judged on every ledger metadata write as it is applied:

- **T1**: no ensemble of a namespace ledger (its first, any ensemble change, any
  re-replication) names a bookie outside the namespace's isolation group.
- **T2**: a namespace ledger's first ensemble spreads each write set over
  ``min(min_regions, Qw)`` regions whenever an order of its bookies' regions allows it
  (judged by brute force, as the racks' P1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybk.client.placement import region_of
from pybk.errors import BKError
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords
from pybk.sim.checker import Violation
from pybk.sim.cluster import derive_rng
from pybk.sim.racks import best_spread, fewest_racks

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["GROUP", "NAMESPACE", "TenancySim"]

NAMESPACE = "sim/gold"
GROUP = "gold"
MIN_REGIONS = 2


class TenancySim:
    """Groups and regions for one run's bookies, the namespace, and the T1/T2 checks."""

    name = "tenancy"

    @classmethod
    def for_run(cls, run: SimRun) -> TenancySim | None:
        return cls(run) if getattr(run.workload, "tenancy", False) else None

    def __init__(self, run: SimRun) -> None:
        self.run = run
        rng = derive_rng(run.seed, "tenancy")
        ids = sorted(run.cluster.bookie_ids, key=lambda b: int(b[1:]))
        regions = rng.choice((2, 3))
        e = run.topology[0]
        run.cluster.racks.update(
            {b: f"/region-{i % regions}/rack-{i // regions % 2}" for i, b in enumerate(ids)})
        #: the group: the ensemble size and one spare (or every bookie, when fewer)
        self.group = set(ids[:e + 1])
        run.cluster.groups.update({b: GROUP for b in self.group})
        self.namespace_ledgers: set[int] = set()
        self.violations: list[Violation] = []
        run.cluster.on_meta_applied.append(self._meta_applied)
        run.cover(f"config_tenancy_regions_{regions}")

    async def start(self) -> None:
        records = TenancyRecords(self.run.cluster.admin)  # (never faulted)
        await records.create_tenant("sim")
        await records.create_namespace(NAMESPACE, policies=NamespacePolicies(
            isolation_group=GROUP, placement="region-aware", min_regions=MIN_REGIONS))
        self.run.registry.namespace = NAMESPACE

    async def settle(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def _meta_applied(self, op: str, key: object) -> None:
        if op not in ("create_ledger", "write_ledger") or not isinstance(key, int):
            return
        try:
            md = self.run.cluster.store.peek_ledger(key)
        except (KeyError, BKError):
            return
        if op == "create_ledger":
            if md.custom_metadata.get(NAMESPACE_KEY) != NAMESPACE.encode():
                return
            self.namespace_ledgers.add(key)
            self.run.cover("tenancy_ledger_created")
            self._check_regions(key, md.write_quorum, md.ensembles[min(md.ensembles)])
        elif key not in self.namespace_ledgers:
            return
        elif len(md.ensembles) > 1:
            self.run.cover("tenancy_ensemble_changed")
        for first, ensemble in sorted(md.ensembles.items()):
            outside = sorted(set(ensemble) - self.group)
            if outside:
                self.violations.append(Violation(
                    "T1", key, first,
                    f"ledger {key} of namespace {NAMESPACE} (group {GROUP}: "
                    f"{sorted(self.group)}) has ensemble {list(ensemble)} from entry {first}, "
                    f"with {outside} outside its isolation group ({op})"))
                return

    def _check_regions(self, ledger: int, write_quorum: int,
                       ensemble: tuple[str, ...]) -> None:
        racks = self.run.cluster.racks
        order = tuple(region_of(racks.get(b, "")) for b in ensemble)
        wanted = min(MIN_REGIONS, write_quorum)
        got = fewest_racks(order, write_quorum)
        if got < wanted <= best_spread(order, write_quorum):
            self.violations.append(Violation(
                "T2", ledger, -1,
                f"ledger {ledger}'s ensemble {list(ensemble)} (regions {list(order)}) has a "
                f"write set of {write_quorum} in {got} region(s); an order of the same "
                f"bookies spans {wanted}"))

    def check(self) -> list[Violation]:
        return list(self.violations)
