"""The bookies' tenancy gate in the simulator: ``Workload(tenancy=True)`` (beside its groups
and regions, :mod:`pybk.sim.tenancy`) and ``Workload(tenancy_gate=True)`` (drawn in one seed
of sixteen).

Every bookie incarnation runs the production gate (:func:`pybk.bookie.tenancy.enable_tenancy`,
authenticated, on the loop's time and the simulated metadata store) and the simulated network
asks it about every add and read (:mod:`pybk.sim.gated`). Clients have principals as
production derives them (:class:`pybk.transport.identity.Identities`, from the token each is
configured with): the ledger workload's writers, readers, recoverers and deleter are tenant
``sim``, whose namespace ``sim/gold`` (every other ledger of theirs) gets drawn limits (a
storage quota, a write rate of bytes or of records, or both, and a read rate of records, of
bytes, both or none; from streams of their own); a
writer of tenant ``calm`` writes namespace ``calm/main`` (no limits) and plain ledgers, with
a registry of its own; everything else (auto-recovery, the log and table workloads, the
liveness phase's checks) has the cluster's token, as an operator's tools do. Invariants T3-T5:
:mod:`pybk.sim.tenancy_checks`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pybk.bookie.tenancy import enable_tenancy
from pybk.errors import BKError, NoSuchNamespaceError, QuotaExceededError
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords
from pybk.sim.checker import Violation
from pybk.sim.cluster import SimBookie, derive_rng
from pybk.sim.tenancy_checks import GateChecks
from pybk.sim.workload import ProcessEnv, Recoverer, Registry, Writer
from pybk.transport.identity import Identities

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["CALM_NAMESPACE", "NAMESPACE", "GatePolicies", "TenancyGateSim", "TenantWriter",
           "principals"]

NAMESPACE = "sim/gold"
CALM_NAMESPACE = "calm/main"
TOKENS = {"sim-token": "sim", "calm-token": "calm"}
CLUSTER_TOKEN = b"cluster-token"
#: the calm writer adds at the workload's rate divided by this
CALM_SHARE = 4
_NOISY_CLIENTS = re.compile(r"(w|r|rc|d)\d+")
_CALM_CLIENTS = re.compile(r"cw\d+|calm-final")


@dataclass(frozen=True)
class GatePolicies:
    """The noisy namespace's drawn limits."""

    max_storage_bytes: int | None = None
    write_bytes_per_s: int | None = None
    write_records_per_s: int | None = None
    read_records_per_s: int | None = None
    read_bytes_per_s: int | None = None

    @classmethod
    def draw(cls, rng: random.Random, reads: random.Random | None = None) -> GatePolicies:
        """A quota, a write rate (of bytes or of records), or both; and from ``reads`` (a
        stream of its own, so the write limits a seed drew stay put) a read rate of
        records, of bytes, both or none."""
        mode = rng.choice(("quota", "rate", "both"))
        quota = rng.choice((2000, 4000, 8000)) if mode != "rate" else None
        if mode == "quota":
            drawn = cls(max_storage_bytes=quota)
        elif rng.random() < 0.5:
            drawn = cls(quota, write_bytes_per_s=rng.choice((512, 1024, 2048)))
        else:
            drawn = cls(quota, write_records_per_s=rng.choice((8, 16, 32)))
        if reads is None:
            return drawn
        kind = reads.choice(("none", "records", "bytes", "both"))
        records = reads.choice((16, 32, 64)) if kind in ("records", "both") else None
        nbytes = reads.choice((2048, 4096, 8192)) if kind in ("bytes", "both") else None
        return replace(drawn, read_records_per_s=records, read_bytes_per_s=nbytes)

    def apply(self, policies: NamespacePolicies) -> NamespacePolicies:
        return replace(policies, max_storage_bytes=self.max_storage_bytes,
                       write_bytes_per_s=self.write_bytes_per_s,
                       write_records_per_s=self.write_records_per_s,
                       read_records_per_s=self.read_records_per_s,
                       read_bytes_per_s=self.read_bytes_per_s)

    def describe(self) -> str:
        return ",".join(f"{k}={v}" for k, v in vars(self).items() if v is not None)


def principals() -> tuple[Identities, Any]:
    """The bookies' identities and ``principal_of(client)``: the tenant of the token the
    client is configured with, found as a bookie finds it (``Identities.by_token``)."""
    identities = Identities(tokens=dict(TOKENS), cluster_token=CLUSTER_TOKEN)

    def principal_of(client: str) -> str:
        token = (b"sim-token" if _NOISY_CLIENTS.fullmatch(client)
                 else b"calm-token" if _CALM_CLIENTS.fullmatch(client) else CLUSTER_TOKEN)
        found = identities.by_token(token)
        if found is None:
            raise ValueError(f"client {client!r}: token unknown to the bookies")
        return found

    return identities, principal_of


