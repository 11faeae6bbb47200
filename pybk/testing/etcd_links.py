"""Cuttable peer links between etcd members on loopback (tests partition a live member).

Each member advertises a peer URL that is a proxy here, which forwards to the member's real
peer port. etcd's peer requests (raft streams, raft messages, snapshots) name their sender
in the ``X-Server-From`` header, so a proxy knows each connection's two ends from its first
request. ``isolate(i, member_id)`` closes every connection to or from member ``i`` and
refuses new ones, in both directions, until ``heal(i)``: the member stays alive and keeps
serving its clients, but hears from no peer (it loses its leader, as behind a real network
partition). Needs no root and no network namespace. The proxies run on an event loop of
their own, in a thread, because the members talk through them while the test blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading

__all__ = ["PeerLinks"]

_HEADER_LIMIT = 64 * 1024


class PeerLinks:
    """One proxy per member: ``ports[i]`` (advertised) forwards to ``targets[i]`` (real)."""

    def __init__(self, ports: list[int], targets: list[int]) -> None:
        self.ports = ports
        self.targets = targets
        self._isolated: set[int] = set()
        self._isolated_ids: set[str] = set()
        self._conns: dict[asyncio.Task[None], tuple[int, str]] = {}
        self.refused = 0  # connections closed or refused because a link was cut
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="pybk-etcd-links")
        self._thread.start()
        self._call(self._listen())

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        for i, port in enumerate(self.ports):
            self._servers.append(await asyncio.start_server(
                functools.partial(self._serve, i), "127.0.0.1", port))

    def _cut(self, dest: int, sender: str) -> bool:
        return dest in self._isolated or sender in self._isolated_ids

    async def _serve(self, dest: int, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        sender = ""
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"x-server-from":
                sender = value.strip().decode("ascii", "replace").lower()
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
        up_w.write(head)
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
            while data := await src.read(_HEADER_LIMIT):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.close()

    def isolate(self, i: int, member_id: str) -> None:
        """Cut every link of member ``i`` (its etcd id in hex, as ``X-Server-From`` says)."""
        async def cut() -> None:
            self._isolated.add(i)
            self._isolated_ids.add(member_id.lower())
            for task, (dest, sender) in list(self._conns.items()):
                if self._cut(dest, sender):
                    task.cancel()
        self._call(cut())

    def heal(self, i: int, member_id: str) -> None:
        async def mend() -> None:
            self._isolated.discard(i)
            self._isolated_ids.discard(member_id.lower())
        self._call(mend())

    def close(self) -> None:
        async def stop() -> None:
            for s in self._servers:
                s.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.sleep(0)
        if self._loop.is_running():
            self._call(stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()
