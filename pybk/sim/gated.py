"""The bookies' tenancy gate on the simulated network, run as the TCP server runs it.

A bookie incarnation installed with a gate (``SimNetwork.set_bookie(..., gate=bookie.tenancy)``:
the production :class:`pybk.bookie.tenancy.TenancyEnforcer`, on the loop's virtual time and
the simulated metadata store) is asked about each add and read that reaches it, for the
principal of the client that sent it (``SimNetwork.principal_of``; production derives it
from the connection's token or certificate, :mod:`pybk.transport.identity`). The request
starts now, is refused with the gate's answer (an error answer like any other: the run's
observers see it), or is held while the gate's awaitable runs (a rate's delay, a namespace
being read). While a request is held, every later request of its connection waits behind it
in order, whatever its kind (the TCP server's muted connection reads nothing more,
:mod:`pybk.transport.server_connection`). A connection reset or a bookie restart drops what
it held: the reset already failed their senders.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from pybk.errors import error_for_status, status_of
from pybk.transport.fairness import Gate
from pybk.transport.server_parts import GATED, await_verdict
from pybk.wire import (
    AddCallback,
    AddLike,
    ReadBatchRequest,
    ReadRequest,
    Request,
    Response,
    error_response,
)

if TYPE_CHECKING:
    from pybk.sim.links import Conn
    from pybk.sim.net import SimNetwork

__all__ = ["GateKeeper", "GateWatcher", "ReadWatcher"]

#: ``watch(bookie, client, principal, request, refusal, asked)``, for each gated request as
#: its gate decides (``refusal`` None: it starts now; ``asked``: when the gate was asked)
GateWatcher = Callable[[str, str, str, Request, Response | None, float], None]
#: ``watch(bookie, principal, request, response)``, for each gated read as it is answered
ReadWatcher = Callable[[str, str, Request, Response], None]
_Held = collections.deque[tuple["Conn", int, int, Request]]


class GateKeeper:
    """The gated bookies' side of every simulated connection (one per network)."""

    def __init__(self, net: SimNetwork) -> None:
        self.net = net
        self._held: dict[tuple[str, str], _Held] = {}
        self._principals: dict[str, str] = {}
        self.watchers: list[GateWatcher] = []
        self.read_watchers: list[ReadWatcher] = []
        #: requests that waited on their gate (a rate's delay or a lookup), and refusals
        self.held = 0
        self.refused = 0

    def principal(self, client: str) -> str:
        """Who ``client`` is to the bookies (asked once per client name)."""
        found = self._principals.get(client)
        if found is None:
            found = self._principals[client] = self.net.principal_of(client)
        return found

    def arrive(self, client: str, bookie_id: str, conn: Conn, gen: int, seq: int,
               request: Request) -> None:
        """A request reached a gated bookie: start it, or hold it behind its connection's
        held head."""
        key = (client, bookie_id)
        held = self._held.get(key)
        if held is not None:
            head_conn, head_gen = held[0][0], held[0][1]
            if head_conn.gen == head_gen:  # (else the head died with its connection)
                held.append((conn, gen, seq, request))
                return
        self._run(key, collections.deque([(conn, gen, seq, request)]))

    def _run(self, key: tuple[str, str], queue: _Held) -> None:
        """Start ``queue``'s requests in order until one has to wait on the gate."""
        client, bookie_id = key
        net = self.net
        while queue:
            conn, gen, seq, request = queue[0]
            if conn.gen != gen:  # its connection was reset: gone with it
                queue.popleft()
                continue
            gate = net.gate_of(bookie_id)
            if gate is None or not isinstance(request, GATED):
                queue.popleft()
                net.start_request(client, bookie_id, conn, gen, seq, request)
                continue
            principal = self.principal(client)
            asked = net.running_loop().time()
            try:
                verdict = gate.check(principal, request)
            except Exception as exc:  # (the TCP server answers a failed check as an error)
                verdict = error_response(request, status_of(exc), str(exc))
            if inspect.isawaitable(verdict):
                self._held[key] = queue
                self.held += 1
                task = asyncio.ensure_future(await_verdict(verdict, request))
                task.add_done_callback(partial(self._waited, key, queue, gate, principal, asked))
                return
            queue.popleft()
            self._decided(client, bookie_id, gate, principal, conn, gen, seq, request, verdict,
                          asked)
        if self._held.get(key) is queue:
            del self._held[key]

    def _waited(self, key: tuple[str, str], queue: _Held, gate: Gate, principal: str,
                asked: float, task: asyncio.Future[Response | None]) -> None:
        if task.cancelled():  # (the run is ending)
            if self._held.get(key) is queue:
                del self._held[key]
            return
        conn, gen, seq, request = queue.popleft()
        client, bookie_id = key
        if conn.gen == gen and self.net.gate_of(bookie_id) is gate:
            self._decided(client, bookie_id, gate, principal, conn, gen, seq, request,
                          task.result(), asked)
        self._run(key, queue)

    def _decided(self, client: str, bookie_id: str, gate: Gate, principal: str, conn: Conn,
                 gen: int, seq: int, request: Request, refusal: Response | None,
                 asked: float) -> None:
        for watch in self.watchers:
            watch(bookie_id, client, principal, request, refusal, asked)
        net = self.net
        if refusal is not None:
            self.refused += 1
            net.start_request(client, bookie_id, conn, gen, seq, request,
                              serve=partial(_refuse, refusal),
                              add=partial(_refuse_add, refusal))
        elif isinstance(request, ReadRequest | ReadBatchRequest):
            # (the gate counts what the read's answer carried; no handler: the bookie is down)
            handler = net.handler_of(bookie_id)
            serve = None if handler is None else partial(
                _read, handler, gate, principal, bookie_id, self.read_watchers)
            net.start_request(client, bookie_id, conn, gen, seq, request, serve=serve)
        else:
            net.start_request(client, bookie_id, conn, gen, seq, request)


async def _refuse(refusal: Response, request: Request) -> Response:
    return refusal


def _refuse_add(refusal: Response, request: AddLike, on_done: AddCallback) -> None:
    on_done(error_for_status(refusal.status, refusal.message))


async def _read(handler: Any, gate: Gate, principal: str, bookie_id: str,
                watchers: list[ReadWatcher], request: Request) -> Response:
    response: Response = await handler(request)
    gate.answered(principal, request, response)
    for watch in watchers:
        watch(bookie_id, principal, request, response)
    return response
