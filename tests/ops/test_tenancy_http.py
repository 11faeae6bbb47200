"""Tenants and namespaces through the bookie's HTTP admin: the whole life of records,
the token on PUT and DELETE, and clear JSON errors for bad input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from pybk.metadata.memory import MemoryMetadataStore
from pybk.server.http import HttpConfig
from pybk.server.process import BookieProcess, BookieProcessConfig

TOKEN = b"tenancy-token"
AUTH = {"Authorization": "Bearer " + TOKEN.decode()}


@pytest.fixture
async def base(tmp_path: Path) -> AsyncIterator[str]:
    config = BookieProcessConfig(data_dir=str(tmp_path / "b0"), metadata="memory://", port=0,
                                 bookie_id="b0", http_port=0,
                                 http_config=HttpConfig(token=TOKEN))
    process = BookieProcess(config, store=MemoryMetadataStore().session())
    await process.start()
    try:
        yield f"http://{process.http_address}/api/v1"
    finally:
        await process.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


async def test_tenant_and_namespace_life(base: str, http: aiohttp.ClientSession) -> None:
    async with http.put(f"{base}/tenant?name=acme", json={"max_logs": 4}, headers=AUTH) as r:
        assert r.status == 201 and (await r.json())["default_policies"]["max_logs"] == 4
    async with http.put(f"{base}/tenant?name=acme", json={"max_ledgers": 9},
                        headers=AUTH) as r:
        pol = (await r.json())["default_policies"]
        assert r.status == 200 and (pol["max_logs"], pol["max_ledgers"]) == (4, 9)
    async with http.get(f"{base}/tenants") as r:
        assert await r.json() == ["acme"]
    async with http.get(f"{base}/tenant?name=acme") as r:
        assert (await r.json())["name"] == "acme"
    async with http.put(f"{base}/namespace?name=acme/orders",
                        json={"isolation_group": "g1", "placement": "region-aware"},
                        headers=AUTH) as r:
        doc = await r.json()
        assert r.status == 201, doc
        assert (doc["policies"]["isolation_group"], doc["policies"]["max_logs"]) == ("g1", 4)
    async with http.put(f"{base}/namespace?name=acme/orders", json={"max_logs": 2},
                        headers=AUTH) as r:
        assert r.status == 200 and (await r.json())["policies"]["max_logs"] == 2
    async with http.get(f"{base}/namespaces?tenant=acme") as r:
        assert await r.json() == ["acme/orders"]
    async with http.get(f"{base}/namespace?name=acme/orders") as r:
        doc = await r.json()
        assert (doc["policies"]["placement"], doc["logs"]) == ("region-aware", [])
    async with http.delete(f"{base}/tenant?name=acme", headers=AUTH) as r:
        assert r.status == 409 and (await r.json())["type"] == "NotEmptyError"
    async with http.delete(f"{base}/namespace?name=acme/orders", headers=AUTH) as r:
        assert r.status == 200
    async with http.delete(f"{base}/tenant?name=acme", headers=AUTH) as r:
        assert r.status == 200
    async with http.get(f"{base}/tenants") as r:
        assert await r.json() == []


async def test_mutations_need_the_token(base: str, http: aiohttp.ClientSession) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        async with http.put(f"{base}/tenant?name=t", json={}, headers=headers) as r:
            assert r.status == 401
        async with http.delete(f"{base}/tenant?name=t", headers=headers) as r:
            assert r.status == 401
    async with http.get(f"{base}/tenants") as r:
        assert await r.json() == []


@pytest.mark.parametrize("method, path, body, status, kind", [
    ("GET", "/tenant?name=nobody", None, 404, "NoSuchTenantError"),
    ("GET", "/tenant", None, 400, "ValueError"),
    ("GET", "/namespace?name=a/b", None, 404, "NoSuchNamespaceError"),
    ("GET", "/namespaces?tenant=nobody", None, 404, "NoSuchTenantError"),
    ("PUT", "/namespace?name=nobody/ns", {}, 404, "NoSuchTenantError"),
    ("PUT", "/tenant?name=bad%20name", {}, 400, "ValueError"),
    ("PUT", "/namespace?name=noslash", {}, 400, "ValueError"),
    ("PUT", "/tenant?name=t", {"max_cats": 1}, 400, "ValueError"),
    ("PUT", "/tenant?name=t", {"max_logs": -1}, 400, "ValueError"),
    ("PUT", "/tenant?name=t", {"placement": "anywhere"}, 400, "ValueError"),
    ("PUT", "/tenant?name=t", [1, 2], 400, "ValueError"),
    ("DELETE", "/tenant?name=t&force=maybe", None, 400, "ValueError"),
    ("DELETE", "/namespace?name=x/y", None, 404, "NoSuchNamespaceError"),
])
async def test_bad_input_is_a_clear_json_error(base: str, http: aiohttp.ClientSession,
                                               method: str, path: str, body: object,
                                               status: int, kind: str) -> None:
    async with http.request(method, base + path, json=body, headers=AUTH) as r:
        doc = await r.json()
        assert (r.status, doc["type"]) == (status, kind), doc
        assert doc["error"]
