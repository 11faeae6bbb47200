"""In-process transport: requests go straight to :class:`pybk.bookie.Bookie` objects.

Used by :class:`pybk.LocalCluster` and by the client tests. It keeps the transport
contract of :mod:`pybk.transport.base` (a response, ``BookieUnavailableError`` or
``TimeoutError``, nothing else) and consults a :class:`pybk.testing.hooks.Hooks` object on
every request so tests can hold, fail, drop or delay requests per bookie and operation.

Per-request timeouts use the running loop's clock (virtual time under the simulator) but
not one timer per request: requests wait in one FIFO per timeout value and a single sweep
timer (every quarter of the shortest timeout) expires the overdue ones and drops the
answered ones, so a timeout fires between its deadline and a quarter of it later. A
timed-out request is not cancelled on the bookie: like a slow network, the bookie may still
apply it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol

from pybk.errors import BookieUnavailableError, ClientClosedError, TimeoutError
from pybk.protocol import Request, Response, Status, error_response
from pybk.testing.hooks import HeldRequest, Hooks
from pybk.transport.base import Transport

log = logging.getLogger(__name__)


class _BookieLike(Protocol):
    @property
    def state(self) -> str: ...

    async def handle(self, request: Any) -> Any: ...


class LocalTransport(Transport):
    """Calls ``bookies[bookie_id].handle(request)``; ``bookies`` may change (it is read live)."""

    def __init__(self, bookies: Mapping[str, _BookieLike], *, hooks: Hooks | None = None) -> None:
        self.bookies = bookies
        self.hooks = hooks if hooks is not None else Hooks()
        self._closed = False
        self.sent = 0  # requests sent (for tests and benchmarks)
        self._deadlines: dict[float, deque[_Deadline]] = {}
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
        if timeout is not None:
            queue = self._deadlines.get(timeout)
            if queue is None:
                queue = self._deadlines[timeout] = deque()
            queue.append((loop.time() + timeout, fut, bookie_id, request))
            if self._sweeper is None:
                self._schedule_sweep(loop)
        rule = self.hooks.match(bookie_id, request) if self.hooks.rules else None
        if rule is None:
            self._deliver(fut, bookie_id, request)
            return fut
        if rule.action == "fail":
            _fail(fut, bookie_id, request, rule.status)
        elif rule.action == "drop":
            pass
        elif rule.action == "hold":
            rule.held.append(
                HeldRequest(
                    bookie_id,
                    request,
                    deliver=lambda: self._deliver(fut, bookie_id, request),
                    fail=lambda status: _fail(fut, bookie_id, request, status),
                    drop=lambda: None,
                )
            )
            rule._notify()
        else:  # before
            assert rule.callback is not None
            callback = rule.callback

            async def run_then_deliver() -> None:
                try:
                    await callback(bookie_id, request)
                except Exception as exc:  # a failing hook fails the request, visibly
                    if not fut.done():
                        fut.set_exception(
                            BookieUnavailableError(f"{bookie_id}: hook failed: {exc!r}")
                        )
                    return
                self._deliver(fut, bookie_id, request)

            _spawn(run_then_deliver())
        return fut

    def _deliver(self, fut: asyncio.Future[Response], bookie_id: str, request: Request) -> None:
        if fut.done():
            return
        bookie = self.bookies.get(bookie_id)
        if bookie is None or bookie.state == "stopped":
            fut.set_exception(BookieUnavailableError(f"bookie {bookie_id} is not running"))
            return
        # the task stays reachable through what it awaits (the bookie holds those futures)
        asyncio.ensure_future(_call(bookie, bookie_id, request, fut))  # noqa: RUF006

    def _schedule_sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        period = min(0.5, max(0.001, min(self._deadlines) / 4))
        self._sweeper = loop.call_later(period, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        now = loop.time()
        for timeout, queue in list(self._deadlines.items()):
            while queue:
                deadline, fut, bookie_id, request = queue[0]
                if fut.done():
                    queue.popleft()
                elif deadline <= now:
                    queue.popleft()
                    _expire(fut, bookie_id, request, timeout)
                else:
                    break
            if not queue:
                del self._deadlines[timeout]
        if self._deadlines and not self._closed:
            self._schedule_sweep(loop)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.hooks.clear(release=False)


_Deadline = tuple[float, "asyncio.Future[Response]", str, Request]
_background: set[asyncio.Task[None]] = set()


def _spawn(coro: Any) -> None:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _call(
    bookie: _BookieLike, bookie_id: str, request: Request, fut: asyncio.Future[Response]
) -> None:
    """Run one request on the bookie and settle ``fut`` (one task per request, no extra hop)."""
    try:
        response = await bookie.handle(request)
    except asyncio.CancelledError:
        if not fut.done():
            fut.set_exception(BookieUnavailableError(f"bookie {bookie_id}: request cancelled"))
        raise
    except Exception as exc:
        log.warning("bookie %s raised %r handling a request", bookie_id, exc)
        if not fut.done():
            fut.set_exception(BookieUnavailableError(f"bookie {bookie_id} failed: {exc!r}"))
        return
    if fut.done():
        return
    if response.status == Status.UNAVAILABLE:
        fut.set_exception(BookieUnavailableError(f"bookie {bookie_id}: {response.message}"))
    else:
        fut.set_result(response)


def _fail(
    fut: asyncio.Future[Response], bookie_id: str, request: Request, status: Status | None
) -> None:
    if fut.done():
        return
    if status is None or status == Status.UNAVAILABLE:
        fut.set_exception(BookieUnavailableError(f"bookie {bookie_id} unavailable (hook)"))
    elif status == Status.TIMEOUT:
        fut.set_exception(TimeoutError(f"bookie {bookie_id}: timed out (hook)"))
    else:
        fut.set_result(error_response(request, status, f"injected {status.name}"))


def _expire(
    fut: asyncio.Future[Response], bookie_id: str, request: Request, timeout: float
) -> None:
    if not fut.done():
        fut.set_exception(
            TimeoutError(f"bookie {bookie_id}: no answer to {request.op.name} within {timeout}s")
        )
