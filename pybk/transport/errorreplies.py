"""The error answer to a request whose body could not be read (only its operation is known)."""

from __future__ import annotations

from pybk.wire import (
    AddBatchResponse,
    AddResponse,
    AuthResponse,
    BookieInfoResponse,
    FenceResponse,
    ForceResponse,
    ListEntriesResponse,
    Op,
    ReadBatchResponse,
    ReadLacResponse,
    ReadResponse,
    Response,
    Status,
    WriteLacResponse,
)

__all__ = ["error_response_for_op"]


def error_response_for_op(op: Op, status: Status, message: str) -> Response:
    """A response of operation ``op``'s type carrying an error (ids unknown: zero)."""
    if op is Op.ADD:
        return AddResponse(status, 0, 0, message)
    if op is Op.ADD_BATCH:
        return AddBatchResponse(status, 0, 0, (), message)
    if op is Op.READ:
        return ReadResponse(status, 0, 0, message=message)
    if op is Op.READ_BATCH:
        return ReadBatchResponse(status, 0, message=message)
    if op is Op.READ_LAC:
        return ReadLacResponse(status, 0, message=message)
    if op is Op.WRITE_LAC:
        return WriteLacResponse(status, 0, message)
    if op is Op.FENCE:
        return FenceResponse(status, 0, message=message)
    if op is Op.FORCE:
        return ForceResponse(status, 0, message=message)
    if op is Op.LIST_ENTRIES:
        return ListEntriesResponse(status, 0, message=message)
    if op is Op.BOOKIE_INFO:
        return BookieInfoResponse(status, message=message)
    return AuthResponse(status, message)
