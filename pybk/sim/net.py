"""The simulated network: a :class:`~pybk.transport.base.Transport` with seeded faults.

Every client gets its own endpoint (:meth:`SimNetwork.endpoint`); every bookie incarnation is a
``handler(request) -> Awaitable[Response]`` registered with :meth:`SimNetwork.set_bookie`.
Messages travel on per-(client, bookie) connections, like TCP: in order (unless the reorder
knob is on), each direction delayed by a sampled latency.

Fault model (research/reliability.md 3.5), all drawn from one injected ``random.Random``:

* **drop**: the message vanishes; the caller sees a timeout (``pybk.TimeoutError``).
* **duplicate**: a request is delivered twice (the second copy later); bookies must be
  idempotent.
* **reorder**: a message may overtake earlier ones on its connection.
* **corrupt**: modelled as "the frame CRC caught it": the receiver closes the connection, so
  every request pending on it fails with ``BookieUnavailableError``.
* **reset**: the connection is reset at once (``BookieUnavailableError``).
* **partitions**: directed links are blocked (messages dropped); symmetric, asymmetric,
  isolate-one and swizzle-clog are built from :meth:`block`/:meth:`unblock` by
  :mod:`pybk.sim.faults`.
* **pause**: a paused node's traffic (both directions) is held and released on resume, which
  is how a frozen process looks from the outside (its adds arrive late, after its timeouts).

A crashed bookie resets its connections (the kernel answers RST for a dead process) and new
requests fail fast with ``BookieUnavailableError`` (connection refused).

Observers see every response a bookie *produced* (delivered or not): the checker uses them for
bookie-honesty invariants (an OK add is a durability promise even if the reply is lost).
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from math import log as _log
from typing import Any

from pybk.errors import BookieUnavailableError
from pybk.errors import TimeoutError as BKTimeoutError
from pybk.protocol import Request, Response
from pybk.transport.base import Transport

__all__ = [
    "Handler",
    "NetConfig",
    "Observer",
    "SimNetwork",
    "SimTransport",
]

Handler = Callable[[Request], Awaitable[Response]]
Observer = Callable[[str, str, Request, Response], None]


@dataclass
class NetConfig:
    """Knobs of the simulated network (probabilities are per message)."""

    latency_min: float = 0.0005
    latency_mean: float = 0.002  # mean of the exponential part added to latency_min
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    reset: float = 0.0
    #: Used when a caller passes ``timeout=None``: a dropped message must still end somehow.
    default_timeout: float = 10.0

    def quiet(self) -> NetConfig:
        """The same latencies without any message faults (the heal phase)."""
        return NetConfig(self.latency_min, self.latency_mean, default_timeout=self.default_timeout)


class _Conn:
    """One (client, bookie) connection: a generation number and the requests pending on it."""

    __slots__ = ("gen", "last_arrival_back", "last_arrival_fwd", "pending")

    def __init__(self) -> None:
        self.gen = 0
        self.pending: dict[int, asyncio.Future[Response]] = {}
        self.last_arrival_fwd = 0.0
        self.last_arrival_back = 0.0


class SimNetwork:
    """All links of one simulated cluster."""

    def __init__(
        self,
        rng: random.Random,
        config: NetConfig | None = None,
        trace: Callable[[str], None] | None = None,
        count: Callable[[str], None] | None = None,
    ) -> None:
        self.rng = rng
        self.config = config or NetConfig()
        self._trace = trace or (lambda line: None)
        self._count = count or (lambda kind: None)
        self._bookies: dict[str, Handler | None] = {}
        self._incarnation: dict[str, int] = {}
        self._conns: dict[tuple[str, str], _Conn] = {}
        self._blocked: dict[tuple[str, str], bool] = {}
        self._paused: dict[str, list[Callable[[], None]]] = {}
        self._dead_clients: dict[str, bool] = {}
        self._seq = 0
        #: Extra one-way delay per directed link (a slow path; order is kept).
        self.slow: dict[tuple[str, str], float] = {}
        #: Bookies whose next fencing request is lost (a targeted fault, BUGGIFY-style).
        self.lose_next_fence: dict[str, int] = {}
        #: Bookies whose recovery reads (fencing reads of an entry) are lost until a time.
        self.lose_recovery_reads: dict[str, float] = {}
        self.observers: list[Observer] = []
        #: Called with every request a client sends (before any fault): (client, bookie,
        #: request). The runner learns which adds ever left a client.
        self.send_observers: list[Callable[[str, str, Request], None]] = []
        #: Called when a bookie's request handler raises (it must answer, never raise):
        #: (bookie, request, exception). None: counted and traced only.
        self.on_handler_error: Callable[[str, Request, BaseException], None] | None = None
        self.messages = 0
        #: pending requests' deadlines: (when, seq, conn, bookie, request, limit), a heap
        self._deadlines: list[tuple[float, int, _Conn, str, Request, float]] = []
        self._deadline_timer: asyncio.TimerHandle | None = None

    # -- topology ----------------------------------------------------------------------------

    def endpoint(self, client: str) -> SimTransport:
        return SimTransport(self, client)

    def set_bookie(self, bookie_id: str, handler: Handler | None) -> None:
        """Install a bookie incarnation (or None: the bookie is down). Resets its connections."""
        self._incarnation[bookie_id] = self._incarnation.get(bookie_id, 0) + 1
        self._bookies[bookie_id] = handler
        for (client, bid) in sorted(self._conns):
            if bid == bookie_id:
                self._reset(client, bid, "bookie restarted" if handler else "bookie down")

    def bookie_up(self, bookie_id: str) -> bool:
        return self._bookies.get(bookie_id) is not None

    def block(self, src: str, dst: str) -> None:
        """Drop every message from ``src`` to ``dst`` until :meth:`unblock`."""
        self._blocked[(src, dst)] = True

    def unblock(self, src: str, dst: str) -> None:
        self._blocked.pop((src, dst), None)

    def heal(self) -> None:
        """Remove every partition and resume every paused node."""
        self._blocked.clear()
        self.slow.clear()
        self.lose_next_fence.clear()
        self.lose_recovery_reads.clear()
        for node in sorted(self._paused):
            self.resume(node)

    def blocked_links(self) -> list[tuple[str, str]]:
        return sorted(self._blocked)

    def pause(self, node: str) -> None:
        """Freeze a node's traffic: messages to and from it wait until :meth:`resume`."""
        self._paused.setdefault(node, [])

    def resume(self, node: str) -> None:
        held = self._paused.pop(node, [])
        for release in held:
            release()

    def kill_client(self, client: str) -> None:
        """The client process died: its connections go away and it never hears back.

        Whatever its leftover tasks still try to send goes nowhere (the futures never
        resolve), so a zombie cannot spin the simulation at one instant of virtual time."""
        self._dead_clients[client] = True
        for (c, bid) in sorted(self._conns):
            if c == client:
                self._reset(c, bid, "client crashed")

    # -- sending -----------------------------------------------------------------------------

    def _conn(self, client: str, bookie_id: str) -> _Conn:
        key = (client, bookie_id)
        conn = self._conns.get(key)
        if conn is None:
            conn = self._conns[key] = _Conn()
        return conn

    def _reset(self, client: str, bookie_id: str, why: str) -> None:
        conn = self._conns.get((client, bookie_id))
        if conn is None:
            return
        conn.gen += 1
        pending = list(conn.pending.items())
        conn.pending.clear()
        if pending:
            self._trace(f"net reset {client}->{bookie_id} ({why}); {len(pending)} pending fail")
        for _, fut in pending:
            if not fut.done():
                fut.set_exception(BookieUnavailableError(f"{bookie_id}: connection reset ({why})"))

    def _latency(self) -> float:
        cfg = self.config
        return cfg.latency_min - _log(1.0 - self.rng.random()) * cfg.latency_mean

    def send(
        self, client: str, bookie_id: str, request: Request, timeout: float | None
    ) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Response] = loop.create_future()
        if self._dead_clients and self._dead_clients.get(client):
            return fut  # a dead process sends nothing and hears nothing, ever
        self.messages += 1
        self._seq += 1
        seq = self._seq
        for watch in self.send_observers:
            watch(client, bookie_id, request)
        conn = self._conns.get((client, bookie_id))
        if conn is None:
            conn = self._conns[(client, bookie_id)] = _Conn()
        if self._bookies.get(bookie_id) is None:
            # Connection refused, after a round trip.
            loop.call_later(2 * self._latency(), _fail, fut,
                            BookieUnavailableError(f"{bookie_id}: connection refused"))
            return fut
        conn.pending[seq] = fut
        limit = self.config.default_timeout if timeout is None else timeout
        self._deadline(loop, loop.time() + limit, seq, conn, bookie_id, request, limit)
        if self.lose_next_fence and self.lose_next_fence.get(bookie_id) and _is_fence(request):
            self.lose_next_fence[bookie_id] -= 1
            self._count("lost_fence")
            self._trace(f"net lost fencing {type(request).__name__} {client}->{bookie_id}")
            return fut
        if (self.lose_recovery_reads
                and self.lose_recovery_reads.get(bookie_id, -1.0) > loop.time()
                and _is_recovery_read(request)):
            self._count("lost_recovery_read")
            self._trace(f"net lost recovery read {client}->{bookie_id}")
            return fut
        self._transmit(client, bookie_id, conn, conn.gen, True, seq, request)
        return fut

    # -- timeouts: one heap of deadlines and one timer for the earliest (no timer per request)

    def _deadline(self, loop: asyncio.AbstractEventLoop, when: float, seq: int, conn: _Conn,
                  bookie_id: str, request: Request, limit: float) -> None:
        heapq.heappush(self._deadlines, (when, seq, conn, bookie_id, request, limit))
        timer = self._deadline_timer
        if timer is None or when < timer.when():
            if timer is not None:
                timer.cancel()
            self._deadline_timer = loop.call_at(when, self._expire_due)

    def _expire_due(self) -> None:
        """Fail the requests whose time is up (those still pending), then wait for the next
        deadline."""
        self._deadline_timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _when, seq, conn, bookie_id, request, limit = heapq.heappop(heap)
            fut = conn.pending.pop(seq, None)
            if fut is not None and not fut.done():
                fut.set_exception(BKTimeoutError(
                    f"{bookie_id}: no answer to {type(request).__name__} in {limit}s"))
        while heap and heap[0][2].pending.get(heap[0][1]) is None:
            heapq.heappop(heap)  # (answered long ago: nothing to wait for)
        if heap:
            self._deadline_timer = loop.call_at(heap[0][0], self._expire_due)

    # -- moving messages ---------------------------------------------------------------------

    def _transmit(self, client: str, bookie_id: str, conn: _Conn, gen: int, forward: bool,
                  seq: int, msg: Any) -> None:
        """Move one message (a request if ``forward``, else a response) through the fault
        model: held while either end is paused, dropped on a blocked link, then the
        configured faults, then a sampled latency (in order on its connection unless
        reordered)."""
        src, dst = (client, bookie_id) if forward else (bookie_id, client)
        paused = self._paused
        if paused:
            for node in (src, dst):
                if node in paused:
                    paused[node].append(partial(self._transmit, client, bookie_id, conn, gen,
                                                forward, seq, msg))
                    return
        if self._blocked and self._blocked.get((src, dst)):
            self._count("partition_drop")
            return
        loop = asyncio.get_running_loop()
        cfg = self.config
        rng = self.rng
        faulty = cfg.drop or cfg.corrupt or cfg.reset
        if faulty:
            if cfg.drop and rng.random() < cfg.drop:
                self._count("drop")
                self._trace(f"net drop {src}->{dst}")
                return
            if cfg.corrupt and rng.random() < cfg.corrupt:
                self._count("corrupt")
                self._trace(f"net corrupt {src}->{dst}: crc caught, connection closed")
                loop.call_later(self._latency(), self._reset_if, client, bookie_id, conn, gen,
                                "corrupt frame")
                return
            if cfg.reset and rng.random() < cfg.reset:
                self._count("reset")
                self._reset(client, bookie_id, "reset")
                return
        arrival = (loop.time() + cfg.latency_min
                   - _log(1.0 - rng.random()) * cfg.latency_mean)
        if self.slow:
            arrival += self.slow.get((src, dst), 0.0)
        last = conn.last_arrival_fwd if forward else conn.last_arrival_back
        if cfg.reorder and rng.random() < cfg.reorder:
            self._count("reorder")
        elif arrival <= last:
            # Strictly after the previous message: a connection is FIFO.
            arrival = last + 1e-6
        if forward:
            if arrival > last:
                conn.last_arrival_fwd = arrival
            loop.call_at(arrival, self._arrive_request, client, bookie_id, conn, gen, seq, msg)
            if cfg.duplicate and rng.random() < cfg.duplicate:
                self._count("duplicate")
                later = arrival + self._latency() * rng.choice((1, 5, 50))
                loop.call_at(later, self._arrive_request, client, bookie_id, conn, gen, seq, msg)
        else:
            if arrival > last:
                conn.last_arrival_back = arrival
            loop.call_at(arrival, self._arrive_response, conn, gen, seq, msg)

    def _reset_if(self, client: str, bookie_id: str, conn: _Conn, gen: int, why: str) -> None:
        if conn.gen == gen:
            self._reset(client, bookie_id, why)

    def _arrive_request(self, client: str, bookie_id: str, conn: _Conn, gen: int, seq: int,
                        request: Request) -> None:
        if conn.gen != gen:
            return  # the connection was reset meanwhile: the request died with it
        handler = self._bookies.get(bookie_id)
        if handler is None:
            self._reset(client, bookie_id, "bookie down")
            return
        # The bookie's handler runs as a coroutine driven by hand (no task per request):
        # most requests are answered without ever waiting.
        answer = handler(request)
        coro = answer if isinstance(answer, Coroutine) else _await(answer)
        _Serving(self, coro, self._incarnation[bookie_id], client, bookie_id, conn, gen, seq,
                 request).step()

    def _answer(self, job: _Serving, response: Response) -> None:
        bookie_id = job.bookie_id
        if self._incarnation.get(bookie_id) != job.incarnation:
            return  # the process died while handling: nobody sends the reply
        for observer in self.observers:
            observer(bookie_id, job.client, job.request, response)
        self._transmit(job.client, bookie_id, job.conn, job.gen, False, job.seq, response)

    def _raised(self, job: _Serving, exc: Exception) -> None:
        """A bookie must never raise from handle(): a finding (the connection resets, as a
        server that dropped the request on an exception would)."""
        bookie_id = job.bookie_id
        self._count("handler_exception")
        self._trace(f"net {bookie_id} raised {type(exc).__name__}: {exc}")
        if self.on_handler_error is not None:
            self.on_handler_error(bookie_id, job.request, exc)
        if self._incarnation.get(bookie_id) == job.incarnation:
            self._reset_if(job.client, bookie_id, job.conn, job.gen, "handler raised")

    @staticmethod
    def _arrive_response(conn: _Conn, gen: int, seq: int, response: Response) -> None:
        if conn.gen != gen:
            return
        fut = conn.pending.pop(seq, None)
        if fut is not None and not fut.done():
            fut.set_result(response)


