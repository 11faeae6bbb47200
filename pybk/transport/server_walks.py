"""A server connection's large batches: their entry tables walked a step per loop turn
before they start (:mod:`pybk.transport.batchbodies`, issue 34).

:class:`WalkingConnection` is a part of
:class:`~pybk.transport.server_connection.ServerConnection`: when the head of its queue is
an ADD_BATCH whose table is not walked yet, :meth:`~WalkingConnection.start_walk` hands a
step to the server's ``walks`` (one step per loop turn for every connection's batches) and
nothing else of the connection starts meanwhile. A malformed table is answered
PROTOCOL_ERROR, as a body that does not parse is; the connection goes on.
"""

from __future__ import annotations

import collections

from pybk.errors import ProtocolError
from pybk.transport import codec
from pybk.transport.batchbodies import BatchBodies
from pybk.transport.server_budgets import BudgetedConnection
from pybk.wire import Status

__all__ = ["WalkingConnection"]


class WalkingConnection(BudgetedConnection):
    """The walk of the head request's entry table (a part of the server connection)."""

    queue: collections.deque[codec.Event]
    closing: bool
    blocked: str | None
    #: the head request, a large batch whose entry table is being walked
    walking: codec.RequestReceived | None = None

    def pump(self) -> None:  # (the request flow's, in the subclass)
        raise NotImplementedError

    def _dequeue(self, event: codec.Event) -> None:
        raise NotImplementedError

    def start_walk(self, event: codec.RequestReceived, bodies: BatchBodies) -> None:
        """Walk ``event``'s table a step per loop turn, then pump again."""
        self.blocked = "walking"
        self.walking = event

        def step() -> bool:
            if self.closing or not self.queue or self.queue[0] is not event:
                self.walking = None  # (gone with its connection)
                return True
            try:
                if not bodies.walk():
                    return False
            except ProtocolError as exc:
                self._dequeue(event)
                self.server.stats.incr("bad_message")
                self._respond(event.request_id, codec.error_response_for_op(
                    event.request.op, Status.PROTOCOL_ERROR, str(exc)))
            self.walking = None
            self.pump()
            return True

        self.server.walks.submit(step)
