"""The simulated network: a :class:`~pybk.transport.base.Transport` with seeded faults.

Every client gets its own endpoint (:meth:`SimNetwork.endpoint`); every bookie incarnation is a
``handler(request) -> Awaitable[Response]`` registered with :meth:`SimNetwork.set_bookie`.
Messages travel on per-(client, bookie) connections, like TCP: in order (unless the reorder
knob is on), each direction delayed by a sampled latency.

The fault model (the network faults of Jepsen and FoundationDB's simulator: drop, duplicate,
reorder, corrupt, reset, partitions, pauses) draws from one injected ``random.Random``.

Design notes: docs/internals.md, "pybk/sim/net.py".
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from math import log as _log
from types import CoroutineType as _CoroutineType
from typing import Any

from pybk.errors import BookieUnavailableError, ProtocolError
from pybk.errors import TimeoutError as BKTimeoutError
from pybk.sim.gated import GateKeeper
from pybk.sim.links import (
    AddPending,
    Conn,
    FuturePending,
    NetConfig,
    Pending,
    answer_future,
    is_entry_read,
    is_fence,
    is_recovery_read,
    observed,
)
from pybk.sim.loop import SimLoop
from pybk.sim.serving import Serving, await_answer
from pybk.sim.wire import WireRejected, damage, decode_request, decode_response
from pybk.transport.base import (
    Transport,
    read_batch_by_singles,
    settle_add,
    split_batch,
    split_callback,
)
from pybk.transport.deadlines import Deadlines
from pybk.transport.fairness import Gate
from pybk.transport.identity import ANONYMOUS
from pybk.transport.messages import encode_request, encode_response
from pybk.wire import (
    AddBatchRequest,
    AddCallback,
    AddLike,
    AddOutcome,
    AddRequest,
    AuthRequest,
    ReadBatchRequest,
    Request,
    Response,
    add_response,
    outcome_of,
)

__all__ = ["AddObserver", "AddPath", "Handler", "NetConfig", "Observer", "SimNetwork",
           "SimTransport"]

Handler = Callable[[Request], Awaitable[Response]]
#: a bookie's add path (``Bookie.add_request``)
AddPath = Callable[[AddLike, AddCallback], None]
Observer = Callable[[str, str, Request, Response], None]
AddObserver = Callable[[str, str, AddLike, AddOutcome], None]


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
        self._adders: dict[str, AddPath | None] = {}
        self._deadlines = Deadlines()
        #: the bookies' tenancy gates (pybk.sim.gated) and who each client is to them
        self._gates: dict[str, Gate] = {}
        self.gatekeeper = GateKeeper(self)
        #: a client's principal (as a bookie would derive it from its token or certificate)
        self.principal_of: Callable[[str], str] = lambda client: ANONYMOUS
        self._incarnation: dict[str, int] = {}
        self._conns: dict[tuple[str, str], Conn] = {}
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
        #: Clients whose entry reads (not LAC reads or long polls) are lost until a time.
        self.lose_entry_reads: dict[str, float] = {}
        self.observers: list[Observer] = []
        #: Called with every add request a bookie answered and its outcome, as they are (a
        #: batch once, not entry by entry): (bookie, client, request, outcome). Cheaper than
        #: ``observers`` for a watcher that can take a batch whole (the runner's).
        self.add_observers: list[AddObserver] = []
        #: Called with every other request a bookie answered and its response, as they are
        #: (a batched read once): (bookie, client, request, response).
        self.reply_observers: list[Observer] = []
        #: Called with every request a client sends (before any fault): (client, bookie,
        #: request). The runner learns which adds ever left a client.
        self.send_observers: list[Callable[[str, str, Request], None]] = []
        #: Called when a bookie's request handler or add path raises (it must answer, never
        #: raise): (bookie, request, exception). None: counted and traced only.
        self.on_handler_error: Callable[[str, Request, BaseException], None] | None = None
        self.messages = 0
        #: the loop the network runs on, bound at first use like its deadlines (asking
        #: asyncio for the running loop costs a getpid() per call, a few per message)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: ``(when, callback, args)``: a message arrives (a SimLoop's ``deliver_at``, which
        #: takes the arguments as a tuple, once bound to one)
        self._deliver_at: Callable[[float, Callable[..., object], tuple[Any, ...]], object] = \
            self._call_at

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop = asyncio.get_running_loop()
        if isinstance(loop, SimLoop):
            self._deliver_at = loop.deliver_at
        return loop

    def running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the network runs on (bound at first use)."""
        return self._loop or self._bind_loop()

    def _call_at(self, when: float, callback: Callable[..., object],
                 args: tuple[Any, ...]) -> None:
        """A message arrives at ``when`` (on another loop than a SimLoop)."""
        (self._loop or self._bind_loop()).call_at(when, callback, *args)

    # -- topology ----------------------------------------------------------------------------

    def endpoint(self, client: str, *, batch_adds: bool | None = None) -> SimTransport:
        """A client's transport; ``batch_adds`` None: drawn (see ``single_add_clients``)."""
        if batch_adds is None:
            batch_adds = self.rng.random() >= self.config.single_add_clients
        return SimTransport(self, client, batch_adds=batch_adds)

    def set_bookie(self, bookie_id: str, handler: Handler | None,
                   add: AddPath | None = None, gate: Gate | None = None) -> None:
        """Install a bookie incarnation (or None: the bookie is down). Resets its connections.
        ``add`` is its add path (``Bookie.add_request``); without one, adds go to
        ``handler`` like any request. ``gate``: its tenancy gate (``Bookie.tenancy``)."""
        self._incarnation[bookie_id] = self._incarnation.get(bookie_id, 0) + 1
        self._bookies[bookie_id] = handler
        self._adders[bookie_id] = add if handler is not None else None
        if gate is not None and handler is not None:
            self._gates[bookie_id] = gate
        else:
            self._gates.pop(bookie_id, None)
        for (client, bid) in sorted(self._conns):
            if bid == bookie_id:
                self._reset(client, bid, "bookie restarted" if handler else "bookie down")

    def gate_of(self, bookie_id: str) -> Gate | None:
        return self._gates.get(bookie_id)

    def handler_of(self, bookie_id: str) -> Handler | None:
        return self._bookies.get(bookie_id)

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
        self.lose_entry_reads.clear()
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

    def is_dead(self, client: str) -> bool:
        """Whether ``client``'s process died (:meth:`kill_client`)."""
        return bool(self._dead_clients.get(client))

    # -- sending -----------------------------------------------------------------------------

    def _conn(self, client: str, bookie_id: str) -> Conn:
        key = (client, bookie_id)
        conn = self._conns.get(key)
        if conn is None:
            conn = self._conns[key] = Conn()
        return conn

    def _reset(self, client: str, bookie_id: str, why: str) -> None:
        conn = self._conns.get((client, bookie_id))
        if conn is None:
            return
        conn.gen += 1
        pending = list(conn.pending.values())
        conn.pending.clear()
        if pending:
            self._trace(f"net reset {client}->{bookie_id} ({why}); {len(pending)} pending fail")
        for p in pending:
            self._deadlines.discard(p.token)
            p.on_fail(BookieUnavailableError(f"{bookie_id}: connection reset ({why})"))

    def _latency(self) -> float:
        cfg = self.config
        return cfg.latency_min - _log(1.0 - self.rng.random()) * cfg.latency_mean

    def send(
        self, client: str, bookie_id: str, request: Request, timeout: float | None
    ) -> asyncio.Future[Response]:
        loop = self._loop or self._bind_loop()
        fut: asyncio.Future[Response] = loop.create_future()
        if type(request) is AddRequest or type(request) is AddBatchRequest:
            # an add asked for as a request: the add path, its outcome put in a response
            self.add(client, bookie_id, request,
                     lambda outcome: answer_future(fut, request, outcome), timeout)
            return fut
        self._start(client, bookie_id, request, timeout, FuturePending(fut))
        return fut

    def add(self, client: str, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None) -> None:
        """Carry an add to the bookie's add path; ``on_done(outcome)`` once."""
        self._start(client, bookie_id, request, timeout, AddPending(request, on_done))

    def _start(self, client: str, bookie_id: str, request: Request, timeout: float | None,
               pending: Pending) -> None:
        if self._dead_clients and self._dead_clients.get(client):
            return  # a dead process sends nothing and hears nothing, ever
        loop = self._loop or self._bind_loop()
        self.messages += 1
        self._seq += 1
        seq = self._seq
        for watch in self.send_observers:
            watch(client, bookie_id, request)
        conn = self._conns.get((client, bookie_id))
        if conn is None:
            conn = self._conns[(client, bookie_id)] = Conn()
        msg: Request | bytes = encode_request(seq, request) if self.config.wire else request
        if self._bookies.get(bookie_id) is None:
            # Connection refused, after a round trip.
            loop.call_later(2 * self._latency(), pending.on_fail,
                            BookieUnavailableError(f"{bookie_id}: connection refused"))
            return
        conn.pending[seq] = pending
        limit = self.config.default_timeout if timeout is None else timeout
        pending.token = self._deadlines.add(
            limit, lambda: self._expire(conn, seq, bookie_id, request, limit))
        if self.lose_next_fence and self.lose_next_fence.get(bookie_id) and is_fence(request):
            self.lose_next_fence[bookie_id] -= 1
            self._count("lost_fence")
            self._trace(f"net lost fencing {type(request).__name__} {client}->{bookie_id}")
            return
        if (self.lose_recovery_reads
                and self.lose_recovery_reads.get(bookie_id, -1.0) > loop.time()
                and is_recovery_read(request)):
            self._count("lost_recovery_read")
            self._trace(f"net lost recovery read {client}->{bookie_id}")
            return
        if (self.lose_entry_reads and self.lose_entry_reads.get(client, -1.0) > loop.time()
                and is_entry_read(request)):
            self._count("lost_entry_read")
            self._trace(f"net lost entry read {client}->{bookie_id}")
            return
        self._transmit(client, bookie_id, conn, conn.gen, True, seq, msg)

    def _expire(self, conn: Conn, seq: int, bookie_id: str, request: Request,
                limit: float) -> None:
        pending = conn.pending.pop(seq, None)
        if pending is not None:
            pending.on_fail(
                BKTimeoutError(f"{bookie_id}: no answer to {type(request).__name__} in {limit}s")
            )

    def _transmit(self, client: str, bookie_id: str, conn: Conn, gen: int, forward: bool,
                  seq: int, msg: Any) -> None:
        """Move one message (a request if ``forward``, else an answer) through the fault
        model: held while either end is paused, dropped on a blocked link, then the
        configured faults, then a sampled latency (in order on its connection unless
        reordered); requests only may be duplicated."""
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
        loop = self._loop or self._bind_loop()
        cfg = self.config
        rng = self.rng
        if cfg.drop or cfg.corrupt or cfg.reset:
            if cfg.drop and rng.random() < cfg.drop:
                self._count("drop")
                self._trace(f"net drop {src}->{dst}")
                return
            if cfg.corrupt and rng.random() < cfg.corrupt:
                self._count("corrupt")
                if type(msg) is bytes:  # a real bit flip, for the receiver's CRC to catch
                    self._trace(f"net corrupt {src}->{dst}: a bit flipped")
                    msg = damage(msg, rng)
                else:
                    self._trace(f"net corrupt {src}->{dst}: crc caught, connection closed")
                    loop.call_later(self._latency(), self._reset_if, client, bookie_id, conn,
                                    gen, "corrupt frame")
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
            args = (client, bookie_id, conn, gen, seq, msg)
            self._deliver_at(arrival, self._arrive_request, args)
            if cfg.duplicate and rng.random() < cfg.duplicate:
                self._count("duplicate")
                later = arrival + self._latency() * rng.choice((1, 5, 50))
                self._deliver_at(later, self._arrive_request, args)
        else:
            if arrival > last:
                conn.last_arrival_back = arrival
            self._deliver_at(arrival, self._arrive_response,
                             (client, bookie_id, conn, gen, seq, msg))

    def _reset_if(self, client: str, bookie_id: str, conn: Conn, gen: int, why: str) -> None:
        if conn.gen == gen:
            self._reset(client, bookie_id, why)

    def _arrive_request(self, client: str, bookie_id: str, conn: Conn, gen: int, seq: int,
                        msg: Request | bytes) -> None:
        if conn.gen != gen:
            return  # the connection was reset meanwhile: the request died with it
        if type(msg) is bytes:
            decoded = self._decode(client, bookie_id, conn, gen, msg, seq, decode_request)
            if decoded is None:
                return
            request: Request = decoded
        else:
            request = msg  # type: ignore[assignment]
        if self._gates and bookie_id in self._gates:  # (pybk.sim.gated: the bookie's gate)
            self.gatekeeper.arrive(client, bookie_id, conn, gen, seq, request)
            return
        self.start_request(client, bookie_id, conn, gen, seq, request)

    def start_request(self, client: str, bookie_id: str, conn: Conn, gen: int, seq: int,
                      request: Request, serve: Handler | None = None,
                      add: AddPath | None = None) -> None:
        """Start a request that reached its bookie: an add on the bookie's add path (or
        ``add``), any other request by its handler (or ``serve``)."""
        handler = self._bookies.get(bookie_id)
        if handler is None:
            self._reset(client, bookie_id, "bookie down")
            return
        incarnation = self._incarnation[bookie_id]
        adder = add or self._adders.get(bookie_id)
        if adder is not None and (type(request) is AddRequest
                                  or type(request) is AddBatchRequest):
            self._serve_add(adder, incarnation, client, bookie_id, conn, gen, seq, request)
            return
        # Any other request: the handler's coroutine stepped by hand, no task per request.
        answer = (serve or handler)(request)
        coro = answer if type(answer) is _CoroutineType or isinstance(answer, Coroutine) \
            else await_answer(answer)
        Serving(self, coro, incarnation, client, bookie_id, conn, gen, seq, request).step()

    def _serve_add(self, adder: AddPath, incarnation: int, client: str, bookie_id: str,
                   conn: Conn, gen: int, seq: int, request: AddLike) -> None:
        """The bookie's add path, as the TCP server drives it: no task, the outcome comes
        from the journal's completion and goes back on the connection."""
        answered = False

        def reply(outcome: AddOutcome) -> None:
            nonlocal answered
            if answered:  # (a bookie answers once; a second answer would be a bug to see)
                self._count("add_answered_twice")
                return
            answered = True
            if self._incarnation.get(bookie_id) != incarnation:
                return  # the process died while handling: nobody sends the reply
            for watch in self.add_observers:
                watch(bookie_id, client, request, outcome)
            if self.observers:
                self._observe_add(bookie_id, client, request, outcome)
            answer: object = outcome
            if self.config.wire:
                try:
                    answer = encode_response(seq, add_response(request, outcome))
                except Exception as exc:  # an answer the codec cannot carry: a finding
                    self._unencodable(client, bookie_id, conn, gen, request, exc)
                    return
            self._transmit(client, bookie_id, conn, gen, False, seq, answer)

        try:
            adder(request, reply)
        except Exception as exc:  # the add path must answer, never raise: a finding
            self._count("handler_exception")
            self._trace(f"net {bookie_id} raised {type(exc).__name__} adding: {exc}")
            if self.on_handler_error is not None:
                self.on_handler_error(bookie_id, request, exc)
            if self._incarnation.get(bookie_id) == incarnation:
                self._reset_if(client, bookie_id, conn, gen, "add path raised")

    def _observe_add(self, bookie_id: str, client: str, request: AddLike,
                     outcome: AddOutcome) -> None:
        singles = [request] if type(request) is AddRequest else split_batch(request)  # type: ignore[arg-type]
        for i, single in enumerate(singles):
            response = add_response(single, outcome_of(outcome, i))
            for observer in self.observers:
                observer(bookie_id, client, single, response)

    def answer(self, job: Serving, response: Response) -> None:
        bookie_id = job.bookie_id
        if self._incarnation.get(bookie_id) != job.incarnation:
            return  # the process died while handling: nobody sends the reply
        for watch in self.reply_observers:
            watch(bookie_id, job.client, job.request, response)
        if self.observers:
            for single, answer in observed(job.request, response):
                for observer in self.observers:
                    observer(bookie_id, job.client, single, answer)
        sent: object = response
        if self.config.wire:
            try:
                sent = encode_response(job.seq, response)
            except Exception as exc:  # an answer the codec cannot carry: a finding
                self._unencodable(job.client, bookie_id, job.conn, job.gen, job.request, exc)
                return
        self._transmit(job.client, bookie_id, job.conn, job.gen, False, job.seq, sent)

    def _unencodable(self, client: str, bookie_id: str, conn: Conn, gen: int,
                     request: Request, exc: Exception) -> None:
        """A bookie's answer the wire cannot carry: the server would fail to send it and
        close the connection; a finding for the simulator."""
        self._count("unencodable_answer")
        self._trace(f"net {bookie_id} answered {type(request).__name__} unencodably: {exc}")
        if self.on_handler_error is not None:
            self.on_handler_error(bookie_id, request, exc)
        self._reset_if(client, bookie_id, conn, gen, "unencodable answer")

    def _decode(self, client: str, bookie_id: str, conn: Conn, gen: int, frame: bytes,
                seq: int, decode: Callable[[bytes, int], Any]) -> Any:
        """``decode(frame, seq)``, or None after what the receiver does with a frame that
        does not decode: a damaged one (the CRC caught it) closes the connection; one that
        arrived whole yet does not decode as sent is a codec bug, a finding."""
        try:
            return decode(frame, seq)
        except ProtocolError as exc:
            self._trace(f"net {client}<->{bookie_id}: {exc}, connection closed")
            self._reset_if(client, bookie_id, conn, gen, "corrupt frame")
        except WireRejected as exc:
            self._count("codec_rejected")
            if self.on_handler_error is not None:
                self.on_handler_error(bookie_id, AuthRequest(b"(undecodable frame)"), exc)
            self._reset_if(client, bookie_id, conn, gen, "undecodable frame")
        return None

    def raised(self, job: Serving, exc: Exception) -> None:
        """A bookie must never raise from handle(): a finding (the connection resets, as a
        server that dropped the request on an exception would)."""
        bookie_id = job.bookie_id
        self._count("handler_exception")
        self._trace(f"net {bookie_id} raised {type(exc).__name__}: {exc}")
        if self.on_handler_error is not None:
            self.on_handler_error(bookie_id, job.request, exc)
        if self._incarnation.get(bookie_id) == job.incarnation:
            self._reset_if(job.client, bookie_id, job.conn, job.gen, "handler raised")

    def _arrive_response(self, client: str, bookie_id: str, conn: Conn, gen: int, seq: int,
                         answer: object) -> None:
        if conn.gen != gen:
            return
        if type(answer) is bytes:
            answer = self._decode(client, bookie_id, conn, gen, answer, seq, decode_response)
            if answer is None:
                return
        pending = conn.pending.pop(seq, None)
        if pending is not None:
            self._deadlines.discard(pending.token)
            pending.on_answer(answer)


