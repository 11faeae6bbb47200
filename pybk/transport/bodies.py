"""The generic body encoders: each message type's body, written on a :class:`BodyWriter`.

:mod:`.messages` frames what these write (the write path's ADD and ADD_BATCH requests and ADD
responses take the one-pass forms of :mod:`.fastpath` instead; these give the same bytes).
Each type has its own encoder, found by the message's type in one dict lookup.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any, Final

from pybk.transport.fastpath import add_flags, check_batch
from pybk.transport.wireformat import (
    FLAG_FENCE,
    FLAG_LONG_POLL,
    FLAG_RESPONSE,
    FLAG_VERSIONS,
    MAX_BATCH_ENTRIES,
    MAX_TIMEOUT,
    BodyWriter,
)
from pybk.wire import (
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BookieInfoRequest,
    BookieInfoResponse,
    FenceRequest,
    FenceResponse,
    ForceRequest,
    ForceResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    WriteLacRequest,
    WriteLacResponse,
)

__all__ = ["encode_request_body", "encode_response_body"]

_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")
_QQQ = struct.Struct(">qqq")
_B = struct.Struct(">B")
_H = struct.Struct(">H")
_I = struct.Struct(">I")
_QH = struct.Struct(">qH")
_HI = struct.Struct(">HI")
_QI = struct.Struct(">qI")
_QII = struct.Struct(">qII")
_QQI = struct.Struct(">qqI")
_QQQD = struct.Struct(">qqqd")


def encode_request_body(req: Request, w: BodyWriter) -> int:
    """Append the body of ``req`` to ``w``; return its flags."""
    encode = _REQUEST_BODIES.get(type(req))
    if encode is None:
        for kind, fn in _REQUEST_BODIES.items():  # (a subclass of a request type)
            if isinstance(req, kind):
                encode = fn
                break
        else:
            raise TypeError(f"not a pybk request: {req!r}")
    return encode(req, w)


def _add_body(req: AddRequest, w: BodyWriter) -> int:
    w.raw(_QQ.pack(req.ledger_id, req.entry_id))
    w.blob(req.master_key)
    w.blob(req.body)
    return add_flags(req)


def _batch_body(req: AddBatchRequest, w: BodyWriter) -> int:
    check_batch(req)
    w.raw(_Q.pack(req.ledger_id))
    w.blob(req.master_key)
    w.raw(_I.pack(len(req.bodies)))
    for entry_id, body in zip(req.entry_ids, req.bodies, strict=True):
        w.raw(_Q.pack(entry_id))
        w.blob(body)
    return add_flags(req)


def _read_body(req: ReadRequest, w: BodyWriter) -> int:
    timeout = req.timeout
    if not math.isfinite(timeout) or timeout < 0 or timeout > MAX_TIMEOUT:
        raise ValueError(f"read timeout must be within [0, {MAX_TIMEOUT}], not {timeout}")
    flags = FLAG_FENCE if req.fence else 0
    prev = -1
    if req.previous_lac is not None:
        flags |= FLAG_LONG_POLL
        prev = req.previous_lac
    w.raw(_QQQD.pack(req.ledger_id, req.entry_id, prev, timeout))
    w.blob(req.master_key)
    return flags


def _ledger_body(req: ReadLacRequest | ListEntriesRequest, w: BodyWriter) -> int:
    w.raw(_Q.pack(req.ledger_id))
    return 0


def _read_batch_body(req: ReadBatchRequest, w: BodyWriter) -> int:
    n = len(req.entry_ids)
    if not 1 <= n <= MAX_BATCH_ENTRIES:
        raise ValueError(f"a READ_BATCH asks for 1 to {MAX_BATCH_ENTRIES} entries, not {n}")
    w.raw(_QI.pack(req.ledger_id, n))
    w.raw(struct.pack(f">{n}q", *req.entry_ids))
    return 0


def _write_lac_body(req: WriteLacRequest, w: BodyWriter) -> int:
    w.raw(_QQ.pack(req.ledger_id, req.lac))
    w.blob(req.master_key)
    w.blob(req.body)
    return 0


def _keyed_body(req: FenceRequest | ForceRequest, w: BodyWriter) -> int:
    w.raw(_Q.pack(req.ledger_id))
    w.blob(req.master_key)
    return 0


def _info_body(req: BookieInfoRequest, w: BodyWriter) -> int:
    return FLAG_VERSIONS if req.versions else 0


def _auth_body(req: AuthRequest, w: BodyWriter) -> int:
    w.blob(req.token)
    return 0


#: each request type's body encoder (appends to the writer, returns the frame's flags)
_REQUEST_BODIES: Final[dict[type, Callable[[Any, BodyWriter], int]]] = {
    AddRequest: _add_body, AddBatchRequest: _batch_body, ReadRequest: _read_body,
    ReadLacRequest: _ledger_body, ListEntriesRequest: _ledger_body,
    ReadBatchRequest: _read_batch_body, WriteLacRequest: _write_lac_body,
    FenceRequest: _keyed_body, ForceRequest: _keyed_body, BookieInfoRequest: _info_body,
    AuthRequest: _auth_body,
}


def encode_response_body(resp: Response, w: BodyWriter) -> int:
    """Append the body of ``resp`` to ``w``; return its flags."""
    encode = _RESPONSE_BODIES.get(type(resp))
    if encode is None:
        for kind, fn in _RESPONSE_BODIES.items():  # (a subclass of a response type)
            if isinstance(resp, kind):
                encode = fn
                break
        else:
            raise TypeError(f"not a pybk response: {resp!r}")
    message = resp.message
    if message == "":  # (the common case: the status and an empty message in one part)
        w.raw(_HI.pack(int(resp.status), 0))
    else:
        w.raw(_H.pack(int(resp.status)))
        w.text(message)
    return encode(resp, w)


def _add_answer(resp: AddResponse, w: BodyWriter) -> int:
    w.raw(_QQ.pack(resp.ledger_id, resp.entry_id))
    return FLAG_RESPONSE


def _batch_answer(resp: AddBatchResponse, w: BodyWriter) -> int:
    statuses = resp.statuses
    if statuses and len(statuses) != resp.count:
        raise ValueError(f"{len(statuses)} statuses for a batch of {resp.count}")
    w.raw(_QII.pack(resp.ledger_id, resp.count, len(statuses)))
    if statuses:
        w.raw(struct.pack(f">{len(statuses)}H", *statuses))
    return FLAG_RESPONSE


def _read_answer(resp: ReadResponse, w: BodyWriter) -> int:
    w.raw(_QQQ.pack(resp.ledger_id, resp.entry_id, resp.lac))
    w.blob(resp.body)
    return FLAG_RESPONSE


def _read_batch_answer(resp: ReadBatchResponse, w: BodyWriter) -> int:
    w.raw(_QQI.pack(resp.ledger_id, resp.lac, len(resp.entries)))
    for entry_id, entry_status, body in resp.entries:
        w.raw(_QH.pack(entry_id, int(entry_status)))
        w.blob(body)
    return FLAG_RESPONSE


def _read_lac_answer(resp: ReadLacResponse, w: BodyWriter) -> int:
    w.raw(_Q.pack(resp.ledger_id))
    w.blob(resp.lac_body)
    w.blob(resp.last_entry_body)
    return FLAG_RESPONSE


def _ledger_answer(resp: WriteLacResponse, w: BodyWriter) -> int:
    w.raw(_Q.pack(resp.ledger_id))
    return FLAG_RESPONSE


def _lac_answer(resp: FenceResponse | ForceResponse, w: BodyWriter) -> int:
    w.raw(_QQ.pack(resp.ledger_id, resp.lac))
    return FLAG_RESPONSE


def _list_answer(resp: ListEntriesResponse, w: BodyWriter) -> int:
    w.raw(_QI.pack(resp.ledger_id, len(resp.ranges)))
    for first, last in resp.ranges:
        w.raw(_QQ.pack(first, last))
    return FLAG_RESPONSE


def _info_answer(resp: BookieInfoResponse, w: BodyWriter) -> int:
    flags = FLAG_RESPONSE
    w.text(resp.bookie_id)
    w.raw(_QQ.pack(resp.free_bytes, resp.total_bytes))
    w.text(resp.state)
    if resp.protocol_version:  # asked for with FLAG_VERSIONS (never sent to old clients)
        w.raw(_B.pack(resp.protocol_version))
        flags |= FLAG_VERSIONS
    return flags


def _auth_answer(resp: AuthResponse, w: BodyWriter) -> int:
    return FLAG_RESPONSE


#: each response type's body encoder, after the status and message (returns the flags)
_RESPONSE_BODIES: Final[dict[type, Callable[[Any, BodyWriter], int]]] = {
    AddResponse: _add_answer, AddBatchResponse: _batch_answer, ReadResponse: _read_answer,
    ReadBatchResponse: _read_batch_answer, ReadLacResponse: _read_lac_answer,
    WriteLacResponse: _ledger_answer, FenceResponse: _lac_answer, ForceResponse: _lac_answer,
    ListEntriesResponse: _list_answer, BookieInfoResponse: _info_answer,
    AuthResponse: _auth_answer,
}