class TenantWriter(Writer):
    """A ledger writer of another tenant: its own registry (namespace, ledgers), so the
    ledger workload's readers and recoverers, another tenant's, never touch its ledgers."""

    def __init__(self, name: str, client: Any, rng: random.Random, env: ProcessEnv,
                 own: ProcessEnv) -> None:
        super().__init__(name, client, rng, own)
        self.respawn_args = (own,)


class TenancyGateSim:
    """The gate on every bookie, the tenants, their namespaces and the calm writer."""

    name = "tenancy_gate"

    @classmethod
    def for_run(cls, run: SimRun) -> TenancyGateSim | None:
        wl = run.workload
        on = getattr(wl, "tenancy", False) or getattr(wl, "tenancy_gate", False)
        return cls(run) if on else None

    def __init__(self, run: SimRun) -> None:
        self.run = run
        #: the noisy namespace's limits (a stream of their own: the other draws stay put)
        self.limits = GatePolicies.draw(derive_rng(run.seed, "tenancy-gate"),
                                        derive_rng(run.seed, "tenancy-gate-reads"))
        #: ledger -> its namespace, for every ledger created in one
        self.ledger_namespace: dict[int, str] = {}
        self.checks = GateChecks(run, NAMESPACE, self.limits, self.ledger_namespace)
        #: the calm tenant's writer has a registry of its own (its namespace, its ledgers),
        #: and writes at a quarter of the workload's rate (what it shows needs no more)
        wl = run.workload
        self.calm_env = replace(run.env, registry=Registry(namespace=CALM_NAMESPACE),
                                workload=replace(wl, add_rate=wl.add_rate / CALM_SHARE))
        _identities, run.cluster.network.principal_of = principals()
        run.cluster.on_bookie_started.append(self._started)
        run.cluster.on_meta_applied.append(self._meta_applied)
        if self.limits.max_storage_bytes is not None:  # (what the quota explains)
            run.env.expected = (*run.env.expected, QuotaExceededError)
            self.calm_env.expected = run.env.expected
        run.cover("config_tenancy_gate")

    async def _started(self, sb: SimBookie) -> None:
        assert sb.bookie is not None
        store = self.run.cluster.store.session()  # (the clients' store: its faults apply)
        await enable_tenancy(sb.bookie, store, authenticated=True,
                             mutations=frozenset(self.run.mutations))
        self.checks.started(sb)

    def _meta_applied(self, op: str, key: object) -> None:
        if op != "create_ledger" or not isinstance(key, int):
            return
        try:
            md = self.run.cluster.store.peek_ledger(key)
        except (KeyError, BKError):
            return
        raw = md.custom_metadata.get(NAMESPACE_KEY)
        if raw is not None:
            self.ledger_namespace[key] = bytes(raw).decode("utf-8", "replace")

    async def start(self) -> None:
        run = self.run
        run.log(f"tenancy gate: {NAMESPACE} limits {self.limits.describe()}")
        records = TenancyRecords(run.cluster.admin)  # (never faulted)
        try:  # (the groups' extension made it already, with its placement)
            info = await records.namespace(NAMESPACE)
            await records.update_namespace(NAMESPACE, self.limits.apply(info.policies))
        except NoSuchNamespaceError:
            await records.create_tenant("sim")
            await records.create_namespace(NAMESPACE,
                                           policies=self.limits.apply(NamespacePolicies()))
        await records.create_tenant("calm")
        await records.create_namespace(CALM_NAMESPACE)
        run.registry.namespace = NAMESPACE
        run.spawn(TenantWriter, "cw", self.calm_env)

    async def settle(self) -> None:
        """The calm tenant's ledgers are recovered and read back, by one of its own."""
        run = self.run
        final = Recoverer("calm-final", run.cluster.client("calm-final"),
                          derive_rng(run.seed, "calm-final"), self.calm_env)
        for lid in list(self.calm_env.registry.ledgers):
            if await final.recover(lid, how="final", final=True) is None:
                run.history.liveness(f"recover L{lid}", False, "recovery did not complete")
        held = run.cluster.network.gatekeeper.held
        if held:
            run.coverage["tenancy_gate_held"] += held

    async def close(self) -> None:
        pass

    def check(self) -> list[Violation]:
        return list(self.checks.violations)
