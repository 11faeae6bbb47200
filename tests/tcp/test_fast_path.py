"""The server's fast path for adds (``Bookie.add_nowait``: no task per request)."""

from __future__ import annotations

import asyncio

from pybk.bookie import Bookie
from pybk.storage import MemFileSystem
from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport
from pybk.wire import AddRequest, DigestManager, ReadRequest, Status, master_key

KEY = master_key(b"")


def _resolver(server: BookieServer):  # type: ignore[no-untyped-def]
    async def resolve(bookie_id: str) -> str:
        host, port = server.address
        return f"{host}:{port}"

    return resolve


async def _bookie() -> tuple[Bookie, MemFileSystem]:
    fs = MemFileSystem()
    fs.makedirs("/b")
    bookie = Bookie("b1", "/b", fs=fs)
    await bookie.start()
    return bookie, fs


def _add(entry: int) -> AddRequest:
    return AddRequest(1, entry, KEY, DigestManager(1).frame(entry, entry - 1, entry + 1, b"x"))


async def test_adds_go_through_the_fast_path_and_answer_like_handle() -> None:
    bookie, _fs = await _bookie()
    fast: list[int] = []

    def add_nowait(request, reply) -> None:  # type: ignore[no-untyped-def]
        fast.append(request.entry_id)
        bookie.add_nowait(request, reply)

    async with BookieServer(bookie.handle, add_nowait=add_nowait) as server:
        transport = TcpTransport(_resolver(server))
        responses = await asyncio.gather(*(transport.send("b1", _add(e), 5.0) for e in range(200)))
        assert [r.status for r in responses] == [Status.OK] * 200
        assert sorted(fast) == list(range(200)) and server.stats["requests"] == 200
        read = await transport.send("b1", ReadRequest(1, 7), 5.0)  # non-adds: the handler
        assert read.status == Status.OK and read.body == _add(7).body
        # an error answered synchronously by the fast path (wrong master key)
        bad = await transport.send("b1", AddRequest(1, 500, b"wrong", _add(500).body), 5.0)
        assert bad.status == Status.UNAUTHORIZED
        await transport.close()
    await bookie.stop()


async def test_stop_waits_for_fast_adds_in_flight() -> None:
    bookie, fs = await _bookie()
    fs.sync_delay = 0.3  # a slow disk: the adds are still in flight when stop() begins
    server = BookieServer(bookie.handle, add_nowait=bookie.add_nowait)
    await server.start()
    transport = TcpTransport(_resolver(server))
    futs = [transport.send("b1", _add(e), 10.0) for e in range(20)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while server.stats["requests"] == 0 and not any(c.fast_adds for c in server.connections):
        assert loop.time() < deadline, "adds never reached the server"
        await asyncio.sleep(0.01)
    await server.stop(grace=5.0)
    responses = await asyncio.gather(*futs)
    assert [r.status for r in responses] == [Status.OK] * 20, "answered before the close"
    await transport.close()
    await bookie.stop()
