"""Request deadlines for every transport: one loop timer for any number of requests.

A transport answers each request with its response, or with :class:`pybk.errors.TimeoutError`
once its timeout passes. Thousands of requests are in flight on the write path, so a timer per
request (a ``TimerHandle`` in the loop's heap, cancelled on every answer) costs more than the
request itself. :class:`Deadlines` keeps, per timeout value, the pending requests in send
order: a request sent later with the same timeout expires later, so each of those queues is
ordered by deadline by construction, and adding or forgetting a request is a dict operation.
One loop timer is armed at the earliest deadline at the head of a queue; when it fires, the
overdue requests leave their queues and their ``on_expire`` callbacks run, and the timer is
armed again for the next head. An answered request leaves its queue at once (nothing answered
stays alive here); a head that left early only makes the timer fire once for nothing.

Time is the running loop's clock (virtual under the simulator): the in-process, TCP and
simulated transports and the test hooks all use this one class, so a timeout means the same
thing on every path (issue: "one timeout mechanism").
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

__all__ = ["Deadlines"]

#: ``on_expire()`` of one request: settle it with a timeout (quick, must not raise)
Expire = Callable[[], None]


class Deadlines:
    """Deadlines of pending requests on one event loop. See the module docstring.

    ``add(timeout, on_expire)`` returns a token; ``discard(token)`` forgets the request (it was
    answered); ``on_expire`` runs once, at or after ``loop.time() + timeout``, unless the token
    was discarded first. ``close()`` forgets everything without calling anyone."""

    __slots__ = ("_armed_at", "_loop", "_next", "_queues", "_timeout_of", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        #: timeout value -> {token: (deadline, on_expire)}, in deadline order
        self._queues: dict[float, dict[int, tuple[float, Expire]]] = {}
        #: token -> its timeout value (which queue it is in)
        self._timeout_of: dict[int, float] = {}
        self._next = 0
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at = math.inf

    def __len__(self) -> int:
        """Requests waiting for their deadline."""
        return len(self._timeout_of)

    def add(self, timeout: float, on_expire: Expire) -> int:
        """Call ``on_expire()`` once ``timeout`` seconds have passed, unless discarded first."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        token = self._next = self._next + 1
        queue = self._queues.get(timeout)
        if queue is None:
            queue = self._queues[timeout] = {}
        queue[token] = (deadline, on_expire)
        self._timeout_of[token] = timeout
        if deadline < self._armed_at:
            self._arm(loop, deadline)
        return token

    def discard(self, token: int) -> None:
        """Forget a request (answered, or failed another way); no-op for an unknown token."""
        timeout = self._timeout_of.pop(token, None)
        if timeout is not None:
            queue = self._queues[timeout]
            del queue[token]
            if not queue:
                del self._queues[timeout]
            if not self._timeout_of and self._timer is not None:
                self._timer.cancel()
                self._timer, self._armed_at = None, math.inf

    def close(self) -> None:
        """Forget every request without expiring it (the owner fails them its own way)."""
        self._queues.clear()
        self._timeout_of.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._armed_at = None, math.inf

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_at = when
        self._timer = loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer, self._armed_at = None, math.inf
        loop = self._loop
        assert loop is not None
        now = loop.time()
        due: list[Expire] = []
        earliest = math.inf
        timeout_of = self._timeout_of
        for timeout, queue in list(self._queues.items()):
            while queue:
                token = next(iter(queue))
                deadline, on_expire = queue[token]
                if deadline > now:
                    earliest = min(earliest, deadline)
                    break
                del queue[token]
                del timeout_of[token]
                due.append(on_expire)
            if not queue:
                del self._queues[timeout]
        if earliest < math.inf:
            self._arm(loop, earliest)
        for on_expire in due:  # after the bookkeeping: a callback may add or discard
            on_expire()

    def _check(self) -> None:
        """Assert the invariants (tests): queues ordered by deadline, tokens accounted for,
        the timer armed no later than the earliest deadline."""
        seen = 0
        earliest = math.inf
        for timeout, queue in self._queues.items():
            assert queue, f"empty queue for timeout {timeout}"
            deadlines = [d for d, _ in queue.values()]
            assert deadlines == sorted(deadlines), f"queue {timeout} out of order"
            for token in queue:
                assert self._timeout_of[token] == timeout
            seen += len(queue)
            earliest = min(earliest, deadlines[0])
        assert seen == len(self._timeout_of)
        if earliest < math.inf:
            assert self._timer is not None and self._armed_at <= earliest
