"""Who a connection is: its principal (a tenant name), from its token or its certificate.

A bookie may be given a tenant token file (``pybk bookie --tenant-tokens FILE``) and a
certificate subject map (``--tenant-subjects FILE``); both are lines ``tenant:value`` (token,
or certificate subject common name), ``#`` comments and blank lines ignored. A connection that
authenticates with a listed token, or presents a certificate whose subject CN is listed,
belongs to that tenant. The bookie's own cluster token (``--token-file``) is the cluster's
principal (:data:`CLUSTER`: auto-recovery and other bookies copy every tenant's entries).
Without any of these, every connection is :data:`ANONYMOUS`.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pybk.metadata.tenancy import check_tenant_name

__all__ = ["ANONYMOUS", "CLUSTER", "Identities", "parse_tenant_lines", "subject_cn"]

#: the one tenant of a bookie without authentication
ANONYMOUS: Final = "_anonymous"
#: the principal of the bookie's cluster token (not bound to a tenant's namespaces or rates)
CLUSTER: Final = "_cluster"


def parse_tenant_lines(text: str, what: str, source: str = "<text>") -> dict[str, str]:
    """``tenant:value`` lines -> {value: tenant}; a clear ValueError naming the line for a
    line without ``:``, a bad tenant name, an empty value or a value listed twice."""
    mapping: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        tenant, sep, value = line.partition(":")
        tenant, value = tenant.strip(), value.strip()
        where = f"{source} line {number}"
        if not sep or not value:
            raise ValueError(f"{where}: expected 'tenant:{what}', got {line[:40]!r}")
        try:
            check_tenant_name("tenant", tenant)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if value in mapping:
            raise ValueError(f"{where}: this {what} is listed twice "
                             f"(for {mapping[value]!r} and {tenant!r})")
        mapping[value] = tenant
    return mapping


def subject_cn(peercert: Mapping[str, Any] | None) -> str | None:
    """The common name of a certificate's subject (``ssl.SSLSocket.getpeercert()`` form)."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


@dataclass
class Identities:
    """Token -> tenant and certificate CN -> tenant maps, and the cluster's own token."""

    tokens: dict[str, str] = field(default_factory=dict)
    subjects: dict[str, str] = field(default_factory=dict)
    cluster_token: bytes | None = None

    @classmethod
    def from_files(cls, tokens_file: str | os.PathLike[str] | None = None,
                   subjects_file: str | os.PathLike[str] | None = None,
                   cluster_token: bytes | None = None) -> Identities:
        tokens = subjects = {}
        if tokens_file is not None:
            with open(tokens_file, encoding="utf-8") as f:
                tokens = parse_tenant_lines(f.read(), "token", str(tokens_file))
        if subjects_file is not None:
            with open(subjects_file, encoding="utf-8") as f:
                subjects = parse_tenant_lines(f.read(), "subject CN", str(subjects_file))
        return cls(tokens, subjects, cluster_token)

    @property
    def authenticates(self) -> bool:
        """Does a connection have to send AUTH (some token is configured)?"""
        return bool(self.tokens) or self.cluster_token is not None

    @property
    def enabled(self) -> bool:
        return bool(self.tokens or self.subjects or self.cluster_token is not None)

    def tenants(self) -> set[str]:
        return set(self.tokens.values()) | set(self.subjects.values())

    def by_token(self, token: bytes) -> str | None:
        """The principal of ``token`` (constant-time compares), or None when unknown."""
        found = None
        if self.cluster_token is not None and hmac.compare_digest(token, self.cluster_token):
            found = CLUSTER
        for value, tenant in self.tokens.items():
            if hmac.compare_digest(token, value.encode()):
                found = tenant
        return found

    def by_certificate(self, peercert: Mapping[str, Any] | None) -> str | None:
        cn = subject_cn(peercert)
        return None if cn is None else self.subjects.get(cn)

    def describe(self) -> str:
        if not self.enabled:
            return f"no authentication: every connection is tenant {ANONYMOUS!r}"
        return (f"{len(self.tokens)} tenant tokens, {len(self.subjects)} certificate subjects "
                f"({', '.join(sorted(self.tenants())) or 'no tenants'})")


def unknown_tenants(identities: Identities, known: Iterable[str]) -> list[str]:
    """Tenants named in the files that have no tenant record."""
    return sorted(identities.tenants() - set(known))
