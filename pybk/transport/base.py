"""The transport seam: how a request reaches a bookie.

Two ways in, one contract (listed in docs/internals.md, "pybk/transport/base.py").
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable

from pybk.errors import BKError, BookieUnavailableError, status_of
from pybk.transport.refusals import Refusal
from pybk.wire import (
    AddBatchRequest,
    AddCallback,
    AddLike,
    AddOutcome,
    AddRequest,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    add_outcome,
)

__all__ = [
    "OutcomeJoin",
    "Transport",
    "read_batch_by_singles",
    "settle_add",
    "split_batch",
    "split_callback",
]

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

    def add(self, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None = None) -> None:
        """Store the entries of ``request`` on ``bookie_id``; ``on_done(outcome)`` exactly
        once, never raising into the caller (see the module docstring). Must be called from
        the event loop thread; ``on_done`` may run before this returns.

        This default sends each entry as a single add through :meth:`send` and joins their
        answers; the built-in transports override it with their native path."""
        if type(request) is AddRequest:
            self._add_one(bookie_id, request, on_done, timeout)
            return
        assert isinstance(request, AddBatchRequest)
        singles = split_batch(request)
        parts = split_callback(on_done, len(singles), [[i] for i in range(len(singles))])
        for single, part in zip(singles, parts, strict=True):
            self._add_one(bookie_id, single, part, timeout)

    def _add_one(self, bookie_id: str, request: AddRequest, on_done: AddCallback,
                 timeout: float | None) -> None:
        try:
            fut = self.send(bookie_id, request, timeout)
        except BKError as exc:
            settle_add(on_done, exc)
            return
        fut.add_done_callback(lambda f: settle_add(on_done, _response_outcome(f)))

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections. Pending requests fail with BookieUnavailableError."""

    async def refusals(self, since: float | None = None) -> list[Refusal]:
        """Bookies that refused this transport's credentials (no TLS where TLS is wanted, a
        certificate failing verification, a token missing or refused), the latest per
        bookie, seen (or confirmed by a request refused while backing off from it) at or
        after loop time ``since``; forgotten once the bookie answers or cannot be reached.
        Waits for the probes in flight (bounded). Transports without credentials: none."""
        return []


def split_callback(on_done: AddCallback, n: int,
                   groups: list[list[int]]) -> list[AddCallback]:
    """The callbacks of the parts of a batch of ``n`` entries split into ``groups`` (lists
    of indices covering the batch once): each is called once with the outcome of its
    entries. When ``on_done`` has a ``part(indices)`` method (the writer's does), each part
    answers on its own, as soon as it is done (an entry held by a test hook does not hold
    back the others of its batch); else the parts are joined (:class:`OutcomeJoin`) and
    ``on_done`` is called once, for the lot."""
    part = getattr(on_done, "part", None)
    if part is not None:
        return [part(g) for g in groups]
    join = OutcomeJoin(n, on_done)
    return [join.part(g) for g in groups]


def read_batch_by_singles(
    send: Callable[[ReadRequest], asyncio.Future[Response]], request: ReadBatchRequest,
) -> asyncio.Future[Response]:
    """A :class:`~pybk.wire.ReadBatchRequest` answered by single reads through ``send``
    (a peer that does not take batches, a test hook acting on some entries): one entry of
    the answer per read, its status what the read said (UNAVAILABLE or TIMEOUT when it
    failed)."""
    loop = asyncio.get_running_loop()
    out: asyncio.Future[Response] = loop.create_future()
    ids = list(request.entry_ids)
    futs = [send(ReadRequest(request.ledger_id, e)) for e in ids]
    left = len(futs)

    def one_done(_f: asyncio.Future[Response]) -> None:
        nonlocal left
        left -= 1
        if left or out.done():
            return
        entries: list[tuple[int, Status, bytes | None]] = []
        lac = -1
        for eid, f in zip(ids, futs, strict=True):
            exc = None if f.cancelled() else f.exception()
            if f.cancelled() or exc is not None:
                entries.append((eid, status_of(exc) if exc is not None else Status.UNAVAILABLE,
                                None))
                continue
            response = f.result()
            if isinstance(response, ReadResponse):
                lac = max(lac, response.lac)
                ok = response.status == Status.OK
                entries.append((eid, response.status, response.body if ok else None))
            else:
                entries.append((eid, Status.PROTOCOL_ERROR, None))
        out.set_result(ReadBatchResponse(Status.OK, request.ledger_id, lac, tuple(entries)))

    for f in futs:
        f.add_done_callback(one_done)
    return out


def split_batch(request: AddBatchRequest) -> list[AddRequest]:
    """The single adds a batch is made of (for a peer that does not take batches)."""
    return [AddRequest(request.ledger_id, entry_id, request.master_key, body, request.recovery,
                       request.deferred_sync)
            for entry_id, body in zip(request.entry_ids, request.bodies, strict=True)]


def settle_add(on_done: AddCallback, outcome: AddOutcome) -> None:
    """Call an add's ``on_done`` (a transport's last step); a bug in it is logged by the
    loop's exception handler rather than breaking the transport's own bookkeeping."""
    try:
        on_done(outcome)
    except Exception as exc:  # an exception nobody expected: surface it, keep serving
        loop = asyncio.get_running_loop()
        loop.call_exception_handler({"message": "add callback failed", "exception": exc})


class OutcomeJoin:
    """One batch's outcome put together from the outcomes of its parts (a batch split for a
    peer that takes single adds, for a frame cap, or by test hooks): ``part(indices)`` gives
    the callback of the part holding those entries of the batch; once every part answered,
    ``on_done`` gets None when all entries are stored, else one outcome per entry."""

    __slots__ = ("_left", "_on_done", "_results")

    def __init__(self, n: int, on_done: AddCallback) -> None:
        self._results: list[BKError | None] = [None] * n
        self._left = 0
        self._on_done = on_done

    def part(self, indices: list[int]) -> Callable[[AddOutcome], None]:
        self._left += 1
        done = False

        def settle(outcome: AddOutcome) -> None:
            nonlocal done
            if done:
                return
            done = True
            if outcome is not None:
                for k, i in enumerate(indices):
                    self._results[i] = outcome if isinstance(outcome, BKError) else outcome[k]
            self._left -= 1
            if not self._left:
                results = self._results
                settle_add(self._on_done, None if all(r is None for r in results) else results)

        return settle


def _response_outcome(fut: asyncio.Future[Response]) -> AddOutcome:
    if fut.cancelled():
        return BookieUnavailableError("add cancelled")
    exc = fut.exception()
    if exc is not None:
        return exc if isinstance(exc, BKError) else BookieUnavailableError(repr(exc))
    return add_outcome(fut.result())
