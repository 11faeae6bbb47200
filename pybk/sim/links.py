"""What the simulated network moves: its knobs (:class:`NetConfig`), a connection and the
requests pending on it, and how a request is classified for the targeted faults."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from pybk.errors import BKError, BookieUnavailableError
from pybk.errors import TimeoutError as BKTimeoutError
from pybk.transport.base import settle_add
from pybk.wire import (
    AddBatchRequest,
    AddBatchResponse,
    AddCallback,
    AddLike,
    AddOutcome,
    AddResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    add_outcome,
    add_response,
)

# (a module constant: each ``Status.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_OK = Status.OK

__all__ = ["AddPending", "Conn", "FuturePending", "NetConfig", "Pending", "answer_future",
           "is_entry_read", "is_fence", "is_recovery_read", "observed"]


@dataclass
class NetConfig:
    """Knobs of the simulated network (probabilities are per message)."""

    latency_min: float = 0.0005
    latency_mean: float = 0.002  # mean of the exponential part added to latency_min
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    reset: float = 0.0
    #: Used when a caller passes ``timeout=None``: a dropped message must still end somehow.
    default_timeout: float = 10.0
    #: The chance that a client endpoint is an old client, which sends each entry of a
    #: writer's batch as a single add (the bookie must serve both; drawn per endpoint).
    single_add_clients: float = 0.25
    #: Carry every message as bytes through the production codec (:mod:`pybk.sim.wire`);
    #: off, message objects are handed over as they are (what the simulator did before)
    wire: bool = True

    def quiet(self) -> NetConfig:
        """The same latencies without any message faults (the heal phase)."""
        return NetConfig(self.latency_min, self.latency_mean, default_timeout=self.default_timeout,
                         single_add_clients=self.single_add_clients, wire=self.wire)


class Pending:
    """A request on its way: settled once, by its answer, a reset or its deadline."""

    __slots__ = ("token",)
    token: int

    def on_answer(self, answer: object) -> None:
        raise NotImplementedError

    def on_fail(self, exc: BKError) -> None:
        raise NotImplementedError


class FuturePending(Pending):
    """A request whose caller waits on a future (``SimNetwork.send``)."""

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[Response]) -> None:
        self.fut = fut
        self.token = 0

    def on_answer(self, answer: object) -> None:
        fut = self.fut
        if not fut.done():
            fut.set_result(answer)  # type: ignore[arg-type]

    def on_fail(self, exc: BKError) -> None:
        fut = self.fut
        if not fut.done():
            fut.set_exception(exc)


class AddPending(Pending):
    """An add whose caller hears the outcome through its callback (``SimNetwork.add``)."""

    __slots__ = ("count", "on_done")

    def __init__(self, request: AddLike, on_done: AddCallback) -> None:
        self.count = len(request.bodies) if type(request) is AddBatchRequest else 1
        self.on_done = on_done
        self.token = 0

    def on_answer(self, outcome: object) -> None:
        if isinstance(outcome, AddResponse | AddBatchResponse):  # a plain handler's answer
            outcome = add_outcome(outcome, self.count)
        settle_add(self.on_done, outcome)  # type: ignore[arg-type]

    def on_fail(self, exc: BKError) -> None:
        settle_add(self.on_done, exc)


class Conn:
    """One (client, bookie) connection: a generation number and the requests pending on it."""

    __slots__ = ("gen", "last_arrival_back", "last_arrival_fwd", "pending")

    def __init__(self) -> None:
        self.gen = 0
        self.pending: dict[int, Pending] = {}
        self.last_arrival_fwd = 0.0
        self.last_arrival_back = 0.0


def observed(request: Request, response: Response) -> list[tuple[Request, Response]]:
    """What observers see of one answered request: a batched read entry by entry, as the
    single reads it stands for (the checker's bookie-honesty invariants judge each)."""
    if not isinstance(request, ReadBatchRequest):
        return [(request, response)]
    lid = request.ledger_id
    if not isinstance(response, ReadBatchResponse) or response.status != _OK:
        return [(ReadRequest(lid, e), ReadResponse(response.status, lid, e))
                for e in request.entry_ids]
    return [(ReadRequest(lid, e), ReadResponse(status, lid, e, body, response.lac))
            for e, status, body in response.entries]


def is_fence(request: Request) -> bool:
    from pybk.wire import FenceRequest, ReadRequest

    return isinstance(request, FenceRequest) or (
        isinstance(request, ReadRequest) and request.fence)


def is_entry_read(request: Request) -> bool:
    """A plain read of entries (not fencing, not a LAC read or long poll)."""
    from pybk.wire import LAST_ENTRY

    return isinstance(request, ReadBatchRequest) or (
        isinstance(request, ReadRequest) and not request.fence
        and request.previous_lac is None and request.entry_id != LAST_ENTRY)


def is_recovery_read(request: Request) -> bool:
    from pybk.wire import LAST_ENTRY

    return (isinstance(request, ReadRequest) and request.fence
            and request.entry_id != LAST_ENTRY)


def answer_future(fut: asyncio.Future[Response], request: AddLike, outcome: AddOutcome) -> None:
    """Settle a ``send`` of an add: unreachable and timed out are exceptions, like for any
    request; what the bookie said is its response."""
    if fut.done():
        return
    if isinstance(outcome, BookieUnavailableError | BKTimeoutError):
        fut.set_exception(outcome)
    else:
        fut.set_result(add_response(request, outcome))