async def _await(answer: Awaitable[Response]) -> Response:
    return await answer


class _Serving:
    """One request being answered: steps the handler's coroutine by hand, resuming it when
    the future it waits on is done (what a Task does, without a Task per request)."""

    __slots__ = ("bookie_id", "client", "conn", "coro", "gen", "incarnation", "net", "request",
                 "seq")

    def __init__(self, net: SimNetwork, coro: Coroutine[Any, Any, Response], incarnation: int,
                 client: str, bookie_id: str, conn: _Conn, gen: int, seq: int,
                 request: Request) -> None:
        self.net = net
        self.coro = coro
        self.incarnation = incarnation
        self.client = client
        self.bookie_id = bookie_id
        self.conn = conn
        self.gen = gen
        self.seq = seq
        self.request = request

    def step(self, _done: object = None) -> None:
        try:
            waiting = self.coro.send(None)
        except StopIteration as stop:
            self.net._answer(self, stop.value)
            return
        except asyncio.CancelledError:
            return  # (what it waited on was cancelled: the bookie went away)
        except Exception as exc:
            self.net._raised(self, exc)
            return
        if waiting is None:  # a bare yield (asyncio.sleep(0)): resume on the next turn
            asyncio.get_running_loop().call_soon(self.step)
        else:  # a future: resume once it is done (its result is read by the coroutine)
            waiting._asyncio_future_blocking = False
            waiting.add_done_callback(self.step)


def _is_fence(request: Request) -> bool:
    from pybk.protocol import FenceRequest, ReadRequest

    return isinstance(request, FenceRequest) or (
        isinstance(request, ReadRequest) and request.fence)


def _is_recovery_read(request: Request) -> bool:
    from pybk.protocol import LAST_ENTRY, ReadRequest

    return (isinstance(request, ReadRequest) and request.fence
            and request.entry_id != LAST_ENTRY)


def _fail(fut: asyncio.Future[Response], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


class SimTransport(Transport):
    """One client's view of the simulated network."""

    def __init__(self, network: SimNetwork, client: str) -> None:
        self.network = network
        self.client = client
        self.closed = False

    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        if self.closed:
            fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            fut.set_exception(BookieUnavailableError("transport closed"))
            return fut
        return self.network.send(self.client, bookie_id, request, timeout)

    async def close(self) -> None:
        self.closed = True
        for (c, bid) in sorted(self.network._conns):
            if c == self.client:
                self.network._reset(c, bid, "transport closed")
