"""A bookie's answers, and what an add's answer means to the client (its outcome)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pybk.errors import BKError, Status, error_for_status, status_of
from pybk.wire.fastinit import fast_init
from pybk.wire.requests import (
    AddBatchRequest,
    AddRequest,
    BookieInfoRequest,
    FenceRequest,
    ForceRequest,
    ListEntriesRequest,
    Op,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
)

# --------------------------------------------------------------------------- responses


# (a module constant: each ``Status.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_OK = Status.OK

@fast_init
@dataclass(frozen=True, slots=True)
class AddResponse:
    status: Status
    ledger_id: int
    entry_id: int
    message: str = ""
    op = Op.ADD


@fast_init
@dataclass(frozen=True, slots=True)
class ReadResponse:
    """``body`` is the stored framed entry (None when absent). ``lac`` is the bookie's LAC for
    the ledger (-1 when unknown); a long poll uses it to report progress without an entry."""

    status: Status
    ledger_id: int
    entry_id: int
    body: bytes | None = None
    lac: int = -1
    message: str = ""
    op = Op.READ


@fast_init
@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    status: Status
    ledger_id: int
    lac_body: bytes | None = None
    last_entry_body: bytes | None = None
    message: str = ""
    op = Op.READ_LAC


@fast_init
@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    status: Status
    ledger_id: int
    message: str = ""
    op = Op.WRITE_LAC


@fast_init
@dataclass(frozen=True, slots=True)
class FenceResponse:
    """``lac`` is the bookie's LAC for the ledger at fencing time."""

    status: Status
    ledger_id: int
    lac: int = -1
    message: str = ""
    op = Op.FENCE


@fast_init
@dataclass(frozen=True, slots=True)
class ForceResponse:
    """``lac``: the last entry of the ledger the bookie holds durably once forced (-1: none),
    so a writer sees a bookie that lost acknowledged entries (a restart) for what it is."""

    status: Status
    ledger_id: int
    lac: int = -1
    message: str = ""
    op = Op.FORCE


@fast_init
@dataclass(frozen=True, slots=True)
class ListEntriesResponse:
    """``ranges`` are inclusive (first, last) entry-id runs the bookie holds, ascending."""

    status: Status
    ledger_id: int
    ranges: tuple[tuple[int, int], ...] = ()
    message: str = ""
    op = Op.LIST_ENTRIES


class BookieState(enum.StrEnum):
    """What a bookie accepts: everything, reads and recovery adds only, or nothing.

    A ``StrEnum`` so the value travels as the plain string it always was (the registry, the
    wire's BookieInfo answer, logs) while code compares against named members. It lives
    here, with the messages that carry it, so a transport can read a bookie's state without
    importing the bookie package (``pybk.bookie`` re-exports it)."""

    WRITABLE = "writable"
    READ_ONLY = "read-only"
    STOPPED = "stopped"


@fast_init
@dataclass(frozen=True, slots=True)
class BookieInfoResponse:
    status: Status
    bookie_id: str = ""
    free_bytes: int = 0
    total_bytes: int = 0
    state: str = ""  # a BookieState value, or "" in an error answer
    message: str = ""
    #: the newest protocol version the bookie speaks, when the request asked (else 0)
    protocol_version: int = 0
    op = Op.BOOKIE_INFO


@fast_init
@dataclass(frozen=True, slots=True)
class AuthResponse:
    status: Status
    message: str = ""
    op = Op.AUTH


@fast_init
@dataclass(frozen=True, slots=True)
class AddBatchResponse:
    """The answer to an :class:`AddBatchRequest` of ``count`` entries. ``statuses`` is empty
    when every entry has ``status`` (OK: all stored), else one status per entry in request
    order; ``status`` is then the first non-OK one and ``message`` says why."""

    status: Status
    ledger_id: int
    count: int
    statuses: tuple[Status, ...] = ()
    message: str = ""
    op = Op.ADD_BATCH


@fast_init
@dataclass(frozen=True, slots=True)
class ReadBatchResponse:
    """The answer to a :class:`ReadBatchRequest`: ``entries`` holds ``(entry_id, status,
    body)`` for a prefix of the requested ids, in their order (body None unless OK).
    ``status`` is not OK only when the whole request failed (no such ledger, bookie stopped):
    ``entries`` is then empty. ``lac`` is the bookie's LAC for the ledger."""

    status: Status
    ledger_id: int
    lac: int = -1
    entries: tuple[tuple[int, Status, bytes | None], ...] = ()
    message: str = ""
    op = Op.READ_BATCH


Response = (
    AddResponse
    | AddBatchResponse
    | ReadBatchResponse
    | ReadResponse
    | ReadLacResponse
    | WriteLacResponse
    | FenceResponse
    | ForceResponse
    | ListEntriesResponse
    | BookieInfoResponse
    | AuthResponse
)


