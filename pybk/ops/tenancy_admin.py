"""Tenant and namespace administration (``client.admin()``'s tenancy methods).

The records and their rules are pybk.metadata.tenancy's; what this adds is what needs the
log layer: a namespace's emptiness is its logs (``client.namespace("t/ns").list_logs()``),
and a forced deletion deletes them first (their ledgers, cursors and offloaded copies).
Ledgers made directly with a namespace in their custom metadata are not counted: they are
the application's to delete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybk.errors import NotEmptyError
from pybk.metadata.tenancy import NamespaceInfo, NamespacePolicies, TenancyRecords, TenantInfo

if TYPE_CHECKING:
    from pybk.client import Client

__all__ = ["TenancyAdmin"]


class TenancyAdmin:
    """Mixed into :class:`pybk.ops.Admin`; ``_client`` is the admin's client."""

    _client: Client

    @property
    def _records(self) -> TenancyRecords:
        return TenancyRecords(self._client.store)

    # -- tenants ------------------------------------------------------------------------

    async def create_tenant(self, name: str, *,
                            default_policies: NamespacePolicies | None = None) -> TenantInfo:
        """A new tenant (KeyExistsError if it exists); ``default_policies`` are what its new
        namespaces get when they are created without policies of their own."""
        return await self._records.create_tenant(name, default_policies=default_policies)

    async def list_tenants(self) -> list[str]:
        return await self._records.list_tenants()

    async def tenant_info(self, name: str) -> TenantInfo:
        """NoSuchTenantError if there is none."""
        return await self._records.tenant(name)

    async def update_tenant(self, name: str, *,
                            default_policies: NamespacePolicies) -> TenantInfo:
        return await self._records.update_tenant(name, default_policies)

    async def delete_tenant(self, name: str, *, force: bool = False) -> None:
        """Refused (NotEmptyError) while it has namespaces, unless ``force``: then each
        namespace is deleted with its logs first."""
        await self._records.tenant(name)
        if force:
            for full in await self._records.list_namespaces(name):
                await self.delete_namespace(full, force=True)
        await self._records.delete_tenant(name)

    # -- namespaces ---------------------------------------------------------------------

    async def create_namespace(self, name: str, *,
                               policies: NamespacePolicies | None = None) -> NamespaceInfo:
        """``name`` is ``tenant/namespace``; the tenant must exist (NoSuchTenantError)."""
        return await self._records.create_namespace(name, policies=policies)

    async def list_namespaces(self, tenant: str | None = None) -> list[str]:
        """``tenant/namespace`` names, of one tenant (NoSuchTenantError if none) or of all."""
        if tenant is not None:
            await self._records.tenant(tenant)
        return await self._records.list_namespaces(tenant)

    async def namespace_logs(self, name: str) -> list[str]:
        """The names of the namespace's logs (NoSuchNamespaceError if there is none)."""
        return (await self.namespace_details(name))[1]

    async def namespace_details(self, name: str) -> tuple[NamespaceInfo, list[str]]:
        """The namespace's record and the names of its logs, the record read once
        (NoSuchNamespaceError if there is none)."""
        info = await self._records.namespace(name)
        names: list[str] = await self._client.namespace(name).list_logs()
        return info, names

    async def namespace_info(self, name: str) -> NamespaceInfo:
        """NoSuchNamespaceError if there is none."""
        return await self._records.namespace(name)

    async def update_namespace(self, name: str, *,
                               policies: NamespacePolicies) -> NamespaceInfo:
        """New policies; logs created from now on take its defaults, bookies pick up quotas
        and rates as they refresh, placement applies to ensembles chosen from now on."""
        return await self._records.update_namespace(name, policies)

    async def delete_namespace(self, name: str, *, force: bool = False) -> None:
        """Refused (NotEmptyError naming its logs) while it has logs, unless ``force``:
        then its logs are deleted first."""
        await self._records.namespace(name)
        logs = self._client.namespace(name)
        names = await logs.list_logs()
        if names and not force:
            shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
            raise NotEmptyError(f"namespace {name!r} has {len(names)} logs ({shown}): delete "
                                "them first, or force")
        for log_name in names:
            await logs.delete_log(log_name)
        await self._records.delete_namespace(name)
