"""In-process transport: requests go straight to :class:`pybk.bookie.Bookie` objects.

Used by :class:`pybk.LocalCluster` and by the client tests. It keeps the transport
contract of :mod:`pybk.transport.base` (a response, ``BookieUnavailableError`` or
``TimeoutError``, nothing else). Tests that need to hold, fail, drop or delay requests wrap it
in :class:`pybk.testing.HookedTransport` (this module knows nothing of them).

Per-request timeouts use the running loop's clock (virtual time under the simulator) but
not one timer per request: requests wait in one send-ordered table per timeout value, which an
answer leaves at once (so nothing answered stays alive: fewer objects for the garbage
collector), and a single sweep timer (every quarter of the shortest timeout) expires the
overdue ones, so a timeout fires between its deadline and a quarter of it later. A
timed-out request is not cancelled on the bookie: like a slow network, the bookie may still
apply it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from pybk.errors import BookieUnavailableError, ClientClosedError, TimeoutError
from pybk.protocol import AddRequest, BookieState, Request, Response, Status
from pybk.transport.base import Transport

__all__ = ["LocalTransport"]

log = logging.getLogger(__name__)


class _BookieLike(Protocol):
    @property
    def state(self) -> str: ...

    async def handle(self, request: Any) -> Any: ...


_Deadline = tuple[float, "asyncio.Future[Response]", str, Request]
#: pending requests of one timeout value, in send order (so in deadline order) by request
#: number; an answered request leaves at once, so nothing answered is kept alive here
_Queue = dict[int, _Deadline]


class LocalTransport(Transport):
    """Calls ``bookies[bookie_id].handle(request)``; ``bookies`` may change (it is read live).

    Adds go through ``bookie.add_nowait(request, reply)`` when the bookie has it (a
    :class:`pybk.bookie.Bookie` does): no task or coroutine per request, the reply is set
    straight from the bookie's journal completion."""

    def __init__(self, bookies: Mapping[str, _BookieLike]) -> None:
        self.bookies = bookies
        self._closed = False
        self.sent = 0  # requests sent (for tests and benchmarks)
        self._deadlines: dict[float, _Queue] = {}
        self._next_rid = 0
        self._sweeper: asyncio.TimerHandle | None = None

    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Response] = loop.create_future()
        self.sent += 1
        if self._closed:
            fut.set_exception(ClientClosedError("transport closed"))
            return fut
        queue: _Queue | None = None
        rid = 0
        if timeout is not None:
            queue = self._deadlines.get(timeout)
            if queue is None:
                queue = self._deadlines[timeout] = {}
            rid = self._next_rid = self._next_rid + 1
            queue[rid] = (loop.time() + timeout, fut, bookie_id, request)
            if self._sweeper is None:
                self._schedule_sweep(loop)
        self._deliver(fut, bookie_id, request, queue, rid)
        return fut

    def _deliver(
        self, fut: asyncio.Future[Response], bookie_id: str, request: Request,
        queue: _Queue | None, rid: int,
    ) -> None:
        if fut.done():
            return
        bookie = self.bookies.get(bookie_id)
        if bookie is None or bookie.state == BookieState.STOPPED:
            fut.set_exception(BookieUnavailableError(f"bookie {bookie_id} is not running"))
            return
        if type(request) is AddRequest:
            add_nowait = getattr(bookie, "add_nowait", None)
            if add_nowait is not None:
                add_nowait(request, _AddReply(fut, bookie_id, queue, rid))
                return
        # the task stays reachable through what it awaits (the bookie holds those futures)
        asyncio.ensure_future(_call(bookie, bookie_id, request, fut, queue, rid))  # noqa: RUF006

    def _schedule_sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        period = min(0.5, max(0.001, min(self._deadlines) / 4))
        self._sweeper = loop.call_later(period, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        now = loop.time()
        for timeout, queue in list(self._deadlines.items()):
            gone = []
            for rid, (deadline, fut, _bookie, _request) in queue.items():
                if deadline > now and not fut.done():
                    break
                gone.append(rid)
            for rid in gone:
                _deadline, fut, bookie_id, request = queue.pop(rid)
                _expire(fut, bookie_id, request, timeout)
            if not queue:
                del self._deadlines[timeout]
        if self._deadlines and not self._closed:
            self._schedule_sweep(loop)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


class _AddReply:
    """The reply callback of one add on the fast path: one small object rather than a
    closure and its cells (fewer objects for the garbage collector per replica)."""

    __slots__ = ("bookie_id", "fut", "queue", "rid")

    def __init__(self, fut: asyncio.Future[Response], bookie_id: str, queue: _Queue | None,
                 rid: int) -> None:
        self.fut = fut
        self.bookie_id = bookie_id
        self.queue = queue
        self.rid = rid

    def __call__(self, response: Response) -> None:
        if self.queue is not None:
            self.queue.pop(self.rid, None)
        _settle(self.fut, self.bookie_id, response)


def _settle(fut: asyncio.Future[Response], bookie_id: str, response: Response) -> None:
    if fut.done():
        return
    if response.status == Status.UNAVAILABLE:
        fut.set_exception(BookieUnavailableError(f"bookie {bookie_id}: {response.message}"))
    else:
        fut.set_result(response)


async def _call(
    bookie: _BookieLike, bookie_id: str, request: Request, fut: asyncio.Future[Response],
    queue: _Queue | None, rid: int,
) -> None:
    """Run one request on the bookie and settle ``fut`` (one task per request, no extra hop)."""
    try:
        try:
            response = await bookie.handle(request)
        finally:
            if queue is not None:
                queue.pop(rid, None)
    except asyncio.CancelledError:
        if not fut.done():
            fut.set_exception(BookieUnavailableError(f"bookie {bookie_id}: request cancelled"))
        raise
    except Exception as exc:
        log.warning("bookie %s raised %r handling a request", bookie_id, exc)
        if not fut.done():
            fut.set_exception(BookieUnavailableError(f"bookie {bookie_id} failed: {exc!r}"))
        return
    _settle(fut, bookie_id, response)


def _expire(
    fut: asyncio.Future[Response], bookie_id: str, request: Request, timeout: float
) -> None:
    if not fut.done():
        fut.set_exception(
            TimeoutError(f"bookie {bookie_id}: no answer to {request.op.name} within {timeout}s")
        )
