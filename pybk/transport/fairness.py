"""The tenancy gate a server asks before it starts a request (``Bookie``'s enforcer is one).

``gate.check(principal, request)`` answers at once when it can: ``None`` (start it now) or a
refusal ``Response``; else an awaitable that ends when the request may start (after a rate
delay, or once the ledger's namespace is known), with ``None`` or a refusal. While a
connection waits on its gate it starts nothing else and reads nothing more (Kafka's muted
channel): its backlog stays in its own socket, never in front of another tenant's requests
on the shared add path. ``gate.answered(principal, request, response)`` counts what an answer
carried (read bytes are charged after the read, as Kafka charges a fetch).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from pybk.wire import Request, Response

__all__ = ["Gate"]



class Gate(Protocol):
    def check(self, principal: str,
              request: Request) -> Response | Awaitable[Response | None] | None: ...

    def answered(self, principal: str, request: Request, response: Response) -> None: ...
