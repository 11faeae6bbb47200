"""In-process transport: requests go straight to :class:`pybk.bookie.Bookie` objects.

Used by :class:`pybk.LocalCluster` and by the client tests. It keeps the transport contract of
:mod:`pybk.transport.base`. Adds go through ``bookie.add_request(request, on_done)``, the one
add path every transport drives: no task, coroutine, future or response object per request;
the bookie's journal completion calls the writer's ``on_done`` (through a small reply object
that also takes the request out of the deadline table). Other requests run
``bookie.handle(request)`` in one task each.

Timeouts use :class:`pybk.transport.deadlines.Deadlines` (the loop's clock: virtual under the
simulator; one timer for all requests). A timed-out request is not cancelled on the bookie:
like a slow network, the bookie may still apply it. Tests that need to hold, fail, drop or
delay requests wrap this transport in :class:`pybk.testing.HookedTransport` (this module
knows nothing of them). A bookie's tenancy gate (``bookie.tenancy``) is asked as over TCP,
for this transport's ``principal`` (docs/tenancy.md).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from pybk.errors import (
    BKError,
    BookieUnavailableError,
    ClientClosedError,
    TimeoutError,
    error_for_status,
)
from pybk.transport.base import Transport, settle_add
from pybk.transport.deadlines import Deadlines
from pybk.transport.fairness import Gate
from pybk.transport.identity import ANONYMOUS
from pybk.wire import (
    AddBatchRequest,
    AddCallback,
    AddLike,
    AddOutcome,
    AddRequest,
    BookieState,
    Request,
    Response,
    Status,
    add_response,
)

__all__ = ["LocalTransport"]

log = logging.getLogger(__name__)


class _BookieLike(Protocol):
    @property
    def state(self) -> str: ...

    async def handle(self, request: Any) -> Any: ...

    def add_request(self, request: Any, on_done: AddCallback) -> None: ...


class LocalTransport(Transport):
    """Calls the bookies of ``bookies`` (read live: it may change) directly."""

    def __init__(self, bookies: Mapping[str, _BookieLike], *,
                 principal: str = ANONYMOUS) -> None:
        self.bookies = bookies
        #: the tenant this transport's requests are (docs/tenancy.md)
        self.principal = principal
        #: adds held behind a delayed one, per bookie (kept in order)
        self._held: dict[str, collections.deque[tuple[AddLike, AddCallback]]] = {}
        self._closed = False
        self.sent = 0  # requests sent (for tests and benchmarks)
        self._deadlines = Deadlines()

    # -- the add path ------------------------------------------------------------------------

    def add(self, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None = None) -> None:
        self.sent += 1
        if self._closed:
            settle_add(on_done, ClientClosedError("transport closed"))
            return
        bookie = self.bookies.get(bookie_id)
        if bookie is None or bookie.state == BookieState.STOPPED:
            settle_add(on_done, BookieUnavailableError(f"bookie {bookie_id} is not running"))
            return
        if timeout is not None:
            reply = _AddReply(on_done, self._deadlines, bookie_id, request, timeout)
            on_done = reply
        gate: Gate | None = getattr(bookie, "tenancy", None)
        if gate is not None:
            held = self._held.get(bookie_id)
            if held is not None:  # behind a delayed add: in order
                held.append((request, on_done))
                return
            verdict = gate.check(self.principal, request)
            if verdict is not None:
                if inspect.isawaitable(verdict):
                    self._held[bookie_id] = collections.deque([(request, on_done)])
                    asyncio.ensure_future(self._release_held(bookie_id, gate, verdict))  # noqa: RUF006
                else:
                    settle_add(on_done, error_for_status(verdict.status, verdict.message))
                return
        self._add_now(bookie, bookie_id, request, on_done)

    def _add_now(self, bookie: _BookieLike, bookie_id: str, request: AddLike,
                 on_done: AddCallback) -> None:
        try:
            bookie.add_request(request, on_done)
        except Exception as exc:  # the bookie's contract is to answer, never to raise
            log.error("bookie %s raised adding %r", bookie_id, request, exc_info=exc)
            settle_add(on_done, BookieUnavailableError(f"bookie {bookie_id} failed: {exc!r}"))

    async def _release_held(self, bookie_id: str, gate: Gate,
                            verdict: Awaitable[Response | None]) -> None:
        """Wait out the head add's gate, then let the held adds through in order (each asks
        the gate itself; another delay waits again)."""
        held = self._held[bookie_id]
        checked = True
        try:
            while held:
                request, on_done = held[0]
                answer = await verdict if checked else gate.check(self.principal, request)
                if inspect.isawaitable(answer):
                    verdict, checked = answer, True
                    continue
                held.popleft()
                checked = False
                bookie = self.bookies.get(bookie_id)
                if answer is not None:
                    settle_add(on_done, error_for_status(answer.status, answer.message))
                elif bookie is None or bookie.state == BookieState.STOPPED or self._closed:
                    settle_add(on_done, BookieUnavailableError(f"bookie {bookie_id} is not "
                                                               "running"))
                else:
                    self._add_now(bookie, bookie_id, request, on_done)
        except Exception as exc:
            while held:
                settle_add(held.popleft()[1], BookieUnavailableError(
                    f"bookie {bookie_id}: tenancy check failed: {exc!r}"))
        finally:
            del self._held[bookie_id]

    # -- every other request -----------------------------------------------------------------

    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Response] = loop.create_future()
        if type(request) is AddRequest or type(request) is AddBatchRequest:
            # an add asked for as a request: the add path, its outcome put in a response
            self.add(bookie_id, request, lambda outcome: _answer(fut, request, outcome),
                     timeout)
            return fut
        self.sent += 1
        if self._closed:
            fut.set_exception(ClientClosedError("transport closed"))
            return fut
        bookie = self.bookies.get(bookie_id)
        if bookie is None or bookie.state == BookieState.STOPPED:
            fut.set_exception(BookieUnavailableError(f"bookie {bookie_id} is not running"))
            return fut
        token = None
        if timeout is not None:
            token = self._deadlines.add(
                timeout, lambda: _fail(fut, _timeout(bookie_id, request, timeout)))
        # the task stays reachable through what it awaits (the bookie holds those futures)
        asyncio.ensure_future(_call(bookie, bookie_id, request, fut, self._deadlines, token,  # noqa: RUF006
                                    self.principal))
        return fut

    async def close(self) -> None:
        self._closed = True
        self._deadlines.close()


class _AddReply:
    """The ``on_done`` of one add with a timeout: settles once (the answer or the deadline,
    whichever comes first) and takes the request out of the deadline table. A small object
    rather than a closure and its cells (less for the garbage collector)."""

    __slots__ = ("bookie_id", "deadlines", "done", "on_done", "request", "timeout", "token")

    def __init__(self, on_done: AddCallback, deadlines: Deadlines, bookie_id: str,
                 request: AddLike, timeout: float) -> None:
        self.on_done = on_done
        self.deadlines = deadlines
        self.bookie_id = bookie_id
        self.request = request
        self.timeout = timeout
        self.done = False
        self.token = deadlines.add(timeout, self.expire)

    def __call__(self, outcome: AddOutcome) -> None:
        if self.done:
            return
        self.done = True
        self.deadlines.discard(self.token)
        settle_add(self.on_done, outcome)

    def expire(self) -> None:
        if not self.done:
            self.done = True
            settle_add(self.on_done, _timeout(self.bookie_id, self.request, self.timeout))


def _answer(fut: asyncio.Future[Response], request: AddLike, outcome: AddOutcome) -> None:
    """Settle a :meth:`LocalTransport.send` of an add: unreachable and timed out are
    exceptions, like for any request; what the bookie said is its response."""
    if fut.done():
        return
    if isinstance(outcome, BookieUnavailableError | TimeoutError):
        fut.set_exception(outcome)
    else:
        fut.set_result(add_response(request, outcome))


async def _call(
    bookie: _BookieLike, bookie_id: str, request: Request, fut: asyncio.Future[Response],
    deadlines: Deadlines, token: int | None, principal: str = ANONYMOUS,
) -> None:
    """Run one request on the bookie and settle ``fut`` (one task per request, no extra hop)."""
    gate: Gate | None = getattr(bookie, "tenancy", None)
    try:
        try:
            refusal = None
            if gate is not None:
                verdict = gate.check(principal, request)
                refusal = await verdict if inspect.isawaitable(verdict) else verdict
            response = refusal or await bookie.handle(request)
            if gate is not None and refusal is None:
                gate.answered(principal, request, response)
        finally:
            if token is not None:
                deadlines.discard(token)
    except asyncio.CancelledError:
        _fail(fut, BookieUnavailableError(f"bookie {bookie_id}: request cancelled"))
        raise
    except Exception as exc:
        log.warning("bookie %s raised %r handling a request", bookie_id, exc)
        _fail(fut, BookieUnavailableError(f"bookie {bookie_id} failed: {exc!r}"))
        return
    if fut.done():
        return
    if response.status == Status.UNAVAILABLE:
        fut.set_exception(BookieUnavailableError(f"bookie {bookie_id}: {response.message}"))
    else:
        fut.set_result(response)


def _fail(fut: asyncio.Future[Response], exc: BKError) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _timeout(bookie_id: str, request: Request, timeout: float) -> TimeoutError:
    return TimeoutError(f"bookie {bookie_id}: no answer to {request.op.name} within {timeout}s")
