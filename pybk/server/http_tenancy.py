"""Tenant and namespace endpoints of the bookie's HTTP admin (pybk.server.http).

``GET /api/v1/tenants``; ``GET|PUT|DELETE /api/v1/tenant?name=T``; ``GET
/api/v1/namespaces[?tenant=T]``; ``GET|PUT|DELETE /api/v1/namespace?name=T/NS``. A PUT's
body is a JSON object of policy fields: it creates the record when there is none (with those
fields over the defaults; 201) and otherwise changes only those fields (200). DELETE takes
``force=true`` (see :mod:`pybk.ops.tenancy_admin`). PUT and DELETE change the cluster, so
they are guarded like every other mutating request (the bearer token).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from pybk.errors import NoSuchNamespaceError, NoSuchTenantError
from pybk.metadata.tenancy import NamespaceInfo, NamespacePolicies, TenantInfo
from pybk.ops.admin import Admin

__all__ = ["json_body", "tenancy_routes"]

Handler = Callable[[web.Request], Coroutine[Any, Any, web.StreamResponse]]


def _name(request: web.Request) -> str:
    name = request.query.get("name")
    if not name:
        raise ValueError("missing query parameter name")
    return name


def _force(request: web.Request) -> bool:
    value = request.query.get("force", "false").lower()
    if value not in ("true", "false", "1", "0", ""):
        raise ValueError(f"force must be true or false, not {value!r}")
    return value in ("true", "1")


async def json_body(request: web.Request) -> dict[str, Any]:
    """A request's JSON object body (empty: ``{}``); ValueError for anything else (the admin
    server answers 400). Shared with :mod:`pybk.server.http`."""
    raw = await request.read()
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    return body


def _over(base: NamespacePolicies, body: dict[str, Any]) -> NamespacePolicies:
    """``base`` with the body's fields; an unknown field is a ValueError naming it."""
    known = {f.name for f in dataclasses.fields(NamespacePolicies)}
    unknown = sorted(set(body) - known)
    if unknown:
        raise ValueError(f"unknown policy fields: {', '.join(unknown)}")
    return dataclasses.replace(base, **body)


def _tenant(info: TenantInfo) -> dict[str, Any]:
    return {"name": info.name, "default_policies": info.default_policies.to_dict()}


def _namespace(info: NamespaceInfo) -> dict[str, Any]:
    return {"name": info.full_name, "tenant": info.tenant, "policies": info.policies.to_dict()}


def tenancy_routes(admin: Admin) -> list[tuple[str, str, Handler]]:
    """(verb, path, handler) of every tenancy endpoint, served through ``admin``."""

    async def list_tenants(request: web.Request) -> web.StreamResponse:
        return web.json_response(await admin.list_tenants())

    async def get_tenant(request: web.Request) -> web.StreamResponse:
        return web.json_response(_tenant(await admin.tenant_info(_name(request))))

    async def put_tenant(request: web.Request) -> web.StreamResponse:
        name, body = _name(request), await json_body(request)
        try:
            current = (await admin.tenant_info(name)).default_policies
        except NoSuchTenantError:
            return web.json_response(_tenant(await admin.create_tenant(
                name, default_policies=_over(NamespacePolicies(), body))), status=201)
        return web.json_response(_tenant(await admin.update_tenant(
            name, default_policies=_over(current, body))))

    async def delete_tenant(request: web.Request) -> web.StreamResponse:
        name = _name(request)
        await admin.delete_tenant(name, force=_force(request))
        return web.json_response({"deleted": name})

    async def list_namespaces(request: web.Request) -> web.StreamResponse:
        return web.json_response(await admin.list_namespaces(request.query.get("tenant")))

    async def get_namespace(request: web.Request) -> web.StreamResponse:
        name = _name(request)
        info, logs = await admin.namespace_details(name)
        doc = _namespace(info)
        doc["logs"] = logs
        return web.json_response(doc)

    async def put_namespace(request: web.Request) -> web.StreamResponse:
        name, body = _name(request), await json_body(request)
        try:
            current = (await admin.namespace_info(name)).policies
        except NoSuchNamespaceError:
            base = (await admin.tenant_info(name.partition("/")[0])).default_policies
            return web.json_response(_namespace(await admin.create_namespace(
                name, policies=_over(base, body))), status=201)
        return web.json_response(_namespace(await admin.update_namespace(
            name, policies=_over(current, body))))

    async def delete_namespace(request: web.Request) -> web.StreamResponse:
        name = _name(request)
        await admin.delete_namespace(name, force=_force(request))
        return web.json_response({"deleted": name})

    return [
        ("GET", "/api/v1/tenants", list_tenants),
        ("GET", "/api/v1/tenant", get_tenant),
        ("PUT", "/api/v1/tenant", put_tenant),
        ("DELETE", "/api/v1/tenant", delete_tenant),
        ("GET", "/api/v1/namespaces", list_namespaces),
        ("GET", "/api/v1/namespace", get_namespace),
        ("PUT", "/api/v1/namespace", put_namespace),
        ("DELETE", "/api/v1/namespace", delete_namespace),
    ]
