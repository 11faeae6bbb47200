"""The TCP side of a bookie: connections, framing, auth, backpressure, bounds, deadlines.

:class:`BookieServer` serves any ``handler(request) -> response`` coroutine (in practice
``Bookie.handle``) over TCP, optionally TLS. Each connection runs the sans-IO
:class:`pybk.transport.codec.Connection`; this module adds what needs a socket and a clock.
Every bound is a field of :class:`pybk.transport.limits.ServerConfig` (and a ``pybk bookie``
option); docs/protocol.md lists them.

Design notes: docs/internals.md, "pybk/transport/server.py".
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final

from prometheus_client import CollectorRegistry

from pybk.runtime.ratelog import RateLimitedLog
from pybk.runtime.turnqueue import TurnQueue
from pybk.transport.admission import Admission
from pybk.transport.batchbodies import BatchBodies
from pybk.transport.fairness import FairShare, Gate
from pybk.transport.identity import Identities
from pybk.transport.limits import REQUEST_OVERHEAD, ServerConfig
from pybk.transport.listener import (
    ACCEPT_BATCH,
    Listener,
    bind_sockets,
    open_descriptors,
    open_file_limit,
    set_keepalive,
)
from pybk.transport.server_budgets import BudgetedConnection
from pybk.transport.server_connection import (
    AddNowait,
    AddPath,
    ServerConnection,
    is_long_poll,
)
from pybk.transport.server_stats import ServerStats
from pybk.wire import AddRequest, ReadRequest, Request, Response, batch_bytes

__all__ = [
    "AddNowait",
    "AddPath",
    "BookieServer",
    "Handler",
    "ResponseSize",
    "ServerConfig",
    "ServerStats",
]

log = logging.getLogger("pybk.server.process")

Handler = Callable[[Request], Awaitable[Response]]
#: ``response_size(request) -> bytes`` of the answer's entry data (None: not known), so a
#: read is admitted against the byte budgets before it runs (``Bookie.response_size_hint``)
ResponseSize = Callable[[Request], "int | None"]

#: descriptors left free beyond the reserve: one to accept a connection only to refuse it,
#: one for a file the process opens for a moment (the metrics endpoint, a log)
ACCEPT_SLACK: Final = 2
#: how long a cap lowered by shedding holds: until the next count of open descriptors
#: (the sweeper's, this often) sets it from what the process really uses
SHED_COOLDOWN: Final = 5.0
#: a connection quiet this long (and with nothing in flight) may be shed
SHED_IDLE: Final = 1.0
#: past max_long_polls, a connection holding fewer long polls than this gets answers at once
LONG_POLLS_ANSWERED_AT_ONCE: Final = 16


def _payload_bytes(request: Request) -> int:
    """Bytes a request carries: its bytes fields, and sequences of bytes (a batch's
    bodies)."""
    total = 0
    for field in dataclasses.fields(request):
        value = getattr(request, field.name)
        if isinstance(value, bytes | bytearray | memoryview):
            total += len(value)
        elif isinstance(value, BatchBodies):
            total += batch_bytes(value)
        elif isinstance(value, list | tuple) and value and isinstance(value[0], bytes):
            total += sum(map(len, value))
    return total


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
        response_size: ResponseSize | None = None,
        identities: Identities | None = None,
        gate: Gate | None = None,
        fair_share: int | None = None,
    ) -> None:
        if auth_token is not None and not auth_token:
            raise ValueError("auth_token must be non-empty (or None for no authentication)")
        #: who connections are (tenant tokens, certificate subjects, the cluster token)
        self.identities = identities or Identities()
        if auth_token is not None:
            self.identities.cluster_token = auth_token
        #: the tenancy gate asked before an add or a read starts (docs/tenancy.md)
        self.gate = gate
        #: large batches' entry tables walked a step per loop turn, all connections' in turn
        self.walks = TurnQueue()
        #: adds in the add path at once across connections, handed out round-robin across
        #: tenants past that (``add`` only; None: no cap)
        self.fair = FairShare(fair_share) if fair_share is not None and add is not None \
            else None
        self.handler = handler
        #: the bookie's add path (``Bookie.add_request``): ADD and ADD_BATCH requests go
        #: there, no task per request; without it, ``add_nowait`` (single adds) or the handler
        self.add = add
        self.add_nowait = add_nowait
        #: optional size of a read's answer before it runs (``Bookie.response_size_hint``)
        self.response_size = response_size
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.auth_token = auth_token
        self.config = config or ServerConfig()
        self.registry = registry or CollectorRegistry()
        self.stats = ServerStats(self.registry)
        self.stats.gauges = self._gauges
        self._conns: dict[ServerConnection, None] = {}  # (ordered: oldest first)
        self._by_ip: dict[str, dict[ServerConnection, None]] = {}  # the same, by address
        #: connections in arrival order that may still be unproven / silent (entries that no
        #: longer are, or are released, are dropped when met: :meth:`_displace_oldest`)
        self._unproven_order: dict[ServerConnection, None] = {}
        self._silent_order: dict[ServerConnection, None] = {}
        cfg = self.config
        self.admission = Admission(cfg.max_connections, cfg.max_connections_per_ip,
                                   cfg.max_unauthenticated)
        #: the global cap the open-file limit allows (refreshed by the sweeper)
        self.descriptor_cap = cfg.max_connections
        self._shed_until = 0.0
        self._listener: Listener | None = None
        self._sockets: list[socket.socket] = []
        self._address: tuple[str, int] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: bytes charged to the budgets by every connection, and how many hold some
        self.held = 0
        self.holders = 0
        #: entries in flight over every connection, how many hold some, the most one held
        self.entries = 0
        self.entry_holders = 0
        self.peak_connection_entries = 0
        #: connections waiting for the bookie's entries, in the order they began to wait,
        #: with the entries of the request each waits to start
        self.entry_waiters: dict[BudgetedConnection, int] = {}
        self._budget_waiters: dict[ServerConnection, None] = {}
        self._wake_scheduled = False
        self.long_polls = 0
        self.warnings: RateLimitedLog | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("server is not started")
        return self._loop

    @property
    def connections(self) -> list[ServerConnection]:
        """The connections held now (oldest first), those still in a handshake included."""
        return list(self._conns)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) actually bound (also once stopped: where it was)."""
        if self._address is None:
            raise RuntimeError("server is not started")
        return self._address

    def _gauges(self) -> dict[str, float]:
        return {
            "unauthenticated_connections": self.admission.unproven,
            "bytes_in_flight": self.held,
            "entries_in_flight": self.entries,
            "peak_connection_entries": self.peak_connection_entries,
            "long_polls": self.long_polls,
            "connection_cap": self.admission.max_total,
        }

    def remote_event(self, kind: str, detail: str, level: int = logging.WARNING) -> None:
        """Log an event a remote peer can cause at will, at most once per ``log_interval``
        per ``kind`` (with a count of the rest): a peer cannot fill the bookie's log."""
        if self.warnings is not None:
            self.warnings.event(kind, detail, level)
        else:  # (not started: no loop clock yet)
            log.log(level, "%s: %s", kind, detail)

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self.warnings = RateLimitedLog(log, self.config.log_interval, loop.time)
        self._sockets = await bind_sockets(self.host, self.port, self.config.backlog)
        sockname = self._sockets[0].getsockname()
        self._address = (str(sockname[0]), int(sockname[1]))
        self._refresh_descriptor_cap(initial=True)
        # with connections that must prove themselves, few accepts per loop turn: a newcomer
        # may displace the oldest unproven one, and a client's connection must get the turns
        # to prove itself (its TLS handshake or AUTH read) before max_unauthenticated newer
        # ones could have displaced it
        unproven = self.ssl_context is not None or self.identities.authenticates
        batch = max(1, self.config.max_unauthenticated // 16) if unproven else ACCEPT_BATCH
        self._listener = Listener(self._sockets, self._on_accept, self._on_accept_error,
                                  batch=min(batch, ACCEPT_BATCH))
        self._listener.start()
        self._sweeper = loop.create_task(self._sweep())

    def stop_accepting(self) -> None:
        """Close the listening sockets: new connections are refused (as by a dead process);
        those already open go on."""
        if self._listener is not None:
            self._listener.close()

    # -- accepting -----------------------------------------------------------------------------

    def _on_accept(self, sock: socket.socket, peer_ip: str) -> None:
        """A socket just accepted: admit it (maybe displacing another) or close it now."""
        if self.stopping:
            self._refuse(sock, "refused_stopping", peer_ip)
            return
        unproven = self.ssl_context is not None or self.identities.authenticates
        decision = self.admission.decide(peer_ip, unproven)
        if (decision.displace_ip is not None and self._displace(
                decision.displace_ip, decision.unproven_only)) or (
                decision.oldest and self._displace_oldest(decision.unproven_only)):
            decision = self.admission.decide(peer_ip, unproven)
        if decision.refused is not None or decision.displace_ip is not None:
            self._refuse(sock, decision.refused or "refused_connection_cap", peer_ip)
            return
        conn = ServerConnection(self, peer_ip, unproven)
        self._conns[conn] = None
        self._by_ip.setdefault(peer_ip, {})[conn] = None
        self._silent_order[conn] = None
        if unproven:
            self._unproven_order[conn] = None
        self.admission.add(peer_ip, unproven)
        self.stats.incr("accepted")
        self.stats.set_open(len(self._conns))
        set_keepalive(sock, self.config.keepalive)
        conn.handshake = task = self.loop.create_task(self._connect(conn, sock))
        task.add_done_callback(functools.partial(self._connect_done, conn, sock))

    async def _connect(self, conn: ServerConnection, sock: socket.socket) -> None:
        """Wrap the accepted socket in a transport (and its TLS handshake, bounded); from
        here on the transport owns the socket and closes it on every path."""
        conn.setup_started = True
        try:
            await self.loop.connect_accepted_socket(
                lambda: conn, sock, ssl=self.ssl_context,
                ssl_handshake_timeout=(
                    self.config.tls_handshake_timeout if self.ssl_context is not None else None
                ),
            )
        except (OSError, EOFError) as exc:  # (TimeoutError is an OSError)
            self.stats.incr("handshake_failed")
            log.debug("handshake with %s failed: %r", conn.peer_ip, exc)
            conn.release()
        except Exception:  # news: say so, and never keep the place
            log.exception("setting up a connection from %s failed", conn.peer_ip)
            conn.release()

    def _connect_done(self, conn: ServerConnection, sock: socket.socket,
                      task: asyncio.Task[None]) -> None:
        conn.handshake = None
        if task.cancelled():  # displaced, shed or stopping during its setup
            if not conn.setup_started:  # cancelled before it ran: the socket is still ours
                sock.close()
            conn.release()

    def _refuse(self, sock: socket.socket, reason: str, peer_ip: str) -> None:
        sock.close()
        self.stats.incr(reason)
        if reason != "refused_stopping" and self.warnings is not None:
            a = self.admission
            self.warnings.event(
                "refused connections",
                f"{reason.removeprefix('refused_')} from {peer_ip} "
                f"({a.total} open of {a.max_total}, {a.per_ip[peer_ip]} from that address "
                f"of {a.max_per_ip}, {a.unproven} unauthenticated of {a.max_unproven})",
            )

    def _displace(self, ip: str, unproven_only: bool) -> bool:
        """Close one of ``ip``'s connections to make room: an unproven one if any (the
        oldest), else the one quiet the longest, busy ones last."""
        candidates = [c for c in self._by_ip.get(ip, ())
                      if not c.released and (c.unproven or not unproven_only)]
        if not candidates:
            return False
        victim = min(candidates, key=lambda c: (not c.unproven, c.in_flight > 0,
                                                c.last_activity))
        self.stats.incr("displaced")
        if self.warnings is not None:
            self.warnings.event("displaced connections",
                                f"closed one of {ip}'s to make room for another address")
        victim.abort()
        victim.release()  # its place is free now (its transport closes on the next loop turn)
        return True

    def _displace_oldest(self, unproven_only: bool) -> bool:
        """Close the oldest connection still unproven (``unproven_only``) or, else, the
        oldest that has sent nothing (no answer written, nothing in flight) to make room."""
        order = self._unproven_order if unproven_only else self._silent_order
        while order:
            conn = next(iter(order))
            del order[conn]
            if conn.released or (not conn.unproven if unproven_only else (
                    conn.written or conn.in_flight or conn.queue)):
                continue  # (it has proven itself or spoken: never unproven or silent again)
            self.stats.incr("displaced")
            if self.warnings is not None:
                self.warnings.event("displaced connections", "closed the oldest "
                                    f"{'unproven' if unproven_only else 'silent'} one "
                                    f"({conn.peer_ip}) to make room")
            conn.abort()
            conn.release()
            return True
        return False

    def _on_accept_error(self, exc: OSError) -> None:
        self.stats.incr("accept_errors")
        if self.warnings is not None:
            self.warnings.event("accept() failing",
                                f"{exc.strerror or exc} ({len(self._conns)} connections "
                                "open); pausing accepts briefly")
        if exc.errno in (errno.EMFILE, errno.ENFILE):  # we hold too many: make room
            self.shed(max(1, self.config.fd_reserve // 4), f"accept(): {exc.strerror}")

    def _release(self, conn: ServerConnection) -> None:
        self._unproven_order.pop(conn, None)
        self._silent_order.pop(conn, None)
        if self._conns.pop(conn, "absent") is None:
            same_ip = self._by_ip.get(conn.peer_ip)
            if same_ip is not None:
                same_ip.pop(conn, None)
                if not same_ip:
                    del self._by_ip[conn.peer_ip]
            self.admission.remove(conn.peer_ip, conn.unproven)
            self.stats.set_open(len(self._conns))
        self._budget_waiters.pop(conn, None)
        self.entry_waiters.pop(conn, None)

    # -- descriptors -------------------------------------------------------------------------

    def _refresh_descriptor_cap(self, initial: bool = False) -> None:
        """The global cap = min(max_connections, what the open-file limit leaves after the
        descriptors the process uses for other things and ``fd_reserve``)."""
        cfg = self.config
        in_use = open_descriptors()
        if in_use is None:
            if not initial:  # (out of descriptors even to count them: keep the last cap)
                return
            cap = cfg.max_connections  # a system that cannot tell: only the configured cap
        else:
            others = max(0, in_use - len(self._conns))
            # (ACCEPT_SLACK: refusing a connection takes a descriptor for a moment too)
            cap = max(0, open_file_limit() - others - cfg.fd_reserve - ACCEPT_SLACK)
        self.descriptor_cap = min(cfg.max_connections, cap)
        if self.loop.time() >= self._shed_until:
            if initial and self.descriptor_cap < cfg.max_connections:
                level = logging.WARNING if self.descriptor_cap < 64 else logging.INFO
                log.log(level, "connection cap %d lowered to %d by the open-file limit (%d, "
                        "%d descriptors kept for the bookie's files)%s", cfg.max_connections,
                        self.descriptor_cap, open_file_limit(), cfg.fd_reserve,
                        "; raise the limit (ulimit -n) or lower --fd-reserve"
                        if self.descriptor_cap < 64 else "")
            self.admission.max_total = self.descriptor_cap

    def shed(self, count: int, why: str) -> int:
        """The process ran out of descriptors (``why``): close up to ``count`` connections
        that are doing nothing (unauthenticated ones first, then the quietest idle ones: a
        connection with requests in flight is never shed) and keep the cap that much lower
        for a while, so the bookie's own files get descriptors again. Returns how many
        closed."""
        now = self.loop.time()
        victims = sorted(
            (c for c in self._conns
             if not c.released and (c.unproven or (not c.in_flight and not c.queue
                                                   and now - c.last_activity >= SHED_IDLE))),
            key=lambda c: (not c.unproven, c.last_activity),
        )[:count]
        for conn in victims:
            conn.abort()
            conn.release()
        self.stats.incr("shed", len(victims))
        if victims:  # the freed descriptors are for the bookie's files, not newcomers
            self.admission.max_total = max(0, min(self.admission.max_total, len(self._conns)))
            self._shed_until = now + SHED_COOLDOWN
        if self.warnings is not None:
            self.warnings.event(
                "out of descriptors",
                f"{why}: closed {len(victims)} idle connections; connection cap "
                f"{self.admission.max_total} until the next count of descriptors")
        return len(victims)

    # -- budgets -----------------------------------------------------------------------------

    def request_cost(self, request: Request) -> int:
        """Bytes a request holds while it runs: its payload, and the answer it will produce
        (a read's: its entries' size as ``response_size`` tells, else a whole frame)."""
        if isinstance(request, AddRequest):
            return REQUEST_OVERHEAD + len(request.body)
        if request.op.name.startswith("READ") and not is_long_poll(request):
            size = self.response_size(request) if self.response_size is not None else None
            return REQUEST_OVERHEAD + (self.config.max_frame if size is None else size)
        return REQUEST_OVERHEAD + _payload_bytes(request)

    def _held_changed(self, before: int, after: int) -> None:
        self.held += after - before
        if before == 0 and after:
            self.holders += 1
        elif before and after == 0:
            self.holders -= 1
        if after < before and self._budget_waiters and not self._wake_scheduled:
            self._wake_scheduled = True
            self.loop.call_soon(self._wake_budget_waiters)

    def _entries_changed(self, before: int, after: int) -> None:
        self.entries += after - before
        if before == 0 and after:
            self.entry_holders += 1
            if after > self.peak_connection_entries:
                self.peak_connection_entries = after
        elif before and after == 0:
            self.entry_holders -= 1
        elif after > self.peak_connection_entries:
            self.peak_connection_entries = after
        if after < before and self._budget_waiters and not self._wake_scheduled:
            self._wake_scheduled = True
            self.loop.call_soon(self._wake_budget_waiters)

    def _wait_for_budget(self, conn: ServerConnection) -> None:
        """``conn`` waits for bytes or a long-poll slot to be given back."""
        self._budget_waiters[conn] = None

    def _wake_budget_waiters(self) -> None:
        """Bytes were given back: let waiting connections try again, oldest waiter first."""
        self._wake_scheduled = False
        waiters, self._budget_waiters = self._budget_waiters, {}
        for conn in waiters:
            if not conn.closing:
                conn.pump()

    def _bound_long_poll(self, conn: ServerConnection, request: Request) -> Request | None:
        """A long poll waits at most ``long_poll_max_timeout``. With ``max_long_polls``
        waiting already, one from a connection holding few (a reader tailing a ledger or
        two) is answered at once with the current state; one from a connection holding
        many waits, unstarted, for a slot (None): a flood costs no work beyond decoding."""
        assert isinstance(request, ReadRequest)
        cfg = self.config
        if self.long_polls >= cfg.max_long_polls:
            self.stats.incr("long_poll_limit")
            if self.warnings is not None:
                self.warnings.event("long polls at their limit",
                                    f"{self.long_polls} waiting; new ones wait or are "
                                    "answered at once")
            if conn.long_polls >= LONG_POLLS_ANSWERED_AT_ONCE:
                self._wait_for_budget(conn)
                return None
            return dataclasses.replace(request, timeout=0.0)
        if request.timeout > cfg.long_poll_max_timeout:
            self.stats.incr("long_poll_timeout_capped")
            return dataclasses.replace(request, timeout=cfg.long_poll_max_timeout)
        return request

    def _long_poll_ended(self) -> None:
        self.long_polls -= 1
        if self._budget_waiters and not self._wake_scheduled:
            self._wake_scheduled = True
            self.loop.call_soon(self._wake_budget_waiters)

    # -- the sweeper -------------------------------------------------------------------------

    async def _sweep(self) -> None:
        cfg = self.config
        shortest = min(cfg.idle_timeout, cfg.frame_timeout, cfg.auth_timeout, cfg.write_timeout)
        interval = max(0.01, min(1.0, shortest / 4))
        loop = self.loop
        next_fd_check = loop.time() + 5.0
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for conn in list(self._conns):
                conn.check_deadlines(now)
            if now >= next_fd_check:
                next_fd_check = now + 5.0
                self._refresh_descriptor_cap()
            if self.warnings is not None:
                self.warnings.flush()

    # -- stopping ------------------------------------------------------------------------------

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting, stop reading, let in-flight requests finish (up to ``grace``
        seconds), send their responses, then close every connection."""
        self.stopping = True
        if self._listener is not None:
            self._listener.close()
        for conn in list(self._conns):
            if conn.transport is None:
                conn.abort()  # still in its handshake
            else:
                conn._set_reading()
        grace = self.config.stop_grace if grace is None else grace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        for conn in list(self._conns):
            conn.cancel_long_polls()  # answered UNAVAILABLE now; the reader retries elsewhere
        tasks: list[asyncio.Future[Any]] = [t for c in self._conns for t in c.tasks]
        idle_waiters: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(c.fast_adds_idle.wait())
            for c in self._conns
            if not c.fast_adds_idle.is_set()
        ]
        if tasks or idle_waiters:
            await asyncio.wait(tasks + idle_waiters, timeout=max(0.0, deadline - loop.time()))
        for waiter in idle_waiters:  # only our own waiters: handlers are never interrupted
            waiter.cancel()
        for conn in list(self._conns):
            # Still running after the grace: the client sees the connection drop (outcome
            # indeterminate); the handler itself is left to finish or be failed by the
            # bookie's own stop, never interrupted half way.
            conn.flush()
            if conn.transport is not None:
                conn.transport.close()
        # close() waits for the send buffer to drain; a peer that does not read gets aborted.
        close_deadline = loop.time() + 1.0
        while self._conns and loop.time() < close_deadline:
            await asyncio.sleep(0.01)
        for conn in list(self._conns):
            conn.abort()
            conn.release()
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
        if self.warnings is not None:
            self.warnings.flush()

    async def __aenter__(self) -> BookieServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
