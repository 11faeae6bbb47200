"""Tenancy on a metadata backend (part of :data:`pybk.testing.metadata_conformance.CHECKS`):
tenants and namespaces are JSON values under ``tenancy/``, so what this checks is that a
backend keeps them apart, lists them by prefix and lets one concurrent create win; and that a
bookie's registration carries its isolation group."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pybk.errors import (
    KeyExistsError,
    NoSuchNamespaceError,
    NoSuchTenantError,
    NotEmptyError,
)
from pybk.metadata.base import BookieRegistration
from pybk.metadata.tenancy import NamespacePolicies, TenancyRecords

if TYPE_CHECKING:
    from pybk.testing.metadata_backends import MetadataBackend

__all__ = ["TENANCY_CHECKS"]


async def check_tenancy_records_round_trip(backend: MetadataBackend) -> None:
    a, b = TenancyRecords(await backend.open()), TenancyRecords(await backend.open())
    await a.create_tenant("acme", default_policies=NamespacePolicies(max_logs=5))
    await a.create_tenant("globex")
    assert await b.list_tenants() == ["acme", "globex"]
    ns = await b.create_namespace("acme/orders")  # the tenant's defaults
    assert ns.policies.max_logs == 5 and ns.full_name == "acme/orders"
    mine = NamespacePolicies(write_bytes_per_s=1 << 20, isolation_group="g1",
                             placement="region-aware", ensemble_size=4, write_quorum=3,
                             ack_quorum=2, retention_seconds=3600.0)
    await a.create_namespace("acme/billing", policies=mine)
    await a.create_namespace("globex/orders")
    assert (await a.namespace("acme/billing")).policies == mine
    assert await b.list_namespaces("acme") == ["acme/billing", "acme/orders"]
    assert await b.list_namespaces() == ["acme/billing", "acme/orders", "globex/orders"]
    updated = await b.update_namespace("acme/orders", NamespacePolicies(max_storage_bytes=10))
    assert (await a.namespace("acme/orders")).policies.max_storage_bytes == 10
    assert updated.version == (await a.namespace("acme/orders")).version


async def check_tenancy_records_refuse_what_they_must(backend: MetadataBackend) -> None:
    r = TenancyRecords(await backend.open())
    try:
        await r.create_namespace("nobody/ns")
        raise AssertionError("a namespace of a missing tenant was created")
    except NoSuchTenantError:
        pass
    await r.create_tenant("t")
    outcomes = await asyncio.gather(*(r.create_namespace("t/ns") for _ in range(4)),
                                    return_exceptions=True)
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1, outcomes
    assert all(isinstance(o, KeyExistsError) for o in outcomes
               if isinstance(o, BaseException)), outcomes
    try:
        await r.delete_tenant("t")
        raise AssertionError("a tenant with a namespace was deleted")
    except NotEmptyError:
        pass
    await r.delete_namespace("t/ns")
    for missing in (r.namespace("t/ns"), r.update_namespace("t/ns", NamespacePolicies())):
        try:
            await missing
            raise AssertionError("a deleted namespace was found")
        except NoSuchNamespaceError:
            pass
    await r.delete_tenant("t")
    assert await r.list_tenants() == []


async def check_registration_carries_its_group(backend: MetadataBackend) -> None:
    store, reader = await backend.open(), await backend.open()
    await store.register_bookie(BookieRegistration("bk-1", "h:1", rack="/eu/r1", group="gold"))
    await store.register_bookie(BookieRegistration("bk-2", "h:2"))
    assert await reader.list_bookies() == [
        BookieRegistration("bk-1", "h:1", rack="/eu/r1", group="gold"),
        BookieRegistration("bk-2", "h:2", group=""),
    ]
    await store.register_bookie(BookieRegistration("bk-1", "h:1", True, "/eu/r1", "silver"))
    assert (await reader.list_bookies())[0].group == "silver"
    for bad in ("a/b", "a b", "x" * 101):
        try:
            await store.register_bookie(BookieRegistration("bk-3", "h:3", group=bad))
        except ValueError:
            continue
        raise AssertionError(f"group {bad!r} was accepted")


TENANCY_CHECKS = [check_tenancy_records_round_trip, check_tenancy_records_refuse_what_they_must,
                  check_registration_carries_its_group]
