"""A server connection's long polls of one burst started a moment late, and cancelled when
their peer goes away (:mod:`pybk.transport.server_connection`).

:class:`PollingConnection` is a part of
:class:`~pybk.transport.server_connection.ServerConnection`: long polls only wait, so the
ones a burst brings beyond the first few are admitted (counted, charged) but started
``LONG_POLL_START_DELAY`` later, never if the peer hung up meanwhile; and every long poll
of a connection is cancelled when nobody will read its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Final

from pybk.transport.server_parts import is_long_poll
from pybk.transport.server_walks import WalkingConnection
from pybk.wire import Request, Status, error_response

__all__ = ["LONG_POLLS_AT_ONCE", "LONG_POLL_START_DELAY", "PollingConnection"]

#: long polls one pump starts at once; more in the same burst start a moment later
#: (LONG_POLL_START_DELAY): if the peer hangs up right behind its burst, they never start
LONG_POLLS_AT_ONCE: Final = 16
LONG_POLL_START_DELAY: Final = 0.005


class PollingConnection(WalkingConnection):
    """The deferred and cancelled long polls of a server connection (a part of it)."""

    tasks: dict[asyncio.Task[None], Request]
    #: what each running task holds (bytes charged, long poll?, entries) until settled
    _costs: dict[asyncio.Task[None], tuple[int, bool, int]]
    #: long polls of a burst admitted (counted, charged) but not started yet:
    #: (request id, request, bytes charged)
    _deferred: list[tuple[int, Request, int]]
    _deferred_timer: asyncio.TimerHandle | None
    in_flight: int
    long_polls: int

    def _serve(self, request_id: int, request: Request,
               entry_uncharged: bool) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    def _task_done(self, task: asyncio.Task[None]) -> None:
        raise NotImplementedError

    def cancel_long_polls(self) -> None:
        """Long polls only wait, so they are cancelled when nobody will read the answer.
        Other requests are left to finish: cancelling a handler could interrupt the bookie
        half way (its outcome is indeterminate for the client either way)."""
        for task, request in list(self.tasks.items()):
            if is_long_poll(request):
                task.cancel()
        deferred, self._deferred = self._deferred, []
        if self._deferred_timer is not None:
            self._deferred_timer.cancel()
            self._deferred_timer = None
        for request_id, request, cost in deferred:  # never started: nothing to interrupt
            if self.server.stopping:
                self._respond(request_id,
                              error_response(request, Status.UNAVAILABLE, "bookie stopping"))
            self._settle_long_poll(cost)

    def _defer(self, request_id: int, request: Request, cost: int) -> None:
        self._deferred.append((request_id, request, cost))
        if self._deferred_timer is None:
            self._deferred_timer = self.loop.call_later(LONG_POLL_START_DELAY,
                                                        self._start_deferred)

    def _start_deferred(self) -> None:
        """Start the long polls of a burst, unless the peer went away meanwhile."""
        self._deferred_timer = None
        deferred, self._deferred = self._deferred, []
        for request_id, request, cost in deferred:
            if self.closing:
                self._settle_long_poll(cost)
                continue
            self.server.stats.incr("long_polls_started")
            task = self.loop.create_task(self._serve(request_id, request, True))
            self.tasks[task] = request
            self._costs[task] = (cost, True, 0)
            task.add_done_callback(self._task_done)

    def _settle_long_poll(self, cost: int) -> None:
        """Give back what a long poll that never started held (its bytes; it counts no
        entries)."""
        self.in_flight -= 1
        self._charge(reserved=-cost)
        self.long_polls -= 1
        self.server._long_poll_ended()
