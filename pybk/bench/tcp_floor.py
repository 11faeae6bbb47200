"""The floor of a lone replicated write over loopback TCP: the least a Python program does.

A lone writer's append over TCP waits for ``Qa`` bookie processes to take the entry, write it,
``fdatasync`` it and answer. Part of that is the disk's (``ceiling.replica_sync_floor``), part
the machine's: a message across loopback wakes a process on another (virtual) CPU, each process
leaves its event loop's wait and enters it again, and on a 2-core VM the replicas' processes
take turns on the cores. This module measures that machine part with the simplest program that
does what a bookie must, so the lone-writer row compares pybk with it in the same run (listed
in docs/internals.md, "pybk/bench/tcp_floor.py").
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path
from typing import Final

from pybk.bench.ceiling import RecordFile, frame_records

__all__ = ["FloorServers", "tcp_floor_servers"]

_LEN: Final = struct.Struct(">I")
_ANSWER: Final = b"ok\x00\x00\x00\x00\x00\x00"
#: the servers' files: enough for every record of a measurement, written in place and
#: wrapped round at the end (``RecordFile``)
_FILE_SIZE: Final = 16 << 20


class _Server(asyncio.Protocol):
    """Takes length-prefixed records; writes, syncs and answers each one."""

    def __init__(self, file: RecordFile) -> None:
        self.file = file
        self.synced = 0
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        answers = 0
        while len(self.buffer) >= 4:
            (size,) = _LEN.unpack_from(self.buffer)
            if len(self.buffer) < 4 + size:
                break
            self.file.write(bytes(self.buffer[4:4 + size]))
            self.file.sync()
            del self.buffer[:4 + size]
            answers += 1
            self.synced += 1
        if answers and self.transport is not None:
            self.transport.write(_ANSWER * answers)


async def _serve(path: str) -> None:
    file = RecordFile(path, preallocate=True, prealloc_size=_FILE_SIZE)
    loop = asyncio.get_running_loop()
    served: list[_Server] = []

    def serve() -> _Server:
        served.append(_Server(file))
        return served[-1]

    server = await loop.create_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    # until the parent closes our stdin (or stops us by PID)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    server.close()
    file.close()
    print(sum(s.synced for s in served), flush=True)  # records written and synced


class _Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.got = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= len(_ANSWER) and self.waiter is not None and not self.waiter.done():
            self.got -= len(_ANSWER)
            self.waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("a floor server went away"))


class FloorServers:
    """Running floor servers (from :func:`tcp_floor_servers`)."""

    def __init__(self, clients: list[_Client], message: bytes) -> None:
        self._clients = clients
        self._message = message
        #: records each server wrote and synced, filled in when the servers have stopped
        self.synced: list[int] = []

    async def measure(self, duration: float) -> list[float]:
        """Lone replicated writes for ``duration`` seconds: their latencies (seconds)."""
        running = asyncio.get_running_loop()
        clock = time.perf_counter
        latencies: list[float] = []
        end = clock() + duration
        while clock() < end:
            t0 = clock()
            for c in self._clients:
                c.waiter = running.create_future()
                assert c.transport is not None
                c.transport.write(self._message)
            for c in self._clients:
                assert c.waiter is not None
                await c.waiter
            latencies.append(clock() - t0)
        return latencies


@asynccontextmanager
async def tcp_floor_servers(directory: str | Path, replicas: int = 2, loop: str = "asyncio",
                            size: int = 100) -> AsyncIterator[FloorServers]:
    """Start ``replicas`` floor servers on event loop ``loop`` (files under ``directory``,
    removed when they stop) and connect to them; ``measure(duration)`` on what it yields runs
    lone replicated writes of ``size``-byte records. It can be called between a caller's own
    measurements (the disk's latency drifts, so turns taken in the same minutes compare
    best). The servers are stopped when the block ends (their stdin closed; by PID after
    10 s), and ``synced`` then says how many records each wrote and synced."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    record = b"".join(frame_records(os.urandom(size), 1))
    running = asyncio.get_running_loop()
    procs: list[asyncio.subprocess.Process] = []
    async with AsyncExitStack() as stack:
        for i in range(replicas):
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "pybk.bench.tcp_floor",
                str(Path(directory) / f"tcp-floor-{i}.log"), loop,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            stack.push_async_callback(_stop, proc)
            procs.append(proc)
        clients = []
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            if not line.strip():
                raise RuntimeError(f"a floor server (pid {proc.pid}) did not start")
            transport, client = await running.create_connection(
                _Client, "127.0.0.1", int(line))
            stack.callback(transport.close)
            clients.append(client)
        servers = FloorServers(clients, _LEN.pack(len(record)) + record)
        yield servers
    for proc in procs:
        assert proc.stdout is not None
        tail = (await proc.stdout.read()).split()
        servers.synced.append(int(tail[-1]) if tail else -1)


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        with suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def main(argv: list[str]) -> None:
    from pybk.runtime.eventloop import run

    path, loop = argv
    run(_serve(path), loop)


if __name__ == "__main__":
    main(sys.argv[1:])
