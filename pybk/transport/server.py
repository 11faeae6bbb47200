"""The TCP side of a bookie: connections, framing, auth, backpressure, deadlines.

:class:`BookieServer` serves any ``handler(request) -> response`` coroutine (in practice
``Bookie.handle``) over asyncio TCP, optionally TLS. Each connection runs the sans-IO
:class:`pybk.transport.codec.Connection`; this module adds what needs a socket and a clock:

* **Pipelining**: every request runs as its own task; responses go out as they complete
  (out of order, matched by request id), all responses ready in one loop iteration are
  written with **one** ``write()`` (coalescing).
* **Backpressure**: at most ``max_in_flight`` requests per connection; beyond that, and while
  the socket's send buffer is above its high-water mark, the server stops reading.
* **Hostile peers**: a frame over the cap, a bad CRC or any framing damage closes *that*
  connection (and is counted); a well-framed but malformed body gets a PROTOCOL_ERROR response.
  A frame must complete within ``frame_timeout`` of its first byte (slowloris), a quiet
  connection is closed after ``idle_timeout``, connections beyond the global / per-IP caps are
  refused at accept.
* **Authentication**: with a token configured, a connection may only send AUTH (frames capped
  at 4 KiB) until it authenticates; anything else is answered UNAUTHORIZED and the connection
  closed, without reaching the handler. Tokens are compared with ``hmac.compare_digest``.

Counters of every such event are in :attr:`BookieServer.stats` and in a per-server
prometheus ``CollectorRegistry`` (:attr:`BookieServer.registry`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hmac
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pybk.errors import BKError, ProtocolError, status_of
from pybk.protocol import (
    AddBatchRequest,
    AddCallback,
    AddLike,
    AddOutcome,
    AddRequest,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    ReadRequest,
    Request,
    Response,
    Status,
    add_response,
    error_response,
)
from pybk.transport import codec

__all__ = [
    "AddNowait",
    "BookieServer",
    "Handler",
    "ServerConfig",
    "ServerStats",
]

log = logging.getLogger("pybk.bookie.process")

Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class ServerConfig:
    """Limits and deadlines of a :class:`BookieServer` (seconds, bytes, counts)."""

    max_frame: int = codec.DEFAULT_MAX_FRAME
    pre_auth_max_frame: int = codec.PRE_AUTH_MAX_FRAME
    max_in_flight: int = 1024  # per connection
    max_connections: int = 1024
    max_connections_per_ip: int = 512
    idle_timeout: float = 300.0
    frame_timeout: float = 10.0  # a frame must arrive whole within this of its first byte
    write_timeout: float = 30.0  # a peer must drain our responses within this
    auth_timeout: float = 10.0  # an unauthenticated connection must authenticate within this
    tls_handshake_timeout: float = 10.0
    stop_grace: float = 10.0  # on stop, in-flight requests get this long to finish


class ServerStats:
    """Event counters (``stats["frame_too_large"]``...), exported to prometheus at scrape time.

    Counting is a dict increment (it happens per request on the hot path); the prometheus
    view is a collector registered in the server's registry that reads the dict when scraped:
    ``pybk_server_events_total{event=...}`` and ``pybk_server_connections``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.open_connections = 0
        registry.register(self)

    def incr(self, event: str, n: int = 1) -> None:
        self.counts[event] += n

    def set_open(self, n: int) -> None:
        self.open_connections = n

    def __getitem__(self, event: str) -> int:
        return self.counts[event]

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "pybk_server_events", "Connection and frame events", labels=["event"]
        )
        for event, count in sorted(self.counts.items()):
            events.add_metric([event], count)
        yield events
        yield GaugeMetricFamily(
            "pybk_server_connections", "Open connections", value=self.open_connections
        )


def _classify(exc: ProtocolError) -> str:
    """A counter name for a fatal framing error."""
    text = str(exc)
    if "cap" in text:
        return "frame_too_large"
    if "CRC" in text:
        return "bad_crc"
    if "version" in text:
        return "bad_version"
    if "operation" in text:
        return "bad_operation"
    return "bad_frame"


