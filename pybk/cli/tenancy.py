"""``pybk tenant ...`` and ``pybk namespace ...``: tenant and namespace records and their
policies (pybk.metadata.tenancy), as ``client.admin()`` manages them. Each command prints
JSON; a refusal (missing, not empty, a bad policy) is a one-line error and exit 1."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import click

from pybk.cli.common import Conn, client_options, run_async, with_client

__all__ = ["namespace", "tenant"]

#: the policy options: (option name, NamespacePolicies field, click type)
_POLICY_OPTIONS: tuple[tuple[str, str, Any], ...] = (
    ("--write-bytes-per-s", "write_bytes_per_s", int),
    ("--write-records-per-s", "write_records_per_s", int),
    ("--read-bytes-per-s", "read_bytes_per_s", int),
    ("--read-records-per-s", "read_records_per_s", int),
    ("--max-storage-bytes", "max_storage_bytes", int),
    ("--max-logs", "max_logs", int),
    ("--max-ledgers", "max_ledgers", int),
    ("--isolation-group", "isolation_group", str),
    ("--placement", "placement", click.Choice(["rack-aware", "region-aware"])),
    ("--min-regions", "min_regions", int),
    ("--ensemble-size", "ensemble_size", int),
    ("--write-quorum", "write_quorum", int),
    ("--ack-quorum", "ack_quorum", int),
    ("--compression", "compression", str),
    ("--roll-bytes", "roll_bytes", int),
    ("--roll-entries", "roll_entries", int),
    ("--roll-seconds", "roll_seconds", float),
    ("--retention-seconds", "retention_seconds", float),
    ("--retention-bytes", "retention_bytes", int),
    ("--backlog-quota-bytes", "backlog_quota_bytes", int),
    ("--backlog-quota-seconds", "backlog_quota_seconds", float),
    ("--backlog-policy", "backlog_policy", click.Choice(["refuse", "evict"])),
    ("--offload-url", "offload_url", str),
    ("--offload-deletion-lag", "offload_deletion_lag", float),
    ("--offload-threshold-bytes", "offload_threshold_bytes", int),
    ("--offload-threshold-seconds", "offload_threshold_seconds", float),
    ("--offload-bytes-per-s", "offload_bytes_per_s", int),
)


def policy_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The policy flags; the command gets ``policy`` (the fields given, by name)."""
    for flag, field, kind in reversed(_POLICY_OPTIONS):
        fn = click.option(flag, field, type=kind, default=None,
                          help=f"Policy {field} (unset: the current or default value).")(fn)
    return fn


def _policies(base: Any, given: dict[str, Any]) -> Any:
    from pybk.metadata.tenancy import NamespacePolicies

    changes = {k: v for k, v in given.items() if v is not None}
    try:
        return dataclasses.replace(base or NamespacePolicies(), **changes)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc)) from None


def _doc(info: Any) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(info).items()
           if k not in ("default_policies", "policies")}
    policies = getattr(info, "policies", None) or info.default_policies
    out["policies"] = dataclasses.asdict(policies)
    return out


def _run(conn: Conn, body: Callable[[Any], Any]) -> None:
    click.echo(json.dumps(run_async(with_client(conn, body)), sort_keys=True))


@click.group()
def tenant() -> None:
    """Tenants: who owns namespaces (tokens and certificates map to a tenant)."""


@tenant.command("create")
@client_options
@policy_options
@click.argument("name")
def tenant_create(conn: Conn, name: str, **policy: Any) -> None:
    """Create tenant NAME; the policy flags are its namespaces' defaults."""

    async def go(client: Any) -> dict[str, Any]:
        return _doc(await client.admin().create_tenant(
            name, default_policies=_policies(None, policy)))

    _run(conn, go)


@tenant.command("list")
@client_options
def tenant_list(conn: Conn) -> None:
    """The tenants' names (a JSON list)."""

    async def go(client: Any) -> list[str]:
        names: list[str] = await client.admin().list_tenants()
        return names

    _run(conn, go)


@tenant.command("show")
@client_options
@click.argument("name")
def tenant_show(conn: Conn, name: str) -> None:
    """Tenant NAME, its default policies and its namespaces."""

    async def go(client: Any) -> dict[str, Any]:
        admin = client.admin()
        doc = _doc(await admin.tenant_info(name))
        doc["namespaces"] = await admin.list_namespaces(name)
        return doc

    _run(conn, go)


@tenant.command("update")
@client_options
@policy_options
@click.argument("name")
def tenant_update(conn: Conn, name: str, **policy: Any) -> None:
    """Change tenant NAME's default policies (the flags given; the rest stay)."""

    async def go(client: Any) -> dict[str, Any]:
        admin = client.admin()
        current = (await admin.tenant_info(name)).default_policies
        return _doc(await admin.update_tenant(
            name, default_policies=_policies(current, policy)))

    _run(conn, go)


@tenant.command("delete")
@client_options
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete its namespaces and their logs too.")
def tenant_delete(conn: Conn, name: str, force: bool) -> None:
    """Delete tenant NAME (refused while it has namespaces, unless --force)."""

    async def go(client: Any) -> dict[str, Any]:
        await client.admin().delete_tenant(name, force=force)
        return {"deleted": name}

    _run(conn, go)


@click.group()
def namespace() -> None:
    """Namespaces (TENANT/NAME): policies, quotas and placement of their logs and ledgers."""


@namespace.command("create")
@client_options
@policy_options
@click.argument("name")
def namespace_create(conn: Conn, name: str, **policy: Any) -> None:
    """Create namespace TENANT/NAME: the tenant's defaults, changed by the flags given."""

    async def go(client: Any) -> dict[str, Any]:
        admin = client.admin()
        base = (await admin.tenant_info(name.partition("/")[0])).default_policies
        return _doc(await admin.create_namespace(name, policies=_policies(base, policy)))

    _run(conn, go)


@namespace.command("list")
@client_options
@click.option("--tenant", default=None, help="Only this tenant's namespaces.")
def namespace_list(conn: Conn, tenant: str | None) -> None:
    """The namespaces' names, TENANT/NAME (a JSON list)."""

    async def go(client: Any) -> list[str]:
        names: list[str] = await client.admin().list_namespaces(tenant)
        return names

    _run(conn, go)


@namespace.command("show")
@client_options
@click.argument("name")
def namespace_show(conn: Conn, name: str) -> None:
    """Namespace TENANT/NAME, its policies and its logs."""

    async def go(client: Any) -> dict[str, Any]:
        doc = _doc(await client.admin().namespace_info(name))
        doc["logs"] = await client.namespace(name).list_logs()
        return doc

    _run(conn, go)


@namespace.command("update")
@client_options
@policy_options
@click.argument("name")
def namespace_update(conn: Conn, name: str, **policy: Any) -> None:
    """Change namespace TENANT/NAME's policies (the flags given; the rest stay)."""

    async def go(client: Any) -> dict[str, Any]:
        admin = client.admin()
        current = (await admin.namespace_info(name)).policies
        return _doc(await admin.update_namespace(name, policies=_policies(current, policy)))

    _run(conn, go)


@namespace.command("delete")
@client_options
@click.argument("name")
@click.option("--force", is_flag=True, help="Delete its logs too.")
def namespace_delete(conn: Conn, name: str, force: bool) -> None:
    """Delete namespace TENANT/NAME (refused while it has logs, unless --force)."""

    async def go(client: Any) -> dict[str, Any]:
        await client.admin().delete_namespace(name, force=force)
        return {"deleted": name}

    _run(conn, go)
