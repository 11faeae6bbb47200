"""The byte side of one bookie server connection: what it holds against the budgets, and
its answers on their way out.

A connection holds bytes against its own ``connection_budget`` and the bookie-wide
``bookie_budget``: the reservations of the requests it started and the answers its peer has
not taken yet (queued here or in the transport's buffer). :class:`BudgetedConnection` keeps
that account (the server is told of every change), decides whether a request's bytes may start
now, and queues answers to write them in one ``write()`` per loop pass. Its subclass
:class:`~pybk.transport.server_connection.ServerConnection` is the request flow on top.
"""

from __future__ import annotations

import asyncio
import collections
from logging import ERROR
from typing import TYPE_CHECKING, Final

from pybk.transport import codec
from pybk.wire import Response, Status

if TYPE_CHECKING:
    from pybk.transport.server import BookieServer

__all__ = ["OVER_CAP", "SMALL", "SMALL_FLOOR", "BudgetedConnection"]

#: a request whose bytes are at most this is "small": it still starts when the bookie's
#: budget is spent, as long as its connection holds at most SMALL_FLOOR (adds of a writer
#: keep flowing while hostile connections sit on the budget)
SMALL: Final = 64 << 10
SMALL_FLOOR: Final = 256 << 10
#: past the bookie's entry cap, fair shares start up to the cap and this fraction of it
#: (1/4), the first in line up to half of that
OVER_CAP: Final = 4


class BudgetedConnection(asyncio.Protocol):
    """A server connection's bytes against the budgets and its outgoing answers."""

    #: kept by the request flow: requests started and not answered yet, decoded ones waiting
    #: to start, and when the peer was last heard from or answered
    in_flight: int
    queue: collections.deque[codec.Event]
    last_activity: float

    def __init__(self, server: BookieServer, now: float) -> None:
        self.server = server
        self.cfg = server.config
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.flush_scheduled = False
        #: bytes charged to the budgets: started requests' reservations, and answers not
        #: yet taken by the peer (in ``out`` or in the transport's buffer)
        self.reserved = 0
        self.unsent = 0
        self.written = 0  # bytes handed to the transport, ever
        self.sent_seen = 0  # of those, how many had left its buffer at the last look
        #: when the peer last took some of our answers (the write deadline counts from it)
        self.progress_at = now
        #: entries in the requests this connection started and has not answered yet
        self.entries = 0

    @property
    def held(self) -> int:
        """Bytes this connection holds against the budgets."""
        return self.reserved + self.unsent

    def _charge(self, reserved: int = 0, unsent: int = 0) -> None:
        before = self.reserved + self.unsent
        self.reserved += reserved
        self.unsent += unsent
        self.server._held_changed(before, self.reserved + self.unsent)

    def _set_unsent(self, n: int) -> None:
        if n != self.unsent:
            self._charge(unsent=n - self.unsent)

    def _refresh_unsent(self) -> None:
        """Answers still waiting = those in ``out`` + the transport's buffer; note progress."""
        transport = self.transport
        buffered = 0
        if transport is not None and not transport.is_closing():
            buffered = transport.get_write_buffer_size()
        sent = self.written - buffered
        if sent != self.sent_seen or not buffered:  # (nothing waiting: nothing is late)
            self.sent_seen = sent
            self.progress_at = self.loop.time()
        self._set_unsent(self.out_bytes + buffered)

    def _admissible(self, cost: int) -> str | None:
        """None if a request of ``cost`` bytes may start now, else whose budget is spent."""
        held = self.reserved + self.unsent
        if held and held + cost > self.cfg.connection_budget:
            return "connection"
        server = self.server
        total = server.held
        if total and total + cost > self.cfg.bookie_budget:
            if cost <= SMALL and held <= SMALL_FLOOR:
                return None
            # over the budget: still a fair share for a connection holding little, up to
            # twice the budget in all (so one holder cannot keep every other one waiting)
            if (total + cost <= 2 * self.cfg.bookie_budget
                    and held + cost <= self.cfg.bookie_budget // max(1, server.holders)):
                return None
            return "bookie"
        return None

    def _charge_entries(self, n: int) -> None:
        before = self.entries
        self.entries = before + n
        self.server._entries_changed(before, before + n)

    def _entries_blocked(self, n: int) -> str | None:
        """None if a request of ``n`` entries may start now, else whose cap is reached. A
        request always starts on a connection holding none, and one that keeps its
        connection within a fair share (the cap over the connections holding some) up to
        the cap and a quarter (OVER_CAP) in all. Others wait in line; the first in line has
        its entries kept free below the cap and starts once the bookie is back at its cap
        (the shares add up to the cap), or within an eighth over it (the last eighth stays
        for fair shares: a writer within its share never waits in line behind large
        requests), so smaller requests cannot keep a larger one waiting for ever."""
        held = self.entries
        cfg = self.cfg
        if held and held + n > cfg.max_entries_in_flight:
            return "connection_entries"
        server = self.server
        total = server.entries
        cap = cfg.bookie_entries_in_flight
        over = cap + cap // OVER_CAP
        waiters = server.entry_waiters
        reserve = 0
        if waiters:
            first = next(iter(waiters))
            if first is self:
                if total <= cap or total + n <= cap + cap // (2 * OVER_CAP):
                    del waiters[self]
                    return None
            else:
                reserve = waiters[first]
        if not total or total + n + reserve <= cap or (
                total + n <= over
                and held + n <= cap // (server.entry_holders + (0 if held else 1))):
            waiters.pop(self, None)
            return None
        waiters[self] = n  # (a connection already waiting keeps its place)
        return "bookie_entries"

    def _respond(self, request_id: int, response: Response, release: int = 0) -> None:
        """Queue ``response`` for the next flush; ``release``: bytes its request held, given
        back in the same step as the answer's are charged."""
        if self.transport is None or self.transport.is_closing():
            if release:
                self._charge(reserved=-release)
            return
        try:
            frame = codec.encode_response(request_id, response)
        except (ValueError, TypeError) as exc:  # a handler bug; tell the client, keep serving
            self.server.remote_event("unencodable answers", f"{response!r:.200}: {exc}", ERROR)
            frame = codec.encode_response(
                request_id,
                codec.error_response_for_op(response.op, Status.GENERIC_ERROR, str(exc)),
            )
        now = self.loop.time()
        if not self.unsent:  # the peer has this long to take it, counted from now
            self.progress_at = now
        self.out.append(frame)
        self.out_bytes += len(frame)
        self._charge(reserved=-release, unsent=len(frame))
        self.last_activity = now
        if not self.flush_scheduled:
            if not self.in_flight and not self.queue:
                self.flush()  # nothing else to answer (a lone client): now, not a pass later
                return
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued to the socket now (the server flushes each connection before
        it drops it at shutdown)."""
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.transport.write(data)
            self.written += len(data)
            self.server.stats.incr("writes")
        self.out.clear()
        self.out_bytes = 0
        self._refresh_unsent()