class SimTransport(Transport):
    """One client's view of the simulated network. ``batch_adds=False``: an old client that
    sends each entry of a batch as a single add, and reads one entry per request (protocol
    version 1's requests only)."""

    def __init__(self, network: SimNetwork, client: str, *, batch_adds: bool = True) -> None:
        self.network = network
        self.client = client
        self.batch_adds = batch_adds
        self.closed = False

    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        if self.closed:
            fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            fut.set_exception(BookieUnavailableError("transport closed"))
            return fut
        if type(request) is ReadBatchRequest and not self.batch_adds:
            return read_batch_by_singles(  # an old client: one entry per read
                lambda read: self.network.send(self.client, bookie_id, read, timeout), request)
        return self.network.send(self.client, bookie_id, request, timeout)

    def add(self, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None = None) -> None:
        if self.closed:
            settle_add(on_done, BookieUnavailableError("transport closed"))
            return
        if self.batch_adds or type(request) is AddRequest:
            self.network.add(self.client, bookie_id, request, on_done, timeout)
            return
        assert isinstance(request, AddBatchRequest)
        singles = split_batch(request)
        parts = split_callback(on_done, len(singles), [[i] for i in range(len(singles))])
        for single, part in zip(singles, parts, strict=True):
            self.network.add(self.client, bookie_id, single, part, timeout)

    async def close(self) -> None:
        self.closed = True
        for (c, bid) in sorted(self.network._conns):
            if c == self.client:
                self.network._reset(c, bid, "transport closed")