class _ServerConnection(asyncio.Protocol):
    """One accepted connection (a protocol object: asyncio calls it back on the loop)."""

    def __init__(self, server: BookieServer) -> None:
        self.server = server
        self.cfg = server.config
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer_ip = "?"
        self.authenticated = server.auth_token is None
        self.codec = codec.Connection(
            "server",
            max_frame=self.cfg.max_frame if self.authenticated else self.cfg.pre_auth_max_frame,
        )
        self.codec.hold_after_auth = not self.authenticated
        self.queue: collections.deque[codec.Event] = collections.deque()
        self.in_flight = 0
        self.tasks: dict[asyncio.Task[None], Request] = {}
        #: adds answered through the handler's fast path (no task): counted so that stop()
        #: can wait for them like for tasks
        self.fast_adds = 0
        self.fast_adds_idle = asyncio.Event()
        self.fast_adds_idle.set()
        self._pumping = False
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.read_paused = False
        self.write_paused_since: float | None = None
        self.closing = False
        now = self.loop.time()
        self.connected_at = now
        self.last_activity = now
        self.partial_since: float | None = None

    # -- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # a stream transport; not an asyncio.Transport subclass on every loop (uvloop's is not)
        self.transport = transport = cast(asyncio.Transport, base)
        peer = transport.get_extra_info("peername")
        self.peer_ip = str(peer[0]) if peer else "?"
        if not self.server._admit(self):
            self.closing = True
            transport.abort()
            return
        transport.set_write_buffer_limits(high=1 << 20)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server._forget(self)
        self.cancel_long_polls()

    def cancel_long_polls(self) -> None:
        """Long polls only wait, so they are cancelled when nobody will read the answer.
        Other requests are left to finish: cancelling a handler could interrupt the bookie
        half way (its outcome is indeterminate for the client either way)."""
        for task, request in list(self.tasks.items()):
            if isinstance(request, ReadRequest) and request.previous_lac is not None:
                task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            events = self.codec.receive_data(data)
        except ProtocolError as exc:
            self.server.stats.incr(_classify(exc))
            log.info("closing connection from %s: %s", self.peer_ip, exc)
            self.abort()
            return
        now = self.loop.time()
        if events:
            self.last_activity = now
            self.partial_since = now if self.codec.buffered else None
            self.queue.extend(events)
            self._pump()
        elif self.codec.buffered and self.partial_since is None:
            self.partial_since = now

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        self.server.stats.incr("write_paused")
        self.write_paused_since = self.loop.time()
        self._set_reading()

    def resume_writing(self) -> None:
        self.write_paused_since = None
        self._pump()

    # -- request flow ------------------------------------------------------------------------

    def _pump(self) -> None:
        """Start queued requests while under the in-flight cap; then pause/resume reading."""
        if self._pumping:  # a fast add answered synchronously while we were starting it
            return
        self._pumping = True
        try:
            self._pump_queue()
        finally:
            self._pumping = False
        self._set_reading()

    def _pump_queue(self) -> None:
        while (
            self.queue
            and self.in_flight < self.cfg.max_in_flight
            and not self.closing
            and not self.server.stopping  # stopping: queued, unstarted requests are dropped
            and self.write_paused_since is None  # the peer is not reading our answers
        ):
            event = self.queue.popleft()
            if isinstance(event, codec.MessageRejected):
                self.server.stats.incr("bad_message")
                if not self.authenticated:
                    self._refuse_unauthenticated(event.request_id, event.op)
                    return
                self._respond(
                    event.request_id,
                    codec.error_response_for_op(event.op, Status.PROTOCOL_ERROR, str(event.error)),
                )
                continue
            assert isinstance(event, codec.RequestReceived)
            request = event.request
            if isinstance(request, AuthRequest):
                self._authenticate(event.request_id, request)
                continue
            if not self.authenticated:
                self._refuse_unauthenticated(event.request_id, request.op)
                return
            self.in_flight += 1
            kind = type(request)
            if kind is AddRequest or kind is AddBatchRequest:
                adder = self.server.add
                if adder is not None:
                    # the hot path: the bookie's add path (the one every transport drives)
                    # answers from its journal's batch completion; no task per request
                    self.fast_adds += 1
                    self.fast_adds_idle.clear()
                    adder(request, _FastAddReply(self, event.request_id, request))  # type: ignore[arg-type]
                    continue
                add_nowait = self.server.add_nowait
                if add_nowait is not None and kind is AddRequest:
                    self.fast_adds += 1
                    self.fast_adds_idle.clear()
                    add_nowait(request, _NowaitReply(self, event.request_id))  # type: ignore[arg-type]
                    continue
            task = self.loop.create_task(self._serve(event.request_id, request))
            self.tasks[task] = request
            task.add_done_callback(self._task_done)

    def _fast_add_done(self, request_id: int, response: Response) -> None:
        self.in_flight -= 1
        self.fast_adds -= 1
        if not self.fast_adds:
            self.fast_adds_idle.set()
        self._answered(request_id, response)

    def _answered(self, request_id: int, response: Response) -> None:
        """A request finished: send its response, then start queued ones (or resume reading:
        ``_pump`` always ends by re-arming the reader)."""
        self.server.stats.incr("requests")
        self._respond(request_id, response)
        self._pump()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.pop(task, None)

    async def _serve(self, request_id: int, request: Request) -> None:
        try:
            response = await self.server.handler(request)
        except asyncio.CancelledError:
            if self.server.stopping:  # tell the client now rather than at the close
                self._respond(
                    request_id, error_response(request, Status.UNAVAILABLE, "bookie stopping")
                )
            raise
        except BKError as exc:
            self.server.stats.incr("handler_error")
            response = error_response(request, status_of(exc), str(exc))
        except Exception as exc:
            self.server.stats.incr("handler_error")
            log.exception("handler failed on %r", request)
            response = error_response(request, status_of(exc), f"internal error: {exc!r}")
        finally:
            self.in_flight -= 1
        if (isinstance(request, BookieInfoRequest) and request.versions
                and isinstance(response, BookieInfoResponse)):
            # the client asks which protocol version it may use (docs/protocol.md)
            response = dataclasses.replace(response, protocol_version=codec.PROTOCOL_VERSION)
        self._answered(request_id, response)

    def _authenticate(self, request_id: int, request: AuthRequest) -> None:
        expected = self.server.auth_token
        if expected is None or hmac.compare_digest(request.token, expected):
            self._respond(request_id, AuthResponse(Status.OK))
            if not self.authenticated:
                self.authenticated = True
                self.codec.max_frame = self.cfg.max_frame
                self.codec.hold_after_auth = False
                try:  # frames pipelined behind AUTH, now judged against the full cap
                    self.queue.extend(self.codec.receive_data(b""))
                except ProtocolError as exc:
                    self.server.stats.incr(_classify(exc))
                    self.close_after_flush()
            return
        self.server.stats.incr("auth_failed")
        log.info("authentication failed from %s", self.peer_ip)
        self._respond(request_id, AuthResponse(Status.UNAUTHORIZED, "authentication failed"))
        self.close_after_flush()

    def _refuse_unauthenticated(self, request_id: int, op: Any) -> None:
        self.server.stats.incr("unauthenticated_request")
        response = codec.error_response_for_op(
            op, Status.UNAUTHORIZED, "authenticate first (send AUTH with the bookie's token)"
        )
        self._respond(request_id, response)
        self.close_after_flush()

    def _respond(self, request_id: int, response: Response) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        try:
            frame = codec.encode_response(request_id, response)
        except (ValueError, TypeError) as exc:  # a handler bug; tell the client, keep serving
            log.error("cannot encode response %r: %s", response, exc)
            frame = codec.encode_response(
                request_id,
                codec.error_response_for_op(response.op, Status.GENERIC_ERROR, str(exc)),
            )
        self.out.append(frame)
        self.last_activity = self.loop.time()
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.transport.write(data)
            self.server.stats.incr("writes")
        self.out.clear()

    def _set_reading(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        want_pause = (
            self.closing
            or self.server.stopping
            or bool(self.queue)
            or self.in_flight >= self.cfg.max_in_flight
            or self.write_paused_since is not None
        )
        if want_pause and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
            self.server.stats.incr("read_paused")
        elif not want_pause and self.read_paused:
            self.read_paused = False
            if self.partial_since is not None:  # the peer's clock restarts: we were not reading
                self.partial_since = self.loop.time()
            self.transport.resume_reading()

    # -- closing -----------------------------------------------------------------------------

    def close_after_flush(self) -> None:
        """Send what is queued, then close (used after refusing a peer)."""
        self.closing = True
        self.queue.clear()
        self._flush()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        self.queue.clear()
        if self.transport is not None:
            self.transport.abort()

    def check_deadlines(self, now: float) -> None:
        """Called by the server's sweeper: enforce auth, frame, write and idle deadlines."""
        if self.closing:
            return
        cfg = self.cfg
        reason = None
        if not self.authenticated and now - self.connected_at > cfg.auth_timeout:
            reason = "auth_timeout"
        elif (
            self.partial_since is not None
            and not self.read_paused  # our backpressure, not a slow peer
            and now - self.partial_since > cfg.frame_timeout
        ):
            reason = "frame_timeout"
        elif (
            self.write_paused_since is not None
            and now - self.write_paused_since > cfg.write_timeout
        ):
            reason = "write_timeout"
        elif (
            self.in_flight == 0
            and not self.queue
            and self.partial_since is None
            and now - self.last_activity > cfg.idle_timeout
        ):
            reason = "idle_timeout"
        if reason is not None:
            self.server.stats.incr(reason)
            log.info("closing connection from %s: %s", self.peer_ip, reason)
            self.abort()


class _FastAddReply:
    """The ``on_done`` of one add on the bookie's add path: the outcome becomes the answer
    frame (a slotted object, not a closure)."""

    __slots__ = ("conn", "request", "request_id")

    def __init__(self, conn: _ServerConnection, request_id: int, request: AddLike) -> None:
        self.conn = conn
        self.request_id = request_id
        self.request = request

    def __call__(self, outcome: AddOutcome) -> None:
        self.conn._fast_add_done(self.request_id, add_response(self.request, outcome))


class _NowaitReply:
    """The reply callback of one add through an ``add_nowait`` (answers with a response)."""

    __slots__ = ("conn", "request_id")

    def __init__(self, conn: _ServerConnection, request_id: int) -> None:
        self.conn = conn
        self.request_id = request_id

    def __call__(self, response: Response) -> None:
        self.conn._fast_add_done(self.request_id, response)


#: ``add(request, on_done)``: the bookie's add path (``Bookie.add_request``)
AddPath = Callable[[AddLike, AddCallback], None]
#: ``add_nowait(request, reply)``: answer an add by calling ``reply(response)`` exactly once
#: (the older form, kept for callers that have one)
AddNowait = Callable[[AddRequest, Callable[[Response], None]], None]


class BookieServer:
    """Serves ``handler`` on ``host:port`` (port 0 picks a free one; see :attr:`address`)."""

    def __init__(
        self,
        handler: Handler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        auth_token: bytes | None = None,
        config: ServerConfig | None = None,
        registry: CollectorRegistry | None = None,
        add_nowait: AddNowait | None = None,
        add: AddPath | None = None,
    ) -> None:
        if auth_token is not None and not auth_token:
            raise ValueError("auth_token must be non-empty (or None for no authentication)")
        self.handler = handler
        #: the bookie's add path (``Bookie.add_request``): ADD and ADD_BATCH requests go
        #: there, no task per request; without it, ``add_nowait`` (single adds) or the handler
        self.add = add
        self.add_nowait = add_nowait
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.auth_token = auth_token
        self.config = config or ServerConfig()
        self.registry = registry or CollectorRegistry()
        self.stats = ServerStats(self.registry)
        self.connections: list[_ServerConnection] = []
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.stopping = False

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) actually bound."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server is not started")
        sockname = self._server.sockets[0].getsockname()
        return str(sockname[0]), int(sockname[1])

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self),
            self.host,
            self.port,
            ssl=self.ssl_context,
            ssl_handshake_timeout=(
                self.config.tls_handshake_timeout if self.ssl_context is not None else None
            ),
            backlog=1024,
            reuse_address=True,
        )
        self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        cfg = self.config
        shortest = min(cfg.idle_timeout, cfg.frame_timeout, cfg.auth_timeout, cfg.write_timeout)
        interval = max(0.01, min(1.0, shortest / 4))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for conn in list(self.connections):
                conn.check_deadlines(now)

    def _admit(self, conn: _ServerConnection) -> bool:
        cfg = self.config
        if self.stopping:
            self.stats.incr("refused_stopping")
            return False
        if len(self.connections) >= cfg.max_connections:
            self.stats.incr("refused_connection_cap")
            return False
        if self._per_ip[conn.peer_ip] >= cfg.max_connections_per_ip:
            self.stats.incr("refused_per_ip_cap")
            return False
        self.connections.append(conn)
        self._per_ip[conn.peer_ip] += 1
        self.stats.incr("accepted")
        self.stats.set_open(len(self.connections))
        return True

    def _forget(self, conn: _ServerConnection) -> None:
        if conn in self.connections:
            self.connections.remove(conn)
            self._per_ip[conn.peer_ip] -= 1
            if self._per_ip[conn.peer_ip] <= 0:
                del self._per_ip[conn.peer_ip]
            self.stats.set_open(len(self.connections))

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, stop reading, let in-flight requests finish (up to ``grace``
        seconds), send their responses, then close every connection."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn._set_reading()
        grace = self.config.stop_grace if grace is None else grace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for conn in list(self.connections):
            conn.cancel_long_polls()  # answered UNAVAILABLE now; the reader retries elsewhere
        tasks: list[asyncio.Future[Any]] = [t for c in self.connections for t in c.tasks]
        idle_waiters: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(c.fast_adds_idle.wait())
            for c in self.connections
            if not c.fast_adds_idle.is_set()
        ]
        if tasks or idle_waiters:
            await asyncio.wait(tasks + idle_waiters, timeout=max(0.0, deadline - loop.time()))
        for waiter in idle_waiters:  # only our own waiters: handlers are never interrupted
            waiter.cancel()
        for conn in list(self.connections):
            # Still running after the grace: the client sees the connection drop (outcome
            # indeterminate); the handler itself is left to finish or be failed by the
            # bookie's own stop, never interrupted half way.
            conn._flush()
            if conn.transport is not None:
                conn.transport.close()
        # close() waits for the send buffer to drain; a peer that does not read gets aborted.
        close_deadline = loop.time() + 1.0
        while self.connections and loop.time() < close_deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> BookieServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
