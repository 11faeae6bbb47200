"""Cuttable peer links between etcd members on loopback (tests partition a live member).

Each member advertises a peer URL that is a proxy here, which forwards to the member's real
peer port. A proxy knows each connection's two ends: the member it serves, and the member
whose process owns the connecting socket (found in ``/proc``: etcd names the sender in a
header on raft requests, but not on every peer request, e.g. lease renewals forwarded to the
leader). ``isolate(i)`` closes every connection to or from member ``i`` and refuses new ones
until ``heal(i)``: the member stays alive and keeps serving its clients, but hears from no
peer (it loses its leader, as behind a real network partition). Needs no root and no
network namespace (Linux only). The proxies run on an event loop of their own, in a thread,
because the members talk through them while the test blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

__all__ = ["PeerLinks"]

_CHUNK = 64 * 1024


class PeerLinks:
    """One proxy per member: ``ports[i]`` (advertised) forwards to ``targets[i]`` (real);
    ``pids()`` says each member's process id now (None when it is down)."""

    def __init__(self, ports: list[int], targets: list[int],
                 pids: Callable[[], list[int | None]]) -> None:
        self.ports = ports
        self.targets = targets
        self._pids = pids
        self._isolated: set[int] = set()
        self._conns: dict[asyncio.Task[None], tuple[int, int | None]] = {}
        self.refused = 0  # connections closed or refused because a link was cut
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="pybk-etcd-links")
        self._thread.start()
        self._call(self._listen())

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _listen(self) -> None:
        for i, port in enumerate(self.ports):
            self._servers.append(await asyncio.start_server(
                functools.partial(self._serve, i), "127.0.0.1", port))

    def _sender(self, port: int, dest: int) -> int | None:
        """The member whose process holds the socket ``127.0.0.1:port`` connected to the
        proxy of ``dest`` (None when none does)."""
        want = f":{port:04X}"
        proxy = f":{self.ports[dest]:04X}"
        inode = ""
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            f = line.split()
            if f[1].endswith(want) and f[2].endswith(proxy):
                inode = f[9]
                break
        if not inode:
            return None
        socket = f"socket:[{inode}]"
        for i, pid in enumerate(self._pids()):
            if pid is None:
                continue
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(fd.path) == socket:
                            return i
        return None

    def _cut(self, dest: int, sender: int | None) -> bool:
        """(A sender not found is refused while any member is cut: nothing may leak.)"""
        if sender is None:
            return bool(self._isolated)
        return dest in self._isolated or sender in self._isolated

    async def _serve(self, dest: int, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        sender = self._sender(peer[1], dest) if peer else None
        if self._cut(dest, sender):
            self.refused += 1
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.targets[dest])
        except OSError:
            writer.close()
            return
        self._conns[task] = (dest, sender)
        try:
            await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))
        except asyncio.CancelledError:
            self.refused += 1
        finally:
            self._conns.pop(task, None)
            for w in (writer, up_w):
                w.close()

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(_CHUNK):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.close()

    def isolate(self, i: int) -> None:
        """Cut every link to and from member ``i``, open connections included."""
        async def cut() -> None:
            self._isolated.add(i)
            for task, (dest, sender) in list(self._conns.items()):
                if self._cut(dest, sender):
                    task.cancel()
        self._call(cut())

    def heal(self, i: int) -> None:
        async def mend() -> None:
            self._isolated.discard(i)
        self._call(mend())

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
            tasks = list(self._conns)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._loop.is_running():
            self._call(stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()
