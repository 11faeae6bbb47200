"""The transport seam: how a request reaches a bookie.

The client protocol code (``pybk.replication``) only ever calls :meth:`Transport.send`. The
in-process transport calls bookie objects directly, the TCP transport encodes frames on
sockets, and the simulator's transport delays, drops, duplicates and partitions messages. All
three deliver the same :mod:`pybk.protocol` request/response objects, so the quorum logic runs
unchanged on each.

Failure contract for ``send``: the returned future resolves to a response (whose ``status`` may
be non-OK: the bookie answered with an error), or fails with
:class:`pybk.errors.BookieUnavailableError` (could not reach the bookie / connection lost) or
:class:`pybk.errors.TimeoutError` (no answer within ``timeout``). A transport never raises any
other exception type for a bookie's misbehaviour.
"""

from __future__ import annotations

import abc
import asyncio

from pybk.protocol import Request, Response

__all__ = [
    "Transport",
]


class Transport(abc.ABC):
    """Sends requests to bookies by bookie id."""

    @abc.abstractmethod
    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        """Start sending ``request`` to ``bookie_id``; the future holds the response.

        Must be called from the event loop thread. Requests to one bookie are delivered in the
        order they were sent (the journal relies on per-connection order only for fairness,
        never for correctness).
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Pending futures fail with BookieUnavailableError."""
