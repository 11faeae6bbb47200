"""One accepted connection of a bookie's TCP server: framing, authentication, the request
flow under the in-flight cap and the byte budgets, and the connection's deadlines.

:class:`ServerConnection` is the asyncio protocol object (its byte account and outgoing
answers: :class:`~pybk.transport.server_budgets.BudgetedConnection`);
:class:`pybk.transport.server.BookieServer` makes one per accepted socket (before any TLS
handshake), owns the caps and the bookie-wide budget, and calls
:meth:`ServerConnection.check_deadlines` from its sweeper.
The module doc of :mod:`pybk.transport.server` says what each bound defends against.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
from collections.abc import Callable
from logging import ERROR, INFO
from typing import TYPE_CHECKING, Any, Final, cast

from pybk.errors import BKError, ProtocolError, status_of
from pybk.runtime.origin import REQUEST_ORIGIN
from pybk.transport import codec
from pybk.transport.batchbodies import BatchBodies
from pybk.transport.identity import ANONYMOUS
from pybk.transport.limits import REQUEST_OVERHEAD
from pybk.transport.server_parts import (
    GATED,
    FastAddReply,
    NowaitReply,
    await_verdict,
    classify_error,
    event_size,
    is_long_poll,
    peer_closed,
    request_entries,
)
from pybk.transport.server_polls import LONG_POLLS_AT_ONCE, PollingConnection
from pybk.wire import (
    AddBatchRequest,
    AddCallback,
    AddLike,
    AddRequest,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    ReadResponse,
    Request,
    Response,
    Status,
    error_response,
)

if TYPE_CHECKING:
    from pybk.transport.server import BookieServer

__all__ = ["AddNowait", "AddPath", "ServerConnection", "is_long_poll"]

#: a read bringing this many bytes at once first asks the kernel whether the peer has
#: already closed (one getsockopt): a flood that sends and hangs up costs no decoding
EOF_CHECK_BYTES: Final = 4096

#: ``add(request, on_done)``: the bookie's add path (``Bookie.add_request``)
AddPath = Callable[[AddLike, AddCallback], None]
#: ``add_nowait(request, reply)``: answer an add by calling ``reply(response)`` exactly once
#: (the older form, kept for callers that have one)
AddNowait = Callable[[AddRequest, Callable[[Response], None]], None]


class ServerConnection(PollingConnection):
    """One accepted connection (a protocol object: asyncio calls it back on the loop).

    Registered with the server from ``accept()`` on; :meth:`release` (exactly once) gives
    its place back, whether its handshake failed or it closed later. What it holds against
    the budgets and its answers on their way out: :class:`BudgetedConnection`."""

    def __init__(self, server: BookieServer, peer_ip: str, unproven: bool) -> None:
        now = server.loop.time()
        super().__init__(server, now)
        self.peer_ip = peer_ip
        #: counted against the unauthenticated budget (TLS handshake or AUTH still to come)
        self.unproven = unproven
        self.authenticated = not server.identities.authenticates
        #: who this connection is (docs/tenancy.md): a tenant, from its token or certificate
        self.principal: str = ANONYMOUS
        #: the head request waits on the tenancy gate / the event the gate let through / a
        #: place in the server's fair share handed to this connection, not used yet
        self._gate_wait: asyncio.Task[Any] | None = None
        self._gated: codec.Event | None = None
        self._fair_ticket = False
        self.codec = codec.Connection(
            "server",
            max_frame=self.cfg.max_frame if self.authenticated else self.cfg.pre_auth_max_frame,
        )
        self.codec.hold_after_auth = not self.authenticated
        self.codec.lazy_batches = True  # (walked a step per loop turn: start_walk)
        self.queue: collections.deque[codec.Event] = collections.deque()
        self.queued_bytes = 0
        self.in_flight = 0
        self.long_polls = 0  # of those, long polls waiting
        self.tasks: dict[asyncio.Task[None], Request] = {}
        self._costs: dict[asyncio.Task[None], tuple[int, bool, int]] = {}
        self._deferred: list[tuple[int, Request, int]] = []
        self._deferred_timer: asyncio.TimerHandle | None = None
        #: the task wrapping the socket in a transport (TLS handshake included), until done
        self.handshake: asyncio.Task[None] | None = None
        self.setup_started = False
        #: adds answered through the handler's fast path (no task): counted so that stop()
        #: can wait for them like for tasks
        self.fast_adds = 0
        self.fast_adds_idle = asyncio.Event()
        self.fast_adds_idle.set()
        self._pumping = False
        self.read_paused = False
        #: why the last pump stopped short ("connection"/"bookie" budget, "in_flight"), or None
        self.blocked: str | None = None
        self.closing = False
        self.released = False
        self.connected_at = now
        self.last_activity = now
        self.partial_since: float | None = None

    # -- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # a stream transport; not an asyncio.Transport subclass on every loop (uvloop's is not)
        self.transport = transport = cast(asyncio.Transport, base)
        if self.closing or self.released:
            transport.abort()
            return
        # pause_writing above a quarter of the budget, resume_writing once down to an
        # eighth: a drained buffer gives its bytes back to the budgets (and wakes the pump)
        budget = self.cfg.connection_budget
        transport.set_write_buffer_limits(high=max(budget // 4, 1), low=budget // 8)
        now = self.loop.time()
        self.last_activity = self.progress_at = now
        tenant = self.server.identities.by_certificate(transport.get_extra_info("peercert"))
        if tenant is not None:  # a mapped client certificate is its proof
            self.principal = tenant
            self._accept_auth()
        if self.unproven and self.authenticated:  # a TLS handshake was all it had to do
            self._prove()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.queue.clear()
        self.queued_bytes = 0
        self.out.clear()
        self._set_unsent(0)
        self.release()
        if self._gate_wait is not None:
            self._gate_wait.cancel()
        if self.server.fair is not None:
            self.server.fair.forget(self, self._fair_ticket)
            self._fair_ticket = False
        self.cancel_long_polls()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        if len(data) >= EOF_CHECK_BYTES and peer_closed(self.transport):
            # a burst of requests with the close right behind it (a flood that hangs up):
            # nobody will read the answers, so nothing is decoded, let alone started
            self.server.stats.incr("peer_closed")
            self.abort()
            return
        try:
            events = self.codec.receive_data(data)
        except ProtocolError as exc:
            self.server.stats.incr(classify_error(exc))
            self.server.remote_event("protocol errors", f"{self.peer_ip}: {exc}", INFO)
            self.abort()
            return
        now = self.loop.time()
        if events:
            self.last_activity = now
            self.partial_since = now if self.codec.buffered else None
            self.queue.extend(events)
            # (what the decoded requests hold: about the bytes they came in, plus objects)
            self.queued_bytes += len(data) + REQUEST_OVERHEAD * len(events)
            self.pump()
        elif self.codec.buffered and self.partial_since is None:
            self.partial_since = now

    def eof_received(self) -> bool | None:
        return None  # close our side too: connection_lost follows, long polls are cancelled

    def pause_writing(self) -> None:
        self.server.stats.incr("write_paused")
        self._refresh_unsent()

    def resume_writing(self) -> None:
        self._refresh_unsent()
        self.pump()

    # -- request flow ------------------------------------------------------------------------

    def pump(self) -> None:
        """Start queued requests while the caps and budgets allow; then pause/resume reading."""
        if self._pumping or self._gate_wait is not None or self.walking is not None:
            # (re-entered; the head waits)
            return
        self._pumping = True
        # the bookie's per-connection shares see who asks (the tasks started inherit it)
        origin = REQUEST_ORIGIN.set(self)
        try:
            self._pump_queue()
        finally:
            REQUEST_ORIGIN.reset(origin)
            self._pumping = False
        self._set_reading()

    def _pump_queue(self) -> None:
        server = self.server
        self.blocked = None
        started_polls = 0
        while self.queue and not self.closing and not server.stopping:
            event = self.queue[0]
            if isinstance(event, codec.MessageRejected):
                self._dequeue(event)
                server.stats.incr("bad_message")
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
                self._dequeue(event)
                self._authenticate(event.request_id, request)
                continue
            if not self.authenticated:
                self._dequeue(event)
                self._refuse_unauthenticated(event.request_id, request.op)
                return
            if type(request) is AddBatchRequest and type(
                    bodies := request.bodies) is BatchBodies and not bodies.walked:
                self.start_walk(event, bodies)
                return
            if self.in_flight >= self.cfg.max_in_flight:
                self.blocked = "in_flight"
                server.stats.incr("in_flight_full")
                return
            if server.gate is not None and self._gated is not event and type(request) in GATED:
                verdict = server.gate.check(self.principal, request)
                if verdict is not None:
                    if inspect.isawaitable(verdict):
                        self._wait_gate(event, verdict)
                        return
                    self._dequeue(event)
                    server.stats.incr("tenancy_refused")
                    self._respond(event.request_id, verdict)
                    continue
                self._gated = event  # (not asked again when it waits below for a budget)
            if isinstance(request, AddRequest):  # (the hot path: request_cost inlined)
                cost = REQUEST_OVERHEAD + len(request.body)
                n = 1
            else:
                cost = server.request_cost(request)
                n = request_entries(request)
            if (self.entries + n > self.cfg.max_entries_in_flight or server.entry_waiters
                    or server.entries + n > self.cfg.bookie_entries_in_flight) and (
                    blocked := self._entries_blocked(n)) is not None:
                self.blocked = blocked
                server.stats.incr(f"{blocked}_full")
                if blocked == "bookie_entries":
                    server._wait_for_budget(self)
                return
            held = self.reserved + self.unsent
            if (held + cost <= self.cfg.connection_budget
                    and server.held + cost <= self.cfg.bookie_budget):
                blocked = None  # within both budgets: the common case, decided here
            else:
                blocked = self._admissible(cost)
            if blocked is not None:
                self.blocked = blocked
                server.stats.incr(f"{blocked}_budget_full")
                if blocked == "bookie":
                    server._wait_for_budget(self)
                return
            # a long poll's answer may carry an entry it was not charged for (see _serve)
            entry_uncharged = long_poll = is_long_poll(request)
            if long_poll:
                bounded = server._bound_long_poll(self, request)
                if bounded is None:  # no slot: it waits for one, unstarted
                    self.blocked = "long_polls"
                    return
                request = bounded
                long_poll = is_long_poll(request)
            kind = type(request)
            fair = server.fair
            if fair is not None and (kind is AddRequest or kind is AddBatchRequest):
                if self._fair_ticket:
                    self._fair_ticket = False
                elif not fair.try_acquire(self.principal, self):
                    self.blocked = "fair"
                    server.stats.incr("fair_share_wait")
                    return
            self._dequeue(event)
            self.in_flight += 1
            self._charge(reserved=cost)
            self._charge_entries(n)
            if kind is AddRequest or kind is AddBatchRequest:
                adder = server.add
                if adder is not None:
                    # the hot path: the bookie's add path (the one every transport drives)
                    # answers from its journal's batch completion; no task per request
                    self.fast_adds += 1
                    self.fast_adds_idle.clear()
                    adder(request,  # type: ignore[arg-type]
                          FastAddReply(self, event.request_id, request, cost, n))  # type: ignore[arg-type]
                    continue
                add_nowait = server.add_nowait
                if add_nowait is not None and kind is AddRequest:
                    self.fast_adds += 1
                    self.fast_adds_idle.clear()
                    add_nowait(request,  # type: ignore[arg-type]
                               NowaitReply(self, event.request_id, cost))
                    continue
            if long_poll:
                server.long_polls += 1
                self.long_polls += 1
                started_polls += 1
                if started_polls > LONG_POLLS_AT_ONCE:
                    self._defer(event.request_id, request, cost)
                    continue
                server.stats.incr("long_polls_started")
            task = self.loop.create_task(
                self._serve(event.request_id, request, entry_uncharged))
            self.tasks[task] = request
            self._costs[task] = (cost, long_poll, n)
            task.add_done_callback(self._task_done)
        if server.entry_waiters:  # (nothing left to wait with: its place goes)
            server.entry_waiters.pop(self, None)

    def _wait_gate(self, event: codec.RequestReceived, verdict: Any) -> None:
        """The head request waits on the gate: nothing starts or is read meanwhile."""
        self.blocked = "tenancy"
        self.server.stats.incr("tenancy_delayed")
        self._gate_wait = self.loop.create_task(await_verdict(verdict, event.request))
        self._gate_wait.add_done_callback(lambda t: self._gate_done(event, t))

    def _gate_done(self, event: codec.RequestReceived, task: asyncio.Task[Any]) -> None:
        self._gate_wait = None
        if self.closing or task.cancelled() or not self.queue or self.queue[0] is not event:
            return
        self._gated = event
        if task.result() is not None:  # refused (or the check failed: said as an error)
            self._dequeue(event)
            self.server.stats.incr("tenancy_refused")
            self._respond(event.request_id, task.result())
        self.pump()

    def _dequeue(self, event: codec.Event) -> None:
        """Take the head of the queue; its share of the read-ahead bytes goes with it (each
        event's own size is counted once, on arrival, in bulk)."""
        queue = self.queue
        share = self.queued_bytes // len(queue)
        queue.popleft()
        self.queued_bytes = self.queued_bytes - share if queue else 0

    def fair_granted(self) -> None:
        """The server's fair share handed this connection a slot for its next add."""
        self._fair_ticket = True
        self.loop.call_soon(self.pump)

    def fast_add_done(self, request_id: int, response: Response, cost: int,
                      entries: int = 1) -> None:
        if self.server.fair is not None:
            self.server.fair.release()
        self.in_flight -= 1
        self.fast_adds -= 1
        if not self.fast_adds:
            self.fast_adds_idle.set()
        self._charge_entries(-entries)
        self._answered(request_id, response, cost)

    def _answered(self, request_id: int, response: Response, release: int = 0) -> None:
        """A request finished: give back the ``release`` bytes it held, send its response,
        then start queued ones (or resume reading: ``pump`` always ends by re-arming the
        reader)."""
        self.server.stats.incr("requests")
        self._respond(request_id, response, release)
        self.pump()

    def _settle(self, task: asyncio.Task[Any] | None) -> bool:
        """Give back what a task held (once: when it answers, or when it ends unstarted)."""
        entry = self._costs.pop(task, None) if task is not None else None
        if entry is None:
            return False
        cost, long_poll, entries = entry
        self.in_flight -= 1
        self._charge(reserved=-cost)
        self._charge_entries(-entries)
        if long_poll:
            self.long_polls -= 1
            self.server._long_poll_ended()
        return True

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.pop(task, None)
        if self._settle(task):  # cancelled before it ran (its finally never did)
            self.pump()

    async def _serve(self, request_id: int, request: Request, entry_uncharged: bool) -> None:
        server = self.server
        try:
            response = await server.handler(request)
        except asyncio.CancelledError:
            if server.stopping:  # tell the client now rather than at the close
                self._respond(
                    request_id, error_response(request, Status.UNAVAILABLE, "bookie stopping")
                )
            raise
        except Exception as exc:
            server.stats.incr("handler_error")
            if not isinstance(exc, BKError):
                server.remote_event("handler failures", f"{exc!r} on {request!r:.200}", ERROR)
            message = str(exc) if isinstance(exc, BKError) else f"internal error: {exc!r}"
            response = error_response(request, status_of(exc), message)
        finally:
            self._settle(asyncio.current_task())
        if server.gate is not None:
            server.gate.answered(self.principal, request, response)
        if (isinstance(request, BookieInfoRequest) and request.versions
                and isinstance(response, BookieInfoResponse)):
            # the client asks which protocol version it may use (docs/protocol.md)
            response = dataclasses.replace(response, protocol_version=codec.PROTOCOL_VERSION)
        if entry_uncharged and isinstance(response, ReadResponse) and response.body is not None \
                and self._admissible(len(response.body)) is not None:
            # the entry does not fit the budgets now: answer with the LAC alone, the
            # reader reads the entry itself
            server.stats.incr("long_poll_entry_dropped")
            response = dataclasses.replace(response, body=None)
        self._answered(request_id, response)

    def _authenticate(self, request_id: int, request: AuthRequest) -> None:
        identities = self.server.identities
        principal = identities.by_token(request.token) if identities.authenticates \
            else self.principal
        if principal is not None:
            self._respond(request_id, AuthResponse(Status.OK))
            self.principal = principal
            self._accept_auth()
            return
        self.server.stats.incr("auth_failed")
        self.server.remote_event("authentication failed", f"from {self.peer_ip}", INFO)
        self._respond(request_id, AuthResponse(Status.UNAUTHORIZED, "authentication failed"))
        self.close_after_flush()

    def _accept_auth(self) -> None:
        if self.authenticated:
            return
        self.authenticated = True
        self._prove()
        self.codec.max_frame = self.cfg.max_frame
        self.codec.hold_after_auth = False
        try:  # frames pipelined behind AUTH, now judged against the full cap
            events = self.codec.receive_data(b"")
            self.queue.extend(events)
            self.queued_bytes += sum(map(event_size, events))
        except ProtocolError as exc:
            self.server.stats.incr(classify_error(exc))
            self.close_after_flush()

    def _prove(self) -> None:
        if self.unproven and not self.released:
            self.unproven = False
            self.server.admission.proven(self.peer_ip)

    def _refuse_unauthenticated(self, request_id: int, op: Any) -> None:
        self.server.stats.incr("unauthenticated_request")
        response = codec.error_response_for_op(
            op, Status.UNAUTHORIZED, "authenticate first (send AUTH with the bookie's token)"
        )
        self._respond(request_id, response)
        self.close_after_flush()

    def _set_reading(self) -> None:
        """Read while the read-ahead has room, even when nothing can start (so a close is
        seen at once); pause when it is full, when closing, or when the server stops."""
        if self.transport is None or self.transport.is_closing():
            return
        want_pause = (
            self.closing
            or self.server.stopping
            or self._gate_wait is not None
            or self.queued_bytes >= self.cfg.max_queued_bytes
        )
        if want_pause and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()
            self.server.stats.incr("read_paused")
        elif not want_pause and self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        if (self.partial_since is not None
                and (self.read_paused or self.blocked is not None or self.queue)):
            # our own backpressure, not a slow peer: the frame clock starts when it ends
            self.partial_since = self.loop.time()

    # -- closing -----------------------------------------------------------------------------

    def release(self) -> None:
        """Give this connection's place back (exactly once)."""
        if not self.released:
            self.released = True
            self.server._release(self)

    def close_after_flush(self) -> None:
        """Send what is queued, then close (used after refusing a peer)."""
        self.closing = True
        self.queue.clear()
        self.queued_bytes = 0
        self.flush()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        self.queue.clear()
        self.queued_bytes = 0
        if self.transport is not None:
            self.transport.abort()
        elif self.handshake is not None:  # still in its TLS handshake
            self.handshake.cancel()

    def check_deadlines(self, now: float) -> None:
        """Called by the server's sweeper: auth, frame, write and idle deadlines; a peer
        that closed while we were not reading."""
        if self.closing or self.transport is None:
            return
        cfg = self.cfg
        if self.unsent:
            self._refresh_unsent()
        if self.partial_since is not None and (self.read_paused or self.blocked or self.queue):
            self.partial_since = now  # our own backpressure: the frame clock waits
        reason = None
        if not self.authenticated and now - self.connected_at > cfg.auth_timeout:
            reason = "auth_timeout"
        elif self.partial_since is not None and now - self.partial_since > cfg.frame_timeout:
            reason = "frame_timeout"
        elif self.unsent and now - self.progress_at > cfg.write_timeout:
            reason = "write_timeout"
        elif (
            self.in_flight == 0
            and not self.queue
            and self.partial_since is None
            and not self.unsent
            and now - self.last_activity > cfg.idle_timeout
        ):
            reason = "idle_timeout"
        elif self.read_paused and peer_closed(self.transport):
            reason = "peer_closed"
        if reason is not None:
            self.server.stats.incr(reason)
            self.server.remote_event("closing connections", f"{self.peer_ip}: {reason}", INFO)
            self.abort()
