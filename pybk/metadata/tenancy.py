"""Tenants and their namespaces as records in the metadata store (every backend).

A tenant owns namespaces (``tenant/namespace``); a namespace carries the policies its logs and
ledgers live under: default log settings, placement (an isolation group of bookies, rack- or
region-aware), quotas (bytes stored, logs, ledgers) and rates (write and read bytes and records
per second). Records are JSON values in the store's key/value namespace, each change a
compare-and-set, so memory, SQLite, ZooKeeper and etcd hold them alike:

- ``tenancy/tenants/<tenant>``: :class:`TenantInfo`
- ``tenancy/namespaces/<tenant>/<namespace>``: :class:`NamespaceInfo`

A ledger names its namespace in its custom metadata (:data:`NAMESPACE_KEY`), which is how a
bookie finds the policies an entry falls under.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from pybk.errors import (
    KeyExistsError,
    NoSuchKeyError,
    NoSuchNamespaceError,
    NoSuchTenantError,
    NotEmptyError,
)
from pybk.metadata.base import MetadataStore, VersionedValue

__all__ = [
    "NAMESPACE_KEY",
    "PLACEMENTS",
    "NamespaceInfo",
    "NamespacePolicies",
    "TenancyRecords",
    "TenantInfo",
    "check_tenant_name",
    "split_namespace",
]

#: custom-metadata key of a ledger that holds its namespace (``tenant/namespace``, UTF-8)
NAMESPACE_KEY = "pybk.namespace"
#: placement choices a namespace may ask for
PLACEMENTS = ("rack-aware", "region-aware")

_TENANTS = "tenancy/tenants/"
_NAMESPACES = "tenancy/namespaces/"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")


def check_tenant_name(kind: str, name: object) -> str:
    """Tenant and namespace names: 1-100 of ``[A-Za-z0-9._-]``, not starting with '.' or '-'."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name must be a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"bad {kind} name {name!r}: 1-100 letters, digits and ._- (not starting with . or -)")
    return name


def split_namespace(full: object) -> tuple[str, str]:
    """``"acme/orders"`` -> ``("acme", "orders")``; a clear error for anything else."""
    if not isinstance(full, str):
        raise TypeError(f"namespace must be a str 'tenant/namespace', not {type(full).__name__}")
    tenant, sep, ns = full.partition("/")
    if not sep:
        raise ValueError(f"namespace {full!r} must be 'tenant/namespace'")
    return check_tenant_name("tenant", tenant), check_tenant_name("namespace", ns)


def _limit(name: str, value: object, *, allow_float: bool = False) -> None:
    kinds: tuple[type, ...] = (int, float) if allow_float else (int,)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not isinstance(value, kinds) or value <= 0:
        raise ValueError(f"{name} must be a positive number or None, got {value!r}")


