"""Shared helpers for the TCP tests: a tiny in-memory handler standing in for a bookie,
server/transport fixtures, and bounded condition waits (never bare sleeps)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

import pytest

from pybk.wire import (
    AddRequest,
    AddResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    error_response,
)


class StubBookie:
    """Stores adds in a dict and serves reads; ``hold`` parks requests until released."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], bytes] = {}
        self.calls: list[Request] = []
        self.hold = False
        self.active = 0
        self.max_active = 0
        self._gates: collections.deque[asyncio.Future[None]] = collections.deque()

    def release_all(self) -> None:
        self.hold = False
        while self._gates:
            gate = self._gates.popleft()
            if not gate.done():
                gate.set_result(None)

    async def handle(self, request: Request) -> Response:
        self.calls.append(request)
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            if self.hold:
                gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._gates.append(gate)
                await gate
            if isinstance(request, AddRequest):
                self.entries[(request.ledger_id, request.entry_id)] = request.body
                return AddResponse(Status.OK, request.ledger_id, request.entry_id)
            if isinstance(request, ReadRequest):
                body = self.entries.get((request.ledger_id, request.entry_id))
                if body is None:
                    return error_response(request, Status.NO_SUCH_ENTRY, "no such entry")
                return ReadResponse(Status.OK, request.ledger_id, request.entry_id, body)
            return error_response(request, Status.BAD_REQUEST, "stub supports add/read only")
        finally:
            self.active -= 1


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Wait for ``cond()`` to hold, polling on the loop, failing after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or cond}")
        await asyncio.sleep(0.01)


async def wait_until_async(
    cond: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = ""
) -> None:
    """Like :func:`wait_until` for a condition that must be awaited (e.g. a store query)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or cond}")
        await asyncio.sleep(0.01)


@pytest.fixture
def stub() -> StubBookie:
    return StubBookie()
