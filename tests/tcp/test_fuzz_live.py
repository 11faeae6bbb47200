"""Hypothesis against a live server: random and mutated byte streams on one connection must
never raise inside the server (the loop's exception handler stays silent), and a well-behaved
client on another connection is served right after each attack."""

from __future__ import annotations

import asyncio
import struct

import crc32c
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pybk.transport import codec
from pybk.transport.server import BookieServer, ServerConfig
from pybk.transport.tcp import TcpTransport
from pybk.wire import AddRequest, AuthRequest, ReadLacRequest, ReadRequest, Status

from .conftest import StubBookie

valid_frames = st.sampled_from(
    [
        codec.encode_request(1, AddRequest(1, 0, b"k", b"payload")),
        codec.encode_request(2, ReadRequest(1, 0, fence=True, master_key=b"k")),
        codec.encode_request(3, ReadRequest(1, -1, previous_lac=3, timeout=0.01)),
        codec.encode_request(4, ReadLacRequest(1)),
        codec.encode_request(5, AuthRequest(b"not-the-token")),
    ]
)


@st.composite
def attacks(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["random", "mutated", "length", "concat", "valid"]))
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=512))
    frame = bytearray(draw(valid_frames))
    if kind == "length":
        struct.pack_into(">I", frame, 0, draw(st.integers(0, 2**32 - 1)))
        return bytes(frame)
    if kind == "valid":
        return bytes(frame)
    if kind == "concat":
        return bytes(frame) + draw(st.binary(max_size=64)) + draw(valid_frames)
    for _ in range(draw(st.integers(1, 4))):
        frame[draw(st.integers(0, len(frame) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):  # keep the CRC valid so the body decoder is reached
        struct.pack_into(">I", frame, 4, crc32c.crc32c(bytes(frame[8:])))
    return bytes(frame)


async def _scenario(data: bytes, token: bytes | None) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    stub = StubBookie()
    config = ServerConfig(frame_timeout=0.2, idle_timeout=5.0)
    async with BookieServer(stub.handle, auth_token=token, config=config) as server:
        host, port = server.address
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(data)
        writer.write_eof()
        async with asyncio.timeout(10):  # the server answers and/or closes; never hangs
            try:
                while await reader.read(65536):
                    pass
            except ConnectionError:
                pass
        writer.close()
        host, port = server.address

        async def resolve(_: str) -> str:
            return f"{host}:{port}"

        good = TcpTransport(resolve, auth_token=token)
        resp = await good.send("b", AddRequest(7, 0, b"k", b"good"), 5.0)
        assert resp.status == Status.OK
        await good.close()
        if token is not None:  # nothing from the unauthenticated attacker reached the bookie
            assert all(getattr(c, "ledger_id", None) == 7 for c in stub.calls)
    assert errors == []


@settings(derandomize=True, deadline=None, max_examples=60,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(attacks(), st.sampled_from([None, b"tok"]))
@example(codec.encode_request(1, AddRequest(1, 0, b"k", b"sneaky")), b"tok")
def test_live_server_survives_hostile_bytes(data, token):
    asyncio.run(_scenario(data, token))
