"""The HTTP admin endpoint secure by default (issue 34, items 6 and 7): no token means no
mutations off loopback, HTTPS when the bookie has TLS, a per-address connection cap, health
reachable while the admin paths are busy, and clean 400s for what a peer can send."""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import aiohttp
import pytest
import trustme
from aiohttp.test_utils import make_mocked_request

from pybk.metadata.memory import MemoryMetadataStore
from pybk.server.http import AdminHttpServer, HttpConfig
from pybk.server.process import BookieProcess, BookieProcessConfig

from .test_http import Cluster


def _server(config: HttpConfig) -> AdminHttpServer:
    async def info() -> dict[str, object]:
        return {}
    from prometheus_client import CollectorRegistry
    return AdminHttpServer(config, registry=CollectorRegistry(), admin=None, info=info)


def test_without_a_token_mutations_are_refused_off_loopback() -> None:
    put = make_mocked_request("PUT", "/api/v1/autorecovery/status?enabled=false")
    open_port = _server(HttpConfig(host="0.0.0.0"))
    refusal = open_port._mutation_refusal(put)
    assert refusal is not None and refusal.status == 403
    assert "refused" in open_port.admin_policy()
    assert _server(HttpConfig(host="127.0.0.1"))._mutation_refusal(put) is None
    assert _server(HttpConfig(host="::1"))._mutation_refusal(put) is None
    told = _server(HttpConfig(host="0.0.0.0", allow_open_admin=True))
    assert told._mutation_refusal(put) is None and "NO TOKEN" in told.admin_policy()
    tokened = _server(HttpConfig(host="0.0.0.0", token=b"t"))
    refusal = tokened._mutation_refusal(put)
    assert refusal is not None and refusal.status == 401


async def test_the_policy_is_logged_at_start(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    c = Cluster(tmp_path, MemoryMetadataStore())
    with caplog.at_level(logging.WARNING, logger="pybk.server.http"):
        await c.start("b0", http_config=HttpConfig())
        try:
            assert any("HTTP admin endpoint" in r.getMessage()
                       and "loopback" in r.getMessage() for r in caplog.records)
        finally:
            await c.stop("b0")


async def _raw(address: str, request: bytes, local: str = "127.0.0.1") -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(local, 0))
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 10.0)
    finally:
        writer.close()


async def test_bad_input_gets_a_clean_400_or_401_and_no_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = Cluster(tmp_path, MemoryMetadataStore())
    await c.start("b0")
    try:
        address = c.processes["b0"].http_address
        with caplog.at_level(logging.ERROR):
            for lid in (str(1 << 63), str(1 << 64), "9" * 400):
                answer = await _raw(address, (
                    f"GET /api/v1/ledger/metadata?ledger_id={lid} HTTP/1.1\r\nHost: x\r\n"
                    "Connection: close\r\n\r\n").encode())
                assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
            answer = await _raw(address, (
                b"PUT /api/v1/autorecovery/status?enabled=false HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer \xff\xfe\x80\r\nConnection: close\r\n\r\n"))
            assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        await c.stop("b0")


async def test_one_address_cannot_take_every_connection(tmp_path: Path) -> None:
    c = Cluster(tmp_path, MemoryMetadataStore())
    process = await c.start("b0", http_config=HttpConfig(token=b"t", max_connections_per_ip=4))
    try:
        host, port = process.http_address.rsplit(":", 1)
        held = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
        # a fifth from the same address is closed unanswered; another address is served
        refused = await _raw(process.http_address, b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n"
                             b"Connection: close\r\n\r\n")
        assert refused == b""
        served = await _raw(process.http_address, b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n"
                            b"Connection: close\r\n\r\n", local="127.0.0.2")
        assert served.startswith(b"HTTP/1.1 200")
        for _r, w in held:
            w.close()
        server = process._http[0]

        async def released() -> bool:
            return server.connections_from("127.0.0.1") == 0

        from pybk.testing.metadata_helpers import wait_until
        await wait_until(released, 10.0, "the closed connections to be released")
        again = await _raw(process.http_address, b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n"
                           b"Connection: close\r\n\r\n")
        assert again.startswith(b"HTTP/1.1 200")
    finally:
        await c.stop("b0")


async def test_a_tls_bookie_serves_its_admin_endpoint_over_https(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = tmp_path / "server.pem"
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(cert)
    config = BookieProcessConfig(
        data_dir=str(tmp_path / "b0"), metadata="memory://", port=0, bookie_id="b0",
        http_port=0, tls_cert=str(cert), http_config=HttpConfig(token=b"t"))
    process = BookieProcess(config, store=MemoryMetadataStore().session())
    await process.start()
    try:
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://{process.http_address}/heartbeat", ssl=ctx) as r:
                assert r.status == 200
            with pytest.raises(aiohttp.ClientError):  # no plain HTTP: the token stays secret
                async with http.get(f"http://{process.http_address}/heartbeat") as r:
                    await r.read()
    finally:
        await process.stop()
