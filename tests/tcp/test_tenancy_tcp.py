"""Tenancy over TCP: principals from tenant tokens and from client certificates (real TLS on
loopback, trustme), cross-tenant refusal, rate delays in order, quotas; bad tenant files."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trustme

import pybk
from pybk.bookie import Bookie
from pybk.bookie.tenancy import enable_tenancy
from pybk.errors import QuotaExceededError, UnauthorizedError
from pybk.metadata.base import BookieRegistration
from pybk.metadata.memory import MemoryMetadataStore
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords
from pybk.storage import MemFileSystem
from pybk.transport.fairness import FairShare
from pybk.transport.identity import (
    ANONYMOUS,
    Identities,
    parse_tenant_lines,
    unknown_tenants,
)
from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport
from pybk.transport.tls import client_context, server_context

ALL3 = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 3}
TOKENS = "# tenant:token\nacme:tok-acme\n\nglobex:tok-globex\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Any]:
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("pki")
    paths = {n: d / f"{n}.pem" for n in ("ca", "server", "acme", "globex")}
    ca.cert_pem.write_to_path(paths["ca"])
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        paths["server"])
    for name in ("acme", "globex"):
        ca.issue_cert(f"{name}@pybk.test", common_name=f"{name}-app"
                      ).private_key_and_cert_chain_pem.write_to_path(paths[name])
    return paths


@asynccontextmanager
async def _bookies(identities: Identities, ssl_context: ssl.SSLContext | None = None,
                   policies: dict[str, NamespacePolicies] | None = None
                   ) -> AsyncIterator[MemoryMetadataStore]:
    store = MemoryMetadataStore()
    records = TenancyRecords(store)
    for tenant in ("acme", "globex"):
        await records.create_tenant(tenant)
    for ns, pol in (policies or {"acme/orders": NamespacePolicies()}).items():
        await records.create_namespace(ns, policies=pol)
    store.servers = []  # type: ignore[attr-defined]
    async with AsyncExitStack() as stack:
        for i in range(3):
            fs = MemFileSystem()
            fs.makedirs(f"/b{i}")
            bookie = Bookie(f"b{i}", f"/b{i}", fs=fs)
            await bookie.start()
            stack.push_async_callback(bookie.stop)
            gate = await enable_tenancy(bookie, store, authenticated=True)
            server = BookieServer(bookie.handle, add=bookie.add_request,
                                  response_size=bookie.response_size_hint,
                                  ssl_context=ssl_context, identities=identities, gate=gate,
                                  fair_share=8)
            await server.start()
            store.servers.append(server)  # type: ignore[attr-defined]
            stack.push_async_callback(server.stop)
            host, port = server.address
            await store.register_bookie(BookieRegistration(f"b{i}", f"{host}:{port}"))
        yield store


async def _ledger(client: pybk.Client, ns: str) -> Any:
    return await client.create_ledger(custom_metadata={NAMESPACE_KEY: ns.encode()}, **ALL3)


def _client(store: MemoryMetadataStore, **transport: Any) -> pybk.Client:
    return pybk.Client(store, transport=TcpTransport.from_store(store, **transport))


async def test_tokens_name_the_tenant(tmp_path):
    identities = Identities(parse_tenant_lines(TOKENS, "token"))
    async with _bookies(identities) as store:
        acme = _client(store, auth_token=b"tok-acme")
        globex = _client(store, auth_token=b"tok-globex")
        try:
            lh = await _ledger(acme, "acme/orders")
            await lh.append(b"acme's")
            intruder = await _ledger(globex, "acme/orders")
            with pytest.raises(UnauthorizedError):
                await intruder.append(b"not globex's")
        finally:
            for c in (acme, globex):
                await c.transport.close()
                await c.close()


async def test_certificate_subjects_name_the_tenant(pki):
    identities = Identities(subjects={"acme-app": "acme", "globex-app": "globex"})
    ctx = server_context(pki["server"], cafile=pki["ca"], require_client_cert=True)
    async with _bookies(identities, ctx) as store:
        acme = _client(store, ssl_context=client_context(pki["ca"], certfile=pki["acme"]))
        globex = _client(store, ssl_context=client_context(pki["ca"], certfile=pki["globex"]))
        try:
            lh = await _ledger(acme, "acme/orders")
            await lh.append(b"acme's")
            intruder = await _ledger(globex, "acme/orders")
            with pytest.raises(UnauthorizedError):
                await intruder.append(b"not globex's")
        finally:
            for c in (acme, globex):
                await c.transport.close()
                await c.close()


async def test_rate_delays_in_order_and_quota_over_tcp():
    identities = Identities(parse_tenant_lines(TOKENS, "token"))
    policies = {"acme/slow": NamespacePolicies(write_records_per_s=50),
                "acme/small": NamespacePolicies(max_storage_bytes=4000),
                "globex/app": NamespacePolicies()}
    async with _bookies(identities, policies=policies) as store:
        acme = _client(store, auth_token=b"tok-acme")
        globex = _client(store, auth_token=b"tok-globex")
        try:
            slow = await _ledger(acme, "acme/slow")
            loop = asyncio.get_running_loop()
            start = loop.time()
            await asyncio.gather(*(slow.append(f"e{i}".encode()) for i in range(60)))
            assert loop.time() - start >= 0.8  # 60 at 50/s with 5 saved: about 1.1 s
            got = [e.data for e in await slow.read(0, 59)]
            assert got == [f"e{i}".encode() for i in range(60)]
            small = await _ledger(acme, "acme/small")
            other = await _ledger(globex, "globex/app")
            with pytest.raises(QuotaExceededError):
                for _ in range(20):
                    await small.append(b"q" * 1000)
            for _ in range(10):
                await other.append(b"b" * 1000)
        finally:
            for c in (acme, globex):
                await c.transport.close()
                await c.close()


def test_fair_share_round_robin_across_tenants():
    granted: list[str] = []

    class Conn:
        closing = False

        def __init__(self, name: str) -> None:
            self.name = name

        def fair_granted(self) -> None:
            granted.append(self.name)

    fair = FairShare(2)
    a1, a2, a3, b1 = Conn("a1"), Conn("a2"), Conn("a3"), Conn("b1")
    assert fair.try_acquire("acme", a1) and fair.try_acquire("acme", a2)
    assert not fair.try_acquire("acme", a3)  # full: acme's third waits...
    assert not fair.try_acquire("acme", a1)
    assert not fair.try_acquire("globex", b1)  # ...and globex's first, behind it
    fair.release()
    fair.release()
    assert granted == ["a3", "b1"]  # one turn each, not acme's whole backlog first
    fair.release()
    assert granted == ["a3", "b1", "a1"]
    fair.forget(a1)
    with pytest.raises(ValueError):
        FairShare(0)


async def test_fair_share_under_a_flood_over_tcp():
    identities = Identities(parse_tenant_lines(TOKENS, "token"))
    policies = {"acme/bulk": NamespacePolicies(), "globex/app": NamespacePolicies()}
    async with _bookies(identities, policies=policies) as store:
        acme = _client(store, auth_token=b"tok-acme")
        globex = _client(store, auth_token=b"tok-globex")
        try:
            bulk = await _ledger(acme, "acme/bulk")
            app = await _ledger(globex, "globex/app")
            flood = [asyncio.ensure_future(bulk.append(b"a" * 2000)) for _ in range(500)]
            await asyncio.sleep(0)
            for i in range(20):
                await app.append(f"b{i}".encode())
            await asyncio.gather(*flood)
            assert sum(s.fair.waits for s in store.servers) > 0  # the cap was reached
            assert [e.data for e in await app.read(0, 19)] == [
                f"b{i}".encode() for i in range(20)]
        finally:
            for c in (acme, globex):
                await c.transport.close()
                await c.close()


def test_tenant_file_errors(tmp_path):
    with pytest.raises(ValueError, match="line 2: expected 'tenant:token'"):
        parse_tenant_lines("acme:t1\nno-colon-here\n", "token")
    with pytest.raises(ValueError, match="line 1: expected"):
        parse_tenant_lines("acme:\n", "token")
    with pytest.raises(ValueError, match="line 1: bad tenant name"):
        parse_tenant_lines("bad tenant!:t1\n", "token")
    with pytest.raises(ValueError, match="line 2: this token is listed twice"):
        parse_tenant_lines("acme:t1\nglobex:t1\n", "token")
    f = tmp_path / "tokens"
    f.write_text(TOKENS)
    ids = Identities.from_files(f)
    assert ids.by_token(b"tok-globex") == "globex" and ids.by_token(b"nope") is None
    assert unknown_tenants(ids, ["acme"]) == ["globex"]
    assert ANONYMOUS in Identities().describe()
    from pybk.bookie import tenancy
    from pybk.transport import identity

    assert (tenancy.ANONYMOUS, tenancy.CLUSTER) == (identity.ANONYMOUS, identity.CLUSTER)


def test_cli_bad_tenant_file_is_a_usage_error(tmp_path):
    from click.testing import CliRunner

    from pybk.cli import main

    bad = tmp_path / "tokens"
    bad.write_text("acme:t1\njust-a-token\n")
    r = CliRunner().invoke(main, ["bookie", "--data", str(tmp_path / "d"), "--metadata",
                                  f"sqlite:///{tmp_path}/m.db", "--port", "0", "--bookie-id",
                                  "b1", "--tenant-tokens", str(bad)])
    assert r.exit_code == 2, r.output
    assert "line 2: expected 'tenant:token'" in r.output


async def test_process_refuses_unknown_tenants(tmp_path):
    from pybk.errors import NoSuchTenantError
    from pybk.server.process import BookieProcess, BookieProcessConfig

    tokens = tmp_path / "tokens"
    tokens.write_text("ghost:t1\n")
    store = MemoryMetadataStore()
    process = BookieProcess(BookieProcessConfig(
        data_dir=str(tmp_path / "d"), metadata="memory://", port=0, bookie_id="b1",
        tenant_tokens=str(tokens)), store=store)
    try:
        with pytest.raises(NoSuchTenantError, match="ghost"):
            await process.start()
    finally:
        await process.stop()


async def test_bookie_process_enforces_and_exports_tenant_metrics(tmp_path, capsys):
    import urllib.request

    from pybk.server.process import BookieProcess, BookieProcessConfig

    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    store = MemoryMetadataStore()
    records = TenancyRecords(store)
    for tenant in ("acme", "globex"):
        await records.create_tenant(tenant)
    await records.create_namespace("acme/orders", policies=NamespacePolicies(
        max_storage_bytes=1 << 20))
    process = BookieProcess(BookieProcessConfig(
        data_dir=str(tmp_path / "d"), metadata="memory://", port=0, bookie_id="b1",
        metrics_port=0, tenant_tokens=str(tokens)), store=store)
    await process.start()
    try:
        assert "2 tenant tokens" in capsys.readouterr().out  # the ready line says who is who
        acme = _client(store, auth_token=b"tok-acme")
        globex = _client(store, auth_token=b"tok-globex")
        try:
            one = {"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1}
            lh = await acme.create_ledger(
                custom_metadata={NAMESPACE_KEY: b"acme/orders"}, **one)
            await lh.append(b"x" * 100)
            bad = await globex.create_ledger(
                custom_metadata={NAMESPACE_KEY: b"acme/orders"}, **one)
            with pytest.raises(UnauthorizedError):
                await bad.append(b"y")
        finally:
            for c in (acme, globex):
                await c.transport.close()
                await c.close()

        def fetch() -> str:
            url = f"http://{process.metrics_address}/metrics"
            with urllib.request.urlopen(url, timeout=10) as resp:
                return str(resp.read().decode())

        text = await asyncio.to_thread(fetch)
        assert 'pybk_tenant_write_records_total{namespace="acme/orders",tenant="acme"} 1.0' \
            in text
        assert ('pybk_tenant_rejected_requests_total{namespace="acme/orders",'
                'reason="unauthorized",tenant="globex"} 1.0') in text
        assert 'pybk_tenant_storage_quota_bytes{namespace="acme/orders",tenant="acme"}' in text
    finally:
        await process.stop()
