"""The pybk wire format's messages: how each request and response is laid out, sans-IO.

Pure functions from messages to frame bytes and from frame bytes to messages (the framing
state machine that cuts a byte stream into frames is :class:`pybk.transport.codec.Connection`).
The format is documented in ``docs/protocol.md``; in short, every frame is (listed in
docs/internals.md, "pybk/transport/messages.py"). The frame header, flags, caps and body
primitives are :mod:`.wireformat`; the write path's messages (ADD, ADD_BATCH) take the
one-pass forms of :mod:`.fastpath`. Their public names are importable from here too.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from pybk.errors import ProtocolError
from pybk.transport.bodies import encode_request_body, encode_response_body
from pybk.transport.errorreplies import error_response_for_op
from pybk.transport.fastpath import (
    decode_add_request,
    decode_add_response,
    decode_batch_request,
    encode_add_request,
    encode_add_response,
    encode_batch_request,
)
from pybk.transport.wireformat import (
    ALLOWED_FLAGS,
    BODY_OFFSET,
    DEFAULT_MAX_FRAME,
    FLAG_DEFERRED_SYNC,
    FLAG_FENCE,
    FLAG_LONG_POLL,
    FLAG_RECOVERY,
    FLAG_RESPONSE,
    FLAG_VERSIONS,
    HEADER,
    HEADER_SIZE,
    MAX_BATCH_ENTRIES,
    MAX_MESSAGE,
    MAX_TIMEOUT,
    MIN_FRAME,
    OPS_OF_VERSION,
    PRE_AUTH_MAX_FRAME,
    PREFIX,
    PREFIX_SIZE,
    PROTOCOL_VERSION,
    STATUS_BY_CODE,
    BodyReader,
    BodyWriter,
    frame_version,
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
    Op,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    Status,
    WriteLacRequest,
    WriteLacResponse,
)
from pybk.wire.fastinit import fast_init

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FLAG_DEFERRED_SYNC",
    "FLAG_FENCE",
    "FLAG_LONG_POLL",
    "FLAG_RECOVERY",
    "FLAG_RESPONSE",
    "FLAG_VERSIONS",
    "HEADER_SIZE",
    "MAX_BATCH_ENTRIES",
    "MAX_MESSAGE",
    "MAX_TIMEOUT",
    "MIN_FRAME",
    "PREFIX_SIZE",
    "PRE_AUTH_MAX_FRAME",
    "PROTOCOL_VERSION",
    "Event",
    "MessageRejected",
    "RequestReceived",
    "ResponseReceived",
    "decode_frame",
    "encode_request",
    "encode_response",
    "error_response_for_op",
    "frame_version",
]

_QQ = struct.Struct(">qq")
_QQQ = struct.Struct(">qqq")
_B = struct.Struct(">B")
_D = struct.Struct(">d")
_I = struct.Struct(">I")
_II = struct.Struct(">II")
_QH = struct.Struct(">qH")
_HI = struct.Struct(">HI")

# the operations as module constants: in CPython 3.11 each ``Op.X`` is a few hundred ns (the
# enum metaclass's ``__getattr__`` takes every class attribute off the fast path)
_ADD: Final = Op.ADD
_ADD_BATCH: Final = Op.ADD_BATCH
_READ: Final = Op.READ
_READ_BATCH: Final = Op.READ_BATCH
_READ_LAC: Final = Op.READ_LAC
_WRITE_LAC: Final = Op.WRITE_LAC
_FENCE: Final = Op.FENCE
_FORCE: Final = Op.FORCE
_LIST_ENTRIES: Final = Op.LIST_ENTRIES
_BOOKIE_INFO: Final = Op.BOOKIE_INFO

#: each operation's frame version, by code (frame_version without the enum call)
_VERSION_OF_OP: Final = {int(op): frame_version(op) for op in Op}
#: (version, operation code) -> the operation, for each operation that version may carry
_OP_OF_VERSION: Final = {(version, int(op)): op
                         for version, ops in OPS_OF_VERSION.items() for op in ops}


# --------------------------------------------------------------------------- events


@fast_init
@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A complete, valid request (server side)."""

    request_id: int
    request: Request