@dataclass(frozen=True)
class NamespacePolicies:
    """What a namespace's logs and ledgers live under. ``None`` is "no limit"."""

    write_bytes_per_s: int | None = None
    write_records_per_s: int | None = None
    read_bytes_per_s: int | None = None
    read_records_per_s: int | None = None
    max_storage_bytes: int | None = None
    max_logs: int | None = None
    max_ledgers: int | None = None
    #: bookies of this group only (every ensemble, ensemble change and re-replication)
    isolation_group: str | None = None
    placement: str = "rack-aware"
    #: region-aware placement: a write set spans at least this many regions when it can
    min_regions: int = 2
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    compression: str = "none"
    roll_bytes: int | None = None
    roll_entries: int | None = None
    roll_seconds: float | None = None
    retention_seconds: float | None = None
    retention_bytes: int | None = None
    #: the backlog quota of the namespace's new logs (pybk.logs.backlog): "refuse" or "evict"
    backlog_quota_bytes: int | None = None
    backlog_quota_seconds: float | None = None
    backlog_policy: str = "refuse"
    #: the tier of the namespace's new logs (pybk.logs.offload_trigger; Pulsar's namespace
    #: offload policies): an fsspec URL, its filesystem options (no credentials: they are
    #: stored), the deletion lag (None: the log's default) and the offload thresholds
    offload_url: str | None = None
    offload_options: dict[str, Any] | None = None
    offload_deletion_lag: float | None = None
    offload_threshold_bytes: int | None = None
    offload_threshold_seconds: float | None = None
    offload_bytes_per_s: int | None = None

    def __post_init__(self) -> None:
        for name in ("write_bytes_per_s", "write_records_per_s", "read_bytes_per_s",
                     "read_records_per_s", "max_storage_bytes", "max_logs", "max_ledgers",
                     "roll_bytes", "roll_entries", "retention_bytes", "backlog_quota_bytes",
                     "offload_threshold_bytes", "offload_bytes_per_s"):
            _limit(name, getattr(self, name))
        for name in ("roll_seconds", "retention_seconds", "backlog_quota_seconds",
                     "offload_threshold_seconds"):
            _limit(name, getattr(self, name), allow_float=True)
        self._check_offload()
        if self.backlog_policy not in ("refuse", "evict"):
            raise ValueError(f"backlog_policy must be refuse or evict, got "
                             f"{self.backlog_policy!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.isolation_group is not None and (
                not isinstance(self.isolation_group, str) or not self.isolation_group):
            raise ValueError(f"isolation_group must be a non-empty str or None, "
                             f"got {self.isolation_group!r}")
        for name in ("min_regions", "ensemble_size", "write_quorum", "ack_quorum"):
            _limit(name, getattr(self, name))
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum:
            raise ValueError("need ensemble_size >= write_quorum >= ack_quorum, got "
                             f"{self.ensemble_size}/{self.write_quorum}/{self.ack_quorum}")

    def _check_offload(self) -> None:
        url, options = self.offload_url, self.offload_options
        if url is not None and (not isinstance(url, str) or "://" not in url):
            raise ValueError(f"offload_url must be a URL such as file:///path or "
                             f"s3://bucket/prefix, got {url!r}")
        if options is not None and (not isinstance(options, dict)
                                    or not all(isinstance(k, str) for k in options)):
            raise ValueError(f"offload_options must be a dict with str keys, got {options!r}")
        if options is not None:
            try:
                json.dumps(options)
            except (TypeError, ValueError):
                raise ValueError("offload_options must be JSON (they are stored)") from None
        lag = self.offload_deletion_lag
        if lag is not None and (isinstance(lag, bool) or not isinstance(lag, (int, float))
                                or lag < 0):
            raise ValueError(f"offload_deletion_lag must be seconds >= 0 or None, got {lag!r}")
        thresholds = (self.offload_threshold_bytes, self.offload_threshold_seconds)
        if url is None and any(t is not None for t in thresholds):
            raise ValueError("offload thresholds need an offload_url")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> NamespacePolicies:
        """Unknown keys (from a newer version) are ignored; missing ones take defaults."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in known})


@dataclass(frozen=True)
class TenantInfo:
    """A tenant: its name and the policies its new namespaces start from."""

    name: str
    default_policies: NamespacePolicies = field(default_factory=NamespacePolicies)
    version: int = -1

    def to_bytes(self) -> bytes:
        return json.dumps({"name": self.name,
                           "default_policies": self.default_policies.to_dict()}).encode()

    @classmethod
    def from_value(cls, value: VersionedValue) -> TenantInfo:
        doc = json.loads(value.value)
        return cls(doc["name"], NamespacePolicies.from_dict(doc.get("default_policies", {})),
                   value.version)


@dataclass(frozen=True)
class NamespaceInfo:
    """A namespace (``tenant/name``) and its policies."""

    tenant: str
    name: str
    policies: NamespacePolicies = field(default_factory=NamespacePolicies)
    version: int = -1

    @property
    def full_name(self) -> str:
        return f"{self.tenant}/{self.name}"

    def to_bytes(self) -> bytes:
        return json.dumps({"tenant": self.tenant, "name": self.name,
                           "policies": self.policies.to_dict()}).encode()

    @classmethod
    def from_value(cls, value: VersionedValue) -> NamespaceInfo:
        doc = json.loads(value.value)
        return cls(doc["tenant"], doc["name"],
                   NamespacePolicies.from_dict(doc.get("policies", {})), value.version)


class TenancyRecords:
    """Create, read, list, update and delete tenant and namespace records in one store.
    Emptiness checks (a namespace's logs) are the caller's: ``delete_namespace`` is told."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # -- tenants ------------------------------------------------------------------------

    async def create_tenant(self, name: str, *,
                            default_policies: NamespacePolicies | None = None) -> TenantInfo:
        info = TenantInfo(check_tenant_name("tenant", name),
                          default_policies or NamespacePolicies())
        try:
            v = await self.store.create_value(_TENANTS + name, info.to_bytes())
        except KeyExistsError:
            raise KeyExistsError(f"tenant {name!r} exists already") from None
        return replace(info, version=v.version)

    async def tenant(self, name: str) -> TenantInfo:
        try:
            return TenantInfo.from_value(
                await self.store.read_value(_TENANTS + check_tenant_name("tenant", name)))
        except NoSuchKeyError:
            raise NoSuchTenantError(f"no tenant {name!r}") from None

    async def list_tenants(self) -> list[str]:
        return sorted(k[len(_TENANTS):] for k in await self.store.list_keys(_TENANTS))

    async def update_tenant(self, name: str, default_policies: NamespacePolicies) -> TenantInfo:
        info = TenantInfo(check_tenant_name("tenant", name), default_policies)
        try:
            v = await self.store.update_value(_TENANTS + name, lambda _old: info.to_bytes())
        except NoSuchKeyError:
            raise NoSuchTenantError(f"no tenant {name!r}") from None
        return replace(info, version=v.version)

    async def delete_tenant(self, name: str) -> None:
        """Refused (NotEmptyError) while the tenant has namespaces."""
        await self.tenant(name)
        left = await self.list_namespaces(name)
        if left:
            raise NotEmptyError(f"tenant {name!r} still has namespaces: {', '.join(left)}")
        try:
            await self.store.delete_value(_TENANTS + name)
        except NoSuchKeyError:
            raise NoSuchTenantError(f"no tenant {name!r}") from None

    # -- namespaces ---------------------------------------------------------------------

    async def create_namespace(self, full_name: str, *,
                               policies: NamespacePolicies | None = None) -> NamespaceInfo:
        """The tenant must exist; without ``policies`` the tenant's defaults apply."""
        tenant, ns = split_namespace(full_name)
        owner = await self.tenant(tenant)
        info = NamespaceInfo(tenant, ns, policies or owner.default_policies)
        try:
            v = await self.store.create_value(f"{_NAMESPACES}{tenant}/{ns}", info.to_bytes())
        except KeyExistsError:
            raise KeyExistsError(f"namespace {full_name!r} exists already") from None
        return replace(info, version=v.version)

    async def namespace(self, full_name: str) -> NamespaceInfo:
        tenant, ns = split_namespace(full_name)
        try:
            return NamespaceInfo.from_value(
                await self.store.read_value(f"{_NAMESPACES}{tenant}/{ns}"))
        except NoSuchKeyError:
            raise NoSuchNamespaceError(f"no namespace {full_name!r}") from None

    async def list_namespaces(self, tenant: str | None = None) -> list[str]:
        """``tenant/namespace`` names, of one tenant or of all."""
        prefix = _NAMESPACES if tenant is None else (
            f"{_NAMESPACES}{check_tenant_name('tenant', tenant)}/")
        return sorted(k[len(_NAMESPACES):] for k in await self.store.list_keys(prefix))

    async def update_namespace(self, full_name: str,
                               policies: NamespacePolicies) -> NamespaceInfo:
        tenant, ns = split_namespace(full_name)
        info = NamespaceInfo(tenant, ns, policies)
        try:
            v = await self.store.update_value(f"{_NAMESPACES}{tenant}/{ns}",
                                              lambda _old: info.to_bytes())
        except NoSuchKeyError:
            raise NoSuchNamespaceError(f"no namespace {full_name!r}") from None
        return replace(info, version=v.version)

    async def delete_namespace(self, full_name: str) -> None:
        """Delete the record only: whether its logs go first is the admin's rule
        (:meth:`pybk.ops.Admin.delete_namespace`)."""
        tenant, ns = split_namespace(full_name)
        try:
            await self.store.delete_value(f"{_NAMESPACES}{tenant}/{ns}")
        except NoSuchKeyError:
            raise NoSuchNamespaceError(f"no namespace {full_name!r}") from None
