"""Token authentication and TLS (certificates from trustme).

Rejections must happen before the handler (the bookie) sees anything: the stub records every
call, and each refusal test asserts it recorded none.
"""

from __future__ import annotations

import asyncio
import ssl
import struct

import pytest
import trustme

from pybk.errors import BookieUnavailableError, ProtocolError
from pybk.transport import codec
from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport
from pybk.transport.tls import client_context, server_context
from pybk.wire import AddRequest, AuthRequest, ReadRequest, Status

from .conftest import wait_until

TOKEN = b"s3cret-token"


def _resolver(server: BookieServer):
    host, port = server.address

    async def resolve(bookie_id: str) -> str:
        return f"{host}:{port}"

    return resolve


# ------------------------------------------------------------------------------ token auth


async def test_right_token_is_served(stub):
    async with BookieServer(stub.handle, auth_token=TOKEN) as server:
        transport = TcpTransport(_resolver(server), auth_token=TOKEN)
        resp = await transport.send("b", AddRequest(1, 0, b"k", b"x" * 10_000), 5.0)
        assert resp.status == Status.OK  # a big frame is fine once authenticated
        await transport.close()
        assert stub.calls and server.stats["auth_failed"] == 0


async def test_no_token_is_refused_without_state_change(stub):
    async with BookieServer(stub.handle, auth_token=TOKEN) as server:
        transport = TcpTransport(_resolver(server))
        resp = await transport.send("b", AddRequest(1, 0, b"k", b"x"), 5.0)
        assert resp.status == Status.UNAUTHORIZED
        await transport.close()
        assert stub.calls == [] and stub.entries == {}
        assert server.stats["unauthenticated_request"] == 1


async def test_wrong_token_is_refused_without_state_change(stub):
    async with BookieServer(stub.handle, auth_token=TOKEN) as server:
        transport = TcpTransport(_resolver(server), auth_token=b"s3cret-tokeN")
        futs = [transport.send("b", AddRequest(1, i, b"k", b"x"), 5.0) for i in range(5)]
        assert [(await f).status for f in futs] == [Status.UNAUTHORIZED] * 5
        await transport.close()
        assert stub.calls == [] and stub.entries == {}
        assert server.stats["auth_failed"] == 1


async def test_big_frame_pipelined_behind_auth_is_judged_after_auth(stub):
    """AUTH and a 10 KB add in one write: the add is checked against the post-auth cap."""
    async with BookieServer(stub.handle, auth_token=TOKEN) as server:
        host, port = server.address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            codec.encode_request(1, AuthRequest(TOKEN))
            + codec.encode_request(2, AddRequest(1, 0, b"k", b"x" * 10_000))
        )
        conn = codec.Connection("client")
        events: list = []
        async with asyncio.timeout(5):
            while len(events) < 2:
                events += conn.receive_data(await reader.read(4096))
        assert [(e.request_id, e.response.status) for e in events] == [
            (1, Status.OK),
            (2, Status.OK),
        ]
        writer.close()


async def test_pre_auth_frames_are_capped_small(stub):
    async with BookieServer(stub.handle, auth_token=TOKEN) as server:
        host, port = server.address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(codec.encode_request(1, AddRequest(1, 0, b"k", b"x" * 10_000)))
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed without an answer
        assert server.stats["frame_too_large"] == 1
        # even a 2 GiB length prefix costs nothing
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(struct.pack(">I", 1 << 31))
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        assert stub.calls == []


async def test_unauthenticated_connection_must_authenticate_in_time(stub):
    from pybk.transport.server import ServerConfig

    config = ServerConfig(auth_timeout=0.2)
    async with BookieServer(stub.handle, auth_token=TOKEN, config=config) as server:
        host, port = server.address
        reader, _writer = await asyncio.open_connection(host, port)
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        assert server.stats["auth_timeout"] == 1


async def test_auth_without_server_token_is_accepted(stub):
    async with BookieServer(stub.handle) as server:
        transport = TcpTransport(_resolver(server), auth_token=b"anything")
        resp = await transport.send("b", ReadRequest(1, 0), 5.0)
        assert resp.status == Status.NO_SUCH_ENTRY
        await transport.close()


def test_empty_tokens_refused():
    with pytest.raises(ValueError, match="auth_token"):
        BookieServer(lambda r: None, auth_token=b"")  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="auth_token"):
        TcpTransport(_resolver_dummy, auth_token=b"")


async def _resolver_dummy(bookie_id: str) -> str:
    return "127.0.0.1:1"