_new = object.__new__
_slots: Any = vars(AddResponse)  # the slot descriptors, set directly (frozen: no __setattr__)
_set_status = _slots["status"].__set__
_set_ledger = _slots["ledger_id"].__set__
_set_entry = _slots["entry_id"].__set__
_set_message = _slots["message"].__set__


def add_ok(ledger_id: int, entry_id: int) -> AddResponse:
    """``AddResponse(Status.OK, ledger_id, entry_id)``, built in about half the time of the
    frozen dataclass's ``__init__`` (one per replica per entry on the hot path)."""
    r: AddResponse = _new(AddResponse)
    _set_status(r, _OK)
    _set_ledger(r, ledger_id)
    _set_entry(r, entry_id)
    _set_message(r, "")
    return r


def error_response(request: Request, status: Status, message: str = "") -> Response:
    """A response of the right type for ``request`` carrying a non-OK ``status``."""
    if isinstance(request, AddRequest):
        return AddResponse(status, request.ledger_id, request.entry_id, message)
    if isinstance(request, AddBatchRequest):
        return AddBatchResponse(status, request.ledger_id, len(request.bodies), (), message)
    if isinstance(request, ReadBatchRequest):
        return ReadBatchResponse(status, request.ledger_id, message=message)
    if isinstance(request, ReadRequest):
        return ReadResponse(status, request.ledger_id, request.entry_id, message=message)
    if isinstance(request, ReadLacRequest):
        return ReadLacResponse(status, request.ledger_id, message=message)
    if isinstance(request, WriteLacRequest):
        return WriteLacResponse(status, request.ledger_id, message)
    if isinstance(request, FenceRequest):
        return FenceResponse(status, request.ledger_id, message=message)
    if isinstance(request, ForceRequest):
        return ForceResponse(status, request.ledger_id, message=message)
    if isinstance(request, ListEntriesRequest):
        return ListEntriesResponse(status, request.ledger_id, message=message)
    if isinstance(request, BookieInfoRequest):
        return BookieInfoResponse(status, message=message)
    return AuthResponse(status, message)


# --------------------------------------------------------------------------- add outcomes

#: What a bookie did with an add, in process (``Transport.add``, ``Bookie.add_request``):
#: None, every entry is durable there; a BKError, no entry was stored (the bookie refused,
#: or could not be reached: BookieUnavailableError, TimeoutError); a list, one outcome per
#: entry of an :class:`AddBatchRequest`, in its order (some stored, some not)
AddOutcome = BKError | None | list[BKError | None]
#: ``on_done(outcome)``: called exactly once per add request, quick, never raising
AddCallback = Callable[[AddOutcome], None]
AddLike = AddRequest | AddBatchRequest


def add_response(request: AddLike, outcome: AddOutcome) -> AddResponse | AddBatchResponse:
    """The response reporting ``outcome`` (what the TCP server sends; the simulator's
    observers see it too). Unexpected exceptions are mapped like any other (status_of)."""
    if type(request) is AddRequest:
        if outcome is None:
            return add_ok(request.ledger_id, request.entry_id)
        if isinstance(outcome, BaseException):
            return AddResponse(status_of(outcome), request.ledger_id, request.entry_id,
                               str(outcome))
        return add_response(request, outcome[0])
    assert isinstance(request, AddBatchRequest)
    n = len(request.bodies)
    if outcome is None:
        return AddBatchResponse(_OK, request.ledger_id, n)
    if isinstance(outcome, BaseException):
        return AddBatchResponse(status_of(outcome), request.ledger_id, n, (), str(outcome))
    first = next((e for e in outcome if e is not None), None)
    if first is None:
        return AddBatchResponse(_OK, request.ledger_id, n)
    if outcome.count(first) == len(outcome) == n:  # (one error shared by every entry)
        return AddBatchResponse(status_of(first), request.ledger_id, n, (), str(first))
    # refusals of one kind share an error: a status per distinct error, then C-level passes
    status: dict[BKError | None, Status] = {e: status_of(e) for e in set(outcome) if e}
    status[None] = _OK
    statuses = tuple(map(status.__getitem__, outcome))
    return AddBatchResponse(status_of(first), request.ledger_id, n, statuses, str(first))


def add_outcome(response: Response, count: int = 1) -> AddOutcome:
    """The outcome a response to an add of ``count`` entries reports (the inverse of
    :func:`add_response`; error classes from :func:`pybk.errors.error_for_status`)."""
    status = response.status
    if status == _OK:
        return None
    if isinstance(response, AddBatchResponse) and response.statuses:
        message = response.message
        return [None if s == _OK else error_for_status(s, message)
                for s in response.statuses]
    return error_for_status(status, response.message)


def outcome_of(outcome: AddOutcome, index: int) -> BKError | None:
    """Entry ``index``'s part of a batch's ``outcome``."""
    if outcome is None or isinstance(outcome, BaseException):
        return outcome
    return outcome[index]