@fast_init
@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A complete, valid response (client side)."""

    request_id: int
    response: Response


@fast_init
@dataclass(frozen=True, slots=True)
class MessageRejected:
    """A frame with intact framing (length, CRC, version, known op) whose body did not parse.

    The connection can go on; a server answers with :func:`error_response_for_op`.
    """

    request_id: int
    op: Op
    error: ProtocolError


Event = RequestReceived | ResponseReceived | MessageRejected

# --------------------------------------------------------------------------- encoding


# the generic body encoders (pybk.transport.bodies), under the names the tests know them by
_encode_request_body = encode_request_body
_encode_response_body = encode_response_body


def _frame(op: int, flags: int, request_id: int, parts: list[bytes]) -> bytes:
    header = HEADER.pack(_VERSION_OF_OP[op], op, flags, request_id)
    crc32 = crc32c.crc32c
    crc = crc32(header)
    length = 4 + HEADER_SIZE
    for part in parts:
        crc = crc32(part, crc)
        length += len(part)
    if length > 0xFFFFFFFF:
        raise ValueError(f"message of {length} bytes is too large for one frame")
    return b"".join([PREFIX.pack(length, crc), header, *parts])


def encode_request(request_id: int, request: Request) -> bytes:
    """One frame carrying ``request``. ValueError/TypeError if it cannot be encoded."""
    kind = type(request)
    try:
        if kind is AddRequest:
            return encode_add_request(request_id, request)  # type: ignore[arg-type]
        if kind is AddBatchRequest:
            return encode_batch_request(request_id, request)  # type: ignore[arg-type]
        w = BodyWriter()
        flags = _encode_request_body(request, w)
        return _frame(int(request.op), flags, request_id, w.parts)
    except struct.error as exc:
        raise ValueError(f"cannot encode {request!r}: {exc}") from exc


def encode_response(request_id: int, response: Response) -> bytes:
    """One frame carrying ``response`` to request ``request_id``."""
    try:
        if type(response) is AddResponse:
            return encode_add_response(request_id, response)
        w = BodyWriter()
        flags = _encode_response_body(response, w)
        return _frame(int(response.op), flags, request_id, w.parts)
    except struct.error as exc:
        raise ValueError(f"cannot encode {response!r}: {exc}") from exc


# --------------------------------------------------------------------------- decoding


def _decode_request(op: Op, flags: int, r: BodyReader) -> Request:
    if op is _ADD:
        ledger_id, entry_id = r.take(_QQ)
        key = r.required_blob("master key")
        body = r.required_blob("entry body")
        r.done()
        return AddRequest(ledger_id, entry_id, key, body, bool(flags & FLAG_RECOVERY),
                          bool(flags & FLAG_DEFERRED_SYNC))
    if op is _ADD_BATCH:
        ledger_id = r.i64()
        key = r.required_blob("master key")
        (count,) = r.take(_I)
        if not 1 <= count <= MAX_BATCH_ENTRIES or count * 12 > r.left():
            raise ProtocolError(f"batch of {count} entries: 1 to {MAX_BATCH_ENTRIES}, "
                                f"each at least 12 bytes of the {r.left()} left")
        ids: list[int] = []
        bodies: list[bytes] = []
        for _ in range(count):
            ids.append(r.i64())
            bodies.append(r.required_blob("entry body"))
        r.done()
        return AddBatchRequest(ledger_id, key, ids, bodies, bool(flags & FLAG_RECOVERY),
                               bool(flags & FLAG_DEFERRED_SYNC))
    if op is _READ:
        ledger_id, entry_id, prev = r.take(_QQQ)
        (timeout,) = r.take(_D)
        if not math.isfinite(timeout) or timeout < 0 or timeout > MAX_TIMEOUT:
            raise ProtocolError(f"read timeout {timeout} out of range")
        key = r.required_blob("master key")
        r.done()
        long_poll = bool(flags & FLAG_LONG_POLL)
        if not long_poll and prev != -1:
            raise ProtocolError("previous LAC set without the long-poll flag")
        return ReadRequest(
            ledger_id,
            entry_id,
            fence=bool(flags & FLAG_FENCE),
            master_key=key,
            previous_lac=prev if long_poll else None,
            timeout=timeout,
        )
    if op is _READ_LAC or op is _LIST_ENTRIES:
        ledger_id = r.i64()
        r.done()
        return ReadLacRequest(ledger_id) if op is _READ_LAC else ListEntriesRequest(ledger_id)
    if op is _READ_BATCH:
        ledger_id = r.i64()
        (count,) = r.take(_I)
        if not 1 <= count <= MAX_BATCH_ENTRIES or count * 8 != r.left():
            raise ProtocolError(f"read batch of {count} entries (1 to {MAX_BATCH_ENTRIES}) "
                                f"in {r.left()} bytes")
        ids = list(r.take(struct.Struct(f">{count}q")))
        r.done()
        return ReadBatchRequest(ledger_id, ids)
    if op is _WRITE_LAC:
        ledger_id, lac = r.take(_QQ)
        key = r.required_blob("master key")
        body = r.required_blob("LAC body")
        r.done()
        return WriteLacRequest(ledger_id, lac, key, body)
    if op is _FENCE or op is _FORCE:
        ledger_id = r.i64()
        key = r.required_blob("master key")
        r.done()
        return (FenceRequest if op is _FENCE else ForceRequest)(ledger_id, key)
    if op is _BOOKIE_INFO:
        r.done()
        return BookieInfoRequest(versions=bool(flags & FLAG_VERSIONS))
    token = r.required_blob("auth token")
    r.done()
    return AuthRequest(token)


def _decode_response(op: Op, r: BodyReader, flags: int = FLAG_RESPONSE) -> Response:
    pos = r.pos
    code, mlen = _HI.unpack_from(r.data, pos) if r.end - pos >= 6 else (0, -1)
    if mlen == 0:  # (the common case: an empty message)
        status = STATUS_BY_CODE.get(code)
        if status is None:
            raise ProtocolError(f"unknown status code {code}")
        r.pos = pos + 6
        message = ""
    else:
        status = r.status()
        message = r.text("message")
    if op is _ADD:
        ledger_id, entry_id = r.take(_QQ)
        r.done()
        return AddResponse(status, ledger_id, entry_id, message)
    if op is _ADD_BATCH:
        ledger_id = r.i64()
        count, n = r.take(_II)
        if n not in (0, count) or 2 * n != r.left():
            raise ProtocolError(f"a batch answer of {count} entries carries {n} statuses in "
                                f"{r.left()} bytes")
        statuses = tuple(_status(code) for code in r.take(struct.Struct(f">{n}H"))) if n else ()
        r.done()
        return AddBatchResponse(status, ledger_id, count, statuses, message)
    if op is _READ:
        ledger_id, entry_id, lac = r.take(_QQQ)
        body = r.blob()
        r.done()
        return ReadResponse(status, ledger_id, entry_id, body, lac, message)
    if op is _READ_BATCH:
        ledger_id, lac = r.take(_QQ)
        (count,) = r.take(_I)
        if count * 14 > r.left():
            raise ProtocolError(f"{count} entries cannot fit the {r.left()} bytes left")
        entries = []
        for _ in range(count):
            entry_id, code = r.take(_QH)
            entries.append((entry_id, _status(code), r.blob()))
        r.done()
        return ReadBatchResponse(status, ledger_id, lac, tuple(entries), message)
    if op is _READ_LAC:
        ledger_id = r.i64()
        lac_body = r.blob()
        last = r.blob()
        r.done()
        return ReadLacResponse(status, ledger_id, lac_body, last, message)
    if op is _WRITE_LAC:
        ledger_id = r.i64()
        r.done()
        return WriteLacResponse(status, ledger_id, message)
    if op is _FENCE or op is _FORCE:
        ledger_id, lac = r.take(_QQ)
        r.done()
        return (FenceResponse if op is _FENCE else ForceResponse)(status, ledger_id, lac, message)
    if op is _LIST_ENTRIES:
        ledger_id = r.i64()
        (count,) = r.take(_I)
        if count * _QQ.size != r.left():
            raise ProtocolError(f"range count {count} does not match the {r.left()} bytes left")
        ranges: list[tuple[int, int]] = []
        for _ in range(count):
            first, last = r.take(_QQ)
            if first > last:
                raise ProtocolError(f"entry range ({first}, {last}) is inverted")
            ranges.append((first, last))
        r.done()
        return ListEntriesResponse(status, ledger_id, tuple(ranges), message)
    if op is _BOOKIE_INFO:
        bookie_id = r.text("bookie id")
        free, total = r.take(_QQ)
        state = r.text("state")
        version = 0
        if flags & FLAG_VERSIONS:
            (version,) = r.take(_B)
            if version < 1:
                raise ProtocolError(f"protocol version {version} is not a version")
        r.done()
        return BookieInfoResponse(status, bookie_id, free, total, state, message, version)
    r.done()
    return AuthResponse(status, message)


def _status(code: int) -> Status:
    status = STATUS_BY_CODE.get(code)
    if status is None:
        raise ProtocolError(f"unknown status code {code}")
    return status


# --------------------------------------------------------------------------- one frame


def decode_frame(frame: bytes | memoryview, role: str, lazy_batches: bool = False) -> Event:
    """Decode one whole frame (``frame`` = crc + header + body, the length field already
    stripped) as received by ``role`` ("client": responses, "server": requests).

    Raises :class:`ProtocolError` when the framing is damaged (CRC, version, operation,
    direction: fatal to the connection); a body that does not parse is a
    :class:`MessageRejected` event (the connection can go on). Nothing returned or raised
    keeps a view of ``frame`` (a connection's buffer is resized once the frame is done).
    ``lazy_batches``: a large ADD_BATCH's entry table is walked later, by its receiver
    (:mod:`.batchbodies`)."""
    (crc,) = _I.unpack_from(frame, 0)
    if crc32c.crc32c(frame[4:]) != crc:
        raise ProtocolError("frame CRC mismatch")
    version, op_code, flags, request_id = HEADER.unpack_from(frame, 4)
    op = _OP_OF_VERSION.get((version, op_code))
    if op is None:
        if version not in OPS_OF_VERSION:
            raise ProtocolError(f"unknown protocol version {version}")
        raise ProtocolError(f"unknown operation {op_code} in protocol version {version}")
    is_response = bool(flags & FLAG_RESPONSE)
    if is_response != (role == "client"):
        kind = "response" if is_response else "request"
        raise ProtocolError(f"unexpected {kind} frame on the {role} side")
    try:
        if is_response:
            if flags & ~FLAG_RESPONSE & ~ALLOWED_FLAGS.get(op, 0) or (
                    flags != FLAG_RESPONSE and op is not _BOOKIE_INFO):
                raise ProtocolError(f"unknown response flags {flags:#06x}")
            if op is _ADD:
                return ResponseReceived(request_id, decode_add_response(frame))
            # read in place: what the reader returns is copied out (no view of the buffer)
            body = BodyReader(frame, BODY_OFFSET)
            return ResponseReceived(request_id, _decode_response(op, body, flags))
        if flags & ~ALLOWED_FLAGS.get(op, 0):
            raise ProtocolError(f"unknown flags {flags:#06x} for {op.name}")
        if op is _ADD:
            return RequestReceived(request_id, decode_add_request(frame, flags))
        if op is _ADD_BATCH:
            return RequestReceived(request_id, decode_batch_request(frame, flags, lazy_batches))
        body = BodyReader(frame, BODY_OFFSET)
        return RequestReceived(request_id, _decode_request(op, flags, body))
    except ProtocolError as exc:
        return MessageRejected(request_id, op, exc)