def test_auth_request_token_comparison_uses_hmac(monkeypatch):
    """The token check goes through hmac.compare_digest (constant time)."""
    import pybk.transport.identity as server_mod  # (the token check lives there)

    seen = []
    real = server_mod.hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(server_mod.hmac, "compare_digest", spy)

    async def run() -> None:
        async with BookieServer(lambda r: None, auth_token=TOKEN) as server:  # type: ignore[arg-type, return-value]
            host, port = server.address
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(codec.encode_request(1, AuthRequest(b"guess")))
            conn = codec.Connection("client")
            async with asyncio.timeout(5):
                events = conn.receive_data(await reader.read(4096))
            assert events[0].response.status == Status.UNAUTHORIZED

    asyncio.run(run())
    assert seen == [(b"guess", TOKEN)]


# ------------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pki(ca, tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    client_cert = ca.issue_cert("client@pybk.test", common_name="client")
    paths = {
        "ca": d / "ca.pem",
        "server": d / "server.pem",
        "client": d / "client.pem",
        "other_ca": d / "other_ca.pem",
        "other_client": d / "other_client.pem",
    }
    ca.cert_pem.write_to_path(paths["ca"])
    server_cert.private_key_and_cert_chain_pem.write_to_path(paths["server"])
    client_cert.private_key_and_cert_chain_pem.write_to_path(paths["client"])
    other = trustme.CA()
    other.cert_pem.write_to_path(paths["other_ca"])
    other.issue_cert("client@pybk.test").private_key_and_cert_chain_pem.write_to_path(
        paths["other_client"]
    )
    return paths


def _mtls_server(stub, pki) -> BookieServer:
    ctx = server_context(pki["server"], cafile=pki["ca"], require_client_cert=True)
    return BookieServer(stub.handle, ssl_context=ctx)


async def test_mutual_tls_round_trip(stub, pki):
    async with _mtls_server(stub, pki) as server:
        ctx = client_context(pki["ca"], certfile=pki["client"])
        transport = TcpTransport(_resolver(server), ssl_context=ctx)
        resp = await transport.send("b", AddRequest(1, 0, b"k", b"tls"), 5.0)
        assert resp.status == Status.OK
        conn = server.connections[0]
        assert conn.transport is not None
        assert conn.transport.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        await transport.close()


async def _refused(transport: TcpTransport) -> None:
    """The request fails as BookieUnavailable. Under TLS 1.3 a refused client certificate
    surfaces after the handshake, as the connection dropping; under 1.2 at connect."""
    with pytest.raises(BookieUnavailableError):
        await transport.send("b", AddRequest(1, 0, b"k", b"x"), 5.0)
    await transport.close()


async def test_client_with_wrong_ca_refuses_server(stub, pki):
    async with _mtls_server(stub, pki) as server:
        ctx = client_context(pki["other_ca"], certfile=pki["client"])
        await _refused(TcpTransport(_resolver(server), ssl_context=ctx))
        assert stub.calls == []


async def test_client_cert_from_foreign_ca_refused(stub, pki):
    async with _mtls_server(stub, pki) as server:
        ctx = client_context(pki["ca"], certfile=pki["other_client"])
        await _refused(TcpTransport(_resolver(server), ssl_context=ctx))
        assert stub.calls == [] and server.connections == []


async def test_missing_client_cert_refused_when_required(stub, pki):
    async with _mtls_server(stub, pki) as server:
        ctx = client_context(pki["ca"])
        await _refused(TcpTransport(_resolver(server), ssl_context=ctx))
        assert stub.calls == [] and server.connections == []


async def test_missing_client_cert_refused_under_tls12(stub, pki):
    async with _mtls_server(stub, pki) as server:
        ctx = client_context(pki["ca"])
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        await _refused(TcpTransport(_resolver(server), ssl_context=ctx))
        assert stub.calls == []


async def test_plaintext_to_tls_port_refused(stub, pki):
    async with _mtls_server(stub, pki) as server:
        await _refused(TcpTransport(_resolver(server)))
        host, port = server.address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(codec.encode_request(1, AddRequest(1, 0, b"k", b"x")))
        async with asyncio.timeout(5):
            try:
                data = await reader.read()
            except ConnectionError:
                data = b""
        try:  # whatever came back (a TLS alert, or nothing) is no pybk response
            events = codec.Connection("client").receive_data(data)
        except ProtocolError:
            events = []
        assert events == []
        writer.close()
        await wait_until(lambda: server.connections == [])
        assert stub.calls == []


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
async def test_tls_below_1_2_refused(stub, pki):
    async with _mtls_server(stub, pki) as server:
        ctx = client_context(pki["ca"], certfile=pki["client"])
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        await _refused(TcpTransport(_resolver(server), ssl_context=ctx))
        assert stub.calls == []


def test_require_client_cert_needs_a_ca(pki):
    with pytest.raises(ValueError, match="CA"):
        server_context(pki["server"], require_client_cert=True)
