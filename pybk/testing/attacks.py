"""Hostile clients of a bookie, for tests and benchmarks of its defences (and for checking a
deployment): each :class:`Attack` opens real sockets to a bookie's address and does one thing
a well-behaved client never does. docs/protocol.md ("Limits") says what each runs into.

* :class:`LongPollFlood`: on each connection, as many long polls as it can with a 24-hour
  timeout, then close (the bookie must notice the close and cancel them);
* :class:`UnreadReads`: pipeline reads of a large entry and never read the answers (the
  bookie must not hold one answer per request);
* :class:`SilentConnections`: open connections and say nothing (on a TLS port: never start
  the handshake) - they hold descriptors and slots until the bookie's deadlines close them;
* :class:`ReconnectFlood`: keep N unauthenticated connections open, reopening each as soon
  as the bookie closes it (it must still let authenticated clients in);
* :class:`TinyBatchFlood` (ADD_BATCH of 65,536 tiny entries), :class:`FenceFlood` (FENCE
  ids no ledger has): keep such requests in flight on many connections.

Attacks run on the caller's event loop; ``await attack.start()`` opens what it opens,
``await attack.stop()`` closes everything it holds. ``attack.stats`` counts connections
opened, refused (at connect, or closed before any answer) and closed by the bookie.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import struct
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from pybk.transport import codec
from pybk.transport.fastpath import encode_batch_request
from pybk.wire import AddBatchRequest, FenceRequest, ReadRequest, Status, master_key

__all__ = [
    "Attack",
    "FenceFlood",
    "LongPollFlood",
    "ReconnectFlood",
    "SilentConnections",
    "TinyBatchFlood",
    "UnreadReads",
]


class _Held(asyncio.Protocol):
    """A connection that never reads (reading paused at once) and notes when it is closed."""

    def __init__(self, read: bool = False) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.received = 0
        self._read = read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self._read:
            transport.pause_reading()  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class Attack:
    """Base of the attacks: connections from ``local_addresses`` in turn (e.g. 127.0.0.2,
    127.0.0.3 on loopback: the bookie sees several peers), all closed by :meth:`stop`."""

    #: seconds a connect may take (the bookie's accept queue may be full)
    connect_timeout = 5.0

    def __init__(self, host: str, port: int, *,
                 local_addresses: Sequence[str | None] = (None,)) -> None:
        self.host = host
        self.port = port
        self._locals = itertools.cycle(list(local_addresses) or [None])
        self.held: list[_Held] = []
        self.stats: collections.Counter[str] = collections.Counter()
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopping = False

    async def open_one(self, read: bool = False) -> _Held | None:
        """Open one more connection (None if refused at connect); ``read``: take what the
        bookie sends (to see its close) instead of never reading."""
        local = next(self._locals)
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(loop.create_connection(
                lambda: _Held(read), self.host, self.port,
                local_addr=(local, 0) if local else None,
            ), self.connect_timeout)
        except OSError:  # (TimeoutError included: a full accept queue drops SYNs)
            self.stats["refused"] += 1
            return None
        self.stats["opened"] += 1
        self.held.append(proto)
        proto.closed.add_done_callback(lambda _f: self._closed(proto))
        return proto

    def _closed(self, proto: _Held) -> None:
        if not self.stopping:
            self.stats["closed_by_bookie"] += 1

    def open_count(self) -> int:
        """Connections held now (not closed by either side)."""
        return sum(1 for p in self.held if not p.closed.done())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        self.stopping = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for proto in self.held:
            if proto.transport is not None:
                proto.transport.abort()
        self.held.clear()


def _long_poll_frames(first_id: int, count: int, ledger_id: int) -> bytes:
    return b"".join(
        codec.encode_request(first_id + i, ReadRequest(ledger_id, 1 << 40,
                                                       previous_lac=(1 << 40) - 1,
                                                       timeout=86400.0))
        for i in range(count)
    )


class LongPollFlood(Attack):
    """``connections`` connections, each sending ``polls`` long polls (24 h timeout) on a
    ledger nobody writes, then closing its side (``close=False``: keeping it open)."""

    def __init__(self, host: str, port: int, *, connections: int, polls: int,
                 ledger_id: int = 0x7FFF_0000, close: bool = True,
                 local_addresses: Sequence[str | None] = (None,)) -> None:
        super().__init__(host, port, local_addresses=local_addresses)
        self.connections = connections
        self.polls = polls
        self.ledger_id = ledger_id
        self.close = close

    async def start(self) -> None:
        frames = _long_poll_frames(1, self.polls, self.ledger_id)

        async def one() -> None:
            proto = await self.open_one()
            if proto is None or proto.transport is None:
                return
            proto.transport.write(frames)
            if self.close:
                proto.transport.close()  # FIN once the polls are sent

        await asyncio.gather(*(one() for _ in range(self.connections)))


class UnreadReads(Attack):
    """``connections`` connections, each pipelining ``reads`` reads of one entry and never
    reading a byte of the answers."""

    def __init__(self, host: str, port: int, *, ledger_id: int, entry_id: int, reads: int,
                 connections: int = 1,
                 local_addresses: Sequence[str | None] = (None,)) -> None:
        super().__init__(host, port, local_addresses=local_addresses)
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.reads = reads
        self.connections = connections

    async def start(self) -> None:
        frames = b"".join(codec.encode_request(i + 1, ReadRequest(self.ledger_id, self.entry_id))
                          for i in range(self.reads))
        for _ in range(self.connections):
            proto = await self.open_one()
            if proto is not None and proto.transport is not None:
                proto.transport.write(frames)


class SilentConnections(Attack):
    """``count`` connections that say nothing (no TLS handshake either)."""

    def __init__(self, host: str, port: int, *, count: int,
                 local_addresses: Sequence[str | None] = (None,)) -> None:
        super().__init__(host, port, local_addresses=local_addresses)
        self.count = count

    async def start(self) -> None:
        for _ in range(self.count):
            await self.open_one(read=True)  # (reads only to see the bookie's close)


class ReconnectFlood(Attack):
    """Keep ``count`` silent (unauthenticated) connections open: each one the bookie closes
    or refuses is reopened at once (after ``pause`` seconds when refused at connect)."""

    def __init__(self, host: str, port: int, *, count: int, pause: float = 0.01,
                 local_addresses: Sequence[str | None] = (None,)) -> None:
        super().__init__(host, port, local_addresses=local_addresses)
        self.count = count
        self.pause = pause

    async def start(self) -> None:
        for _ in range(self.count):
            self._spawn(self._keep_one())

    async def _keep_one(self) -> None:
        while not self.stopping:
            proto = await self.open_one(read=True)
            if proto is None:
                await asyncio.sleep(self.pause)
                continue
            with contextlib.suppress(asyncio.CancelledError):
                await proto.closed
            self.held = [p for p in self.held if not p.closed.done()]


class TinyBatchFlood(Attack):
    """``connections`` connections (connection i writes ``ledger_ids[i % len]`` under
    ``master_key``), each keeping ``depth`` ADD_BATCH requests of ``entries`` new entries in
    flight: 44 bytes an entry on the wire (a 32-byte header, a 4-byte digest: the smallest a
    bookie stores), ids ascending. Counts ``sent`` and ``answered.<STATUS>``."""

    def __init__(self, host: str, port: int, *, ledger_ids: Sequence[int], master_key: bytes,
                 connections: int = 1, entries: int = 65536, depth: int = 4,
                 local_addresses: Sequence[str | None] = (None,)) -> None:
        super().__init__(host, port, local_addresses=local_addresses)
        self.ledger_ids = list(ledger_ids)
        self.master_key = master_key
        self.connections = connections
        self.entries = entries
        self.depth = depth
        self._next = collections.Counter[int]()  # ledger -> its next entry id

    def _frame(self, request_id: int, ledger_id: int) -> bytes:
        first = self._next[ledger_id]
        self._next[ledger_id] += self.entries
        ids = range(first, first + self.entries)
        head = struct.Struct(">qqqq4x").pack
        bodies = [head(ledger_id, e, -1, 0) for e in ids]
        return encode_batch_request(request_id, AddBatchRequest(
            ledger_id, self.master_key, list(ids), bodies))

    async def start(self) -> None:
        for i in range(self.connections):
            self._spawn(_pipelined(self, self.depth, functools.partial(
                self._frame, ledger_id=self.ledger_ids[i % len(self.ledger_ids)])))


async def _pipelined(attack: Attack, depth: int, frame: Callable[[int], bytes]) -> None:
    """One connection of ``attack`` keeping ``depth`` requests (``frame(request_id)``) in
    flight until stopped; counts ``sent`` and ``answered.<STATUS>`` in its stats."""
    local = next(attack._locals)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(
            attack.host, attack.port, local_addr=(local, 0) if local else None),
            attack.connect_timeout)
    except OSError:
        attack.stats["refused"] += 1
        return
    attack.stats["opened"] += 1
    slots = asyncio.Semaphore(depth)
    client = codec.Connection("client")

    async def answers() -> None:
        while data := await reader.read(1 << 20):
            for event in client.receive_data(data):
                status = getattr(getattr(event, "response", None), "status", None)
                name = Status(status).name if status is not None else "unreadable"
                attack.stats[f"answered.{name}"] += 1
                slots.release()
        if not attack.stopping:
            attack.stats["closed_by_bookie"] += 1

    reading = asyncio.ensure_future(answers())
    try:
        for request_id in itertools.count(1):
            await slots.acquire()
            writer.write(frame(request_id))
            attack.stats["sent"] += 1
            await writer.drain()
    except OSError:
        attack.stats["send_failed"] += 1
    finally:
        reading.cancel()
        writer.transport.abort()


class FenceFlood(Attack):
    """``connections`` connections, each keeping ``depth`` FENCEs of ids no ledger has (a
    wrong key) in flight: every one makes the bookie look the ledger up in its metadata."""

    def __init__(self, host: str, port: int, *, connections: int, depth: int = 4,
                 first_id: int = 1 << 40,
                 local_addresses: Sequence[str | None] = (None,)) -> None:
        super().__init__(host, port, local_addresses=local_addresses)
        self.connections = connections
        self.depth = depth
        self._ids = itertools.count(first_id)
        self._key = master_key(b"guess")

    async def start(self) -> None:
        for _ in range(self.connections):
            self._spawn(_pipelined(self, self.depth, lambda rid: codec.encode_request(
                rid, FenceRequest(next(self._ids), self._key))))
