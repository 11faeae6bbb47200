"""Small pieces of a bookie server's connection (:mod:`pybk.transport.server_connection`):
error classification, request sizes, the peer-closed probe, and the add reply objects."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Final, Protocol

from pybk.errors import ProtocolError, status_of
from pybk.transport import codec
from pybk.transport.limits import REQUEST_OVERHEAD
from pybk.wire import (
    AddBatchRequest,
    AddLike,
    AddOutcome,
    AddRequest,
    ReadBatchRequest,
    ReadRequest,
    Request,
    Response,
    add_response,
    error_response,
)

__all__ = ["GATED", "FastAddReply", "NowaitReply", "await_verdict", "classify_error",
           "event_size", "is_long_poll", "peer_closed", "request_entries"]

#: TCP_INFO's first byte is the socket's state; CLOSE-WAIT: the peer closed its side
_TCP_CLOSE_WAIT: Final = 8
_TCP_CLOSE: Final = 7
#: requests the tenancy gate is asked about (pybk.transport.fairness)
GATED: Final = (AddRequest, AddBatchRequest, ReadRequest, ReadBatchRequest)


class _Conn(Protocol):
    def fast_add_done(self, request_id: int, response: Response, cost: int,
                      entries: int = 1) -> None: ...


def classify_error(exc: ProtocolError) -> str:
    """A counter name for a fatal framing error."""
    text = str(exc)
    if "cap" in text:
        return "frame_too_large"
    if "CRC" in text:
        return "bad_crc"
    if "version" in text:
        return "bad_version"
    if "operation" in text:
        return "bad_operation"
    return "bad_frame"


def event_size(event: codec.Event) -> int:
    """Memory a decoded, queued request holds (for the read-ahead bound)."""
    if isinstance(event, codec.RequestReceived):
        body = getattr(event.request, "body", None)
        return REQUEST_OVERHEAD + (len(body) if isinstance(body, bytes) else 0)
    return REQUEST_OVERHEAD


def request_entries(request: Request) -> int:
    """Entries a request is counted as against the entry caps: an ADD_BATCH's entries, a
    READ_BATCH's ids, one for anything else (at least one: an empty batch still runs), none
    for a long poll (it only waits, bounded by ``max_long_polls``: a tailing reader's poll
    must not hold its connection's writes back for a minute)."""
    if isinstance(request, AddBatchRequest):
        return max(1, len(request.bodies))
    if isinstance(request, ReadBatchRequest):
        return max(1, len(request.entry_ids))
    return 0 if is_long_poll(request) else 1


def is_long_poll(request: Request) -> bool:
    """A READ that waits for the LAC to move (previous_lac set, timeout > 0)."""
    return isinstance(request, ReadRequest) and request.previous_lac is not None \
        and request.timeout > 0


def peer_closed(transport: asyncio.BaseTransport | None) -> bool:
    """Has the peer closed its side, though we are not reading (the kernel knows)?"""
    if transport is None:
        return False
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return False
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except (OSError, IndexError, TypeError):
        return False
    return state in (_TCP_CLOSE_WAIT, _TCP_CLOSE)


async def await_verdict(verdict: Any, request: Request) -> Response | None:
    """The tenancy gate's awaitable, as a coroutine a task can run; a failed check (the
    metadata store unreachable) is the request's error answer."""
    try:
        return await verdict  # type: ignore[no-any-return]
    except Exception as exc:
        return error_response(request, status_of(exc), str(exc))


class FastAddReply:
    """The ``on_done`` of one add on the bookie's add path: the outcome becomes the answer
    frame, and the bytes it held are given back (a slotted object, not a closure)."""

    __slots__ = ("conn", "cost", "entries", "request", "request_id")

    def __init__(self, conn: _Conn, request_id: int, request: AddLike, cost: int,
                 entries: int = 1) -> None:
        self.conn = conn
        self.request_id = request_id
        self.request = request
        self.cost = cost
        self.entries = entries

    def __call__(self, outcome: AddOutcome) -> None:
        self.conn.fast_add_done(self.request_id, add_response(self.request, outcome),
                                self.cost, self.entries)


class NowaitReply:
    """The reply callback of one add through an ``add_nowait`` (answers with a response)."""

    __slots__ = ("conn", "cost", "request_id")

    def __init__(self, conn: _Conn, request_id: int, cost: int) -> None:
        self.conn = conn
        self.request_id = request_id
        self.cost = cost

    def __call__(self, response: Response) -> None:
        self.conn.fast_add_done(self.request_id, response, self.cost)
