"""In-process bookies behind real TCP servers on loopback (free ports), registered in a memory
metadata store: a :class:`pybk.client.Client` on that store reaches them over TCP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from pybk.bookie import Bookie
from pybk.metadata.base import BookieRegistration
from pybk.metadata.memory import MemoryMetadataStore
from pybk.storage import MemFileSystem
from pybk.transport.server import BookieServer


class TcpBookies:
    """The store, and per bookie id its Bookie and BookieServer."""

    def __init__(self, store: MemoryMetadataStore) -> None:
        self.store = store
        self.bookies: dict[str, Bookie] = {}
        self.servers: dict[str, BookieServer] = {}


@asynccontextmanager
async def tcp_bookies(n: int = 3, **bookie_kwargs: Any) -> AsyncIterator[TcpBookies]:
    store = MemoryMetadataStore()
    out = TcpBookies(store)
    async with AsyncExitStack() as stack:
        for i in range(n):
            fs = MemFileSystem()
            fs.makedirs(f"/b{i}")
            bookie = Bookie(f"b{i}", f"/b{i}", fs=fs, **bookie_kwargs)
            await bookie.start()
            stack.push_async_callback(bookie.stop)
            server = BookieServer(bookie.handle, add=bookie.add_request,
                                  response_size=bookie.response_size_hint)
            await server.start()
            stack.push_async_callback(server.stop)
            host, port = server.address
            await store.register_bookie(BookieRegistration(f"b{i}", f"{host}:{port}"))
            out.bookies[f"b{i}"] = bookie
            out.servers[f"b{i}"] = server
        yield out
