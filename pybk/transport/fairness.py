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

__all__ = ["FairShare", "Gate"]



class Gate(Protocol):
    def check(self, principal: str,
              request: Request) -> Response | Awaitable[Response | None] | None: ...

    def answered(self, principal: str, request: Request, response: Response) -> None: ...


class _Waiter(Protocol):
    closing: bool

    def fair_granted(self) -> None: ...


class FairShare:
    """At most ``capacity`` adds in the bookie's add path at once, across every connection;
    past that, connections wait in their tenant's queue and slots are handed out round-robin
    across tenants (one tenant's many connections get one turn per round, like any other
    tenant's one), so one tenant's backlog never sits in front of another's adds."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.in_use = 0
        self.waiting: dict[str, dict[_Waiter, None]] = {}  # tenant -> connections, in order
        self.waits = 0  # times a connection had to queue (for tests and metrics)

    def try_acquire(self, tenant: str, conn: _Waiter) -> bool:
        """A slot now (True), or ``conn`` queued under ``tenant`` (False: it is told by
        ``conn.fair_granted()`` once it holds one)."""
        if self.in_use < self.capacity and not self.waiting:
            self.in_use += 1
            return True
        queue = self.waiting.setdefault(tenant, {})
        if conn not in queue:
            queue[conn] = None
            self.waits += 1
        return False

    def release(self) -> None:
        """An add left the add path: hand its slot to the next tenant in turn."""
        self.in_use -= 1
        while self.in_use < self.capacity and self.waiting:
            tenant = next(iter(self.waiting))
            queue = self.waiting.pop(tenant)
            conn = next(iter(queue))
            del queue[conn]
            if queue:
                self.waiting[tenant] = queue  # (to the back: the next tenant goes first)
            if conn.closing:
                continue
            self.in_use += 1
            conn.fair_granted()

    def forget(self, conn: _Waiter, holding: bool = False) -> None:
        """A closing connection leaves every queue (and gives back the place it was handed
        but did not use, when ``holding``)."""
        for tenant in [t for t, q in self.waiting.items() if conn in q]:
            del self.waiting[tenant][conn]
            if not self.waiting[tenant]:
                del self.waiting[tenant]
        if holding:
            self.release()
