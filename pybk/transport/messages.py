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
from pybk.transport.errorreplies import error_response_for_op
from pybk.transport.fastpath import (
    add_flags,
    check_batch,
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

_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")
_QQQ = struct.Struct(">qqq")
_B = struct.Struct(">B")
_H = struct.Struct(">H")
_D = struct.Struct(">d")
_I = struct.Struct(">I")
_II = struct.Struct(">II")
_QH = struct.Struct(">qH")

_OPS: Final = {int(op): op for op in Op}


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """A complete, valid request (server side)."""

    request_id: int
    request: Request


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A complete, valid response (client side)."""

    request_id: int
    response: Response


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


def _encode_request_body(req: Request, w: BodyWriter) -> int:
    """Append the body of ``req`` to ``w``; return its flags."""
    if isinstance(req, AddRequest):
        w.raw(_QQ.pack(req.ledger_id, req.entry_id))
        w.blob(req.master_key)
        w.blob(req.body)
        return add_flags(req)
    if isinstance(req, AddBatchRequest):
        check_batch(req)
        w.raw(_Q.pack(req.ledger_id))
        w.blob(req.master_key)
        w.raw(_I.pack(len(req.bodies)))
        for entry_id, body in zip(req.entry_ids, req.bodies, strict=True):
            w.raw(_Q.pack(entry_id))
            w.blob(body)
        return add_flags(req)
    if isinstance(req, ReadRequest):
        if not math.isfinite(req.timeout) or req.timeout < 0 or req.timeout > MAX_TIMEOUT:
            raise ValueError(f"read timeout must be within [0, {MAX_TIMEOUT}], not {req.timeout}")
        flags = FLAG_FENCE if req.fence else 0
        prev = -1
        if req.previous_lac is not None:
            flags |= FLAG_LONG_POLL
            prev = req.previous_lac
        w.raw(_QQQ.pack(req.ledger_id, req.entry_id, prev))
        w.raw(_D.pack(req.timeout))
        w.blob(req.master_key)
        return flags
    if isinstance(req, ReadLacRequest | ListEntriesRequest):
        w.raw(_Q.pack(req.ledger_id))
        return 0
    if isinstance(req, ReadBatchRequest):
        n = len(req.entry_ids)
        if not 1 <= n <= MAX_BATCH_ENTRIES:
            raise ValueError(f"a READ_BATCH asks for 1 to {MAX_BATCH_ENTRIES} entries, not {n}")
        w.raw(_Q.pack(req.ledger_id))
        w.raw(_I.pack(n))
        w.raw(struct.pack(f">{n}q", *req.entry_ids))
        return 0
    if isinstance(req, WriteLacRequest):
        w.raw(_QQ.pack(req.ledger_id, req.lac))
        w.blob(req.master_key)
        w.blob(req.body)
        return 0
    if isinstance(req, FenceRequest | ForceRequest):
        w.raw(_Q.pack(req.ledger_id))
        w.blob(req.master_key)
        return 0
    if isinstance(req, BookieInfoRequest):
        return FLAG_VERSIONS if req.versions else 0
    if isinstance(req, AuthRequest):
        w.blob(req.token)
        return 0
    raise TypeError(f"not a pybk request: {req!r}")


def _encode_response_body(resp: Response, w: BodyWriter) -> int:
    """Append the body of ``resp`` to ``w``; return its flags."""
    w.raw(_H.pack(int(resp.status)))
    w.text(resp.message)
    flags = FLAG_RESPONSE
    if isinstance(resp, AddResponse):
        w.raw(_QQ.pack(resp.ledger_id, resp.entry_id))
    elif isinstance(resp, AddBatchResponse):
        if resp.statuses and len(resp.statuses) != resp.count:
            raise ValueError(f"{len(resp.statuses)} statuses for a batch of {resp.count}")
        w.raw(_Q.pack(resp.ledger_id))
        w.raw(_II.pack(resp.count, len(resp.statuses)))
        if resp.statuses:
            w.raw(struct.pack(f">{len(resp.statuses)}H", *resp.statuses))
    elif isinstance(resp, ReadResponse):
        w.raw(_QQQ.pack(resp.ledger_id, resp.entry_id, resp.lac))
        w.blob(resp.body)
    elif isinstance(resp, ReadBatchResponse):
        w.raw(_QQ.pack(resp.ledger_id, resp.lac))
        w.raw(_I.pack(len(resp.entries)))
        for entry_id, entry_status, body in resp.entries:
            w.raw(_QH.pack(entry_id, int(entry_status)))
            w.blob(body)
    elif isinstance(resp, ReadLacResponse):
        w.raw(_Q.pack(resp.ledger_id))
        w.blob(resp.lac_body)
        w.blob(resp.last_entry_body)
    elif isinstance(resp, WriteLacResponse):
        w.raw(_Q.pack(resp.ledger_id))
    elif isinstance(resp, FenceResponse | ForceResponse):
        w.raw(_QQ.pack(resp.ledger_id, resp.lac))
    elif isinstance(resp, ListEntriesResponse):
        w.raw(_Q.pack(resp.ledger_id))
        w.raw(_I.pack(len(resp.ranges)))
        for first, last in resp.ranges:
            w.raw(_QQ.pack(first, last))
    elif isinstance(resp, BookieInfoResponse):
        w.text(resp.bookie_id)
        w.raw(_QQ.pack(resp.free_bytes, resp.total_bytes))
        w.text(resp.state)
        if resp.protocol_version:  # asked for with FLAG_VERSIONS (never sent to old clients)
            w.raw(_B.pack(resp.protocol_version))
            flags |= FLAG_VERSIONS
    elif isinstance(resp, AuthResponse):
        pass
    else:
        raise TypeError(f"not a pybk response: {resp!r}")
    return flags


def _frame(op: int, flags: int, request_id: int, parts: list[bytes]) -> bytes:
    header = HEADER.pack(frame_version(Op(op)), op, flags, request_id)
    crc = crc32c.crc32c(header)
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    length = 4 + HEADER_SIZE + sum(len(p) for p in parts)
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
    if op is Op.ADD:
        ledger_id, entry_id = r.take(_QQ)
        key = r.required_blob("master key")
        body = r.required_blob("entry body")
        r.done()
        return AddRequest(ledger_id, entry_id, key, body, bool(flags & FLAG_RECOVERY),
                          bool(flags & FLAG_DEFERRED_SYNC))
    if op is Op.ADD_BATCH:
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
    if op is Op.READ:
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
    if op is Op.READ_LAC or op is Op.LIST_ENTRIES:
        ledger_id = r.i64()
        r.done()
        return ReadLacRequest(ledger_id) if op is Op.READ_LAC else ListEntriesRequest(ledger_id)
    if op is Op.READ_BATCH:
        ledger_id = r.i64()
        (count,) = r.take(_I)
        if not 1 <= count <= MAX_BATCH_ENTRIES or count * 8 != r.left():
            raise ProtocolError(f"read batch of {count} entries (1 to {MAX_BATCH_ENTRIES}) "
                                f"in {r.left()} bytes")
        ids = list(r.take(struct.Struct(f">{count}q")))
        r.done()
        return ReadBatchRequest(ledger_id, ids)
    if op is Op.WRITE_LAC:
        ledger_id, lac = r.take(_QQ)
        key = r.required_blob("master key")
        body = r.required_blob("LAC body")
        r.done()
        return WriteLacRequest(ledger_id, lac, key, body)
    if op is Op.FENCE or op is Op.FORCE:
        ledger_id = r.i64()
        key = r.required_blob("master key")
        r.done()
        return (FenceRequest if op is Op.FENCE else ForceRequest)(ledger_id, key)
    if op is Op.BOOKIE_INFO:
        r.done()
        return BookieInfoRequest(versions=bool(flags & FLAG_VERSIONS))
    token = r.required_blob("auth token")
    r.done()
    return AuthRequest(token)


def _decode_response(op: Op, r: BodyReader, flags: int = FLAG_RESPONSE) -> Response:
    status = r.status()
    message = r.text("message")
    if op is Op.ADD:
        ledger_id, entry_id = r.take(_QQ)
        r.done()
        return AddResponse(status, ledger_id, entry_id, message)
    if op is Op.ADD_BATCH:
        ledger_id = r.i64()
        count, n = r.take(_II)
        if n not in (0, count) or 2 * n != r.left():
            raise ProtocolError(f"a batch answer of {count} entries carries {n} statuses in "
                                f"{r.left()} bytes")
        statuses = tuple(_status(code) for code in r.take(struct.Struct(f">{n}H"))) if n else ()
        r.done()
        return AddBatchResponse(status, ledger_id, count, statuses, message)
    if op is Op.READ:
        ledger_id, entry_id, lac = r.take(_QQQ)
        body = r.blob()
        r.done()
        return ReadResponse(status, ledger_id, entry_id, body, lac, message)
    if op is Op.READ_BATCH:
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
    if op is Op.READ_LAC:
        ledger_id = r.i64()
        lac_body = r.blob()
        last = r.blob()
        r.done()
        return ReadLacResponse(status, ledger_id, lac_body, last, message)
    if op is Op.WRITE_LAC:
        ledger_id = r.i64()
        r.done()
        return WriteLacResponse(status, ledger_id, message)
    if op is Op.FENCE or op is Op.FORCE:
        ledger_id, lac = r.take(_QQ)
        r.done()
        return (FenceResponse if op is Op.FENCE else ForceResponse)(status, ledger_id, lac, message)
    if op is Op.LIST_ENTRIES:
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
    if op is Op.BOOKIE_INFO:
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
    ops = OPS_OF_VERSION.get(version)
    if ops is None:
        raise ProtocolError(f"unknown protocol version {version}")
    op = _OPS.get(op_code)
    if op is None or op not in ops:
        raise ProtocolError(f"unknown operation {op_code} in protocol version {version}")
    is_response = bool(flags & FLAG_RESPONSE)
    if is_response != (role == "client"):
        kind = "response" if is_response else "request"
        raise ProtocolError(f"unexpected {kind} frame on the {role} side")
    try:
        if is_response:
            if flags & ~FLAG_RESPONSE & ~ALLOWED_FLAGS.get(op, 0) or (
                    flags != FLAG_RESPONSE and op is not Op.BOOKIE_INFO):
                raise ProtocolError(f"unknown response flags {flags:#06x}")
            if op is Op.ADD:
                return ResponseReceived(request_id, decode_add_response(frame))
            body = BodyReader(memoryview(bytes(frame[BODY_OFFSET:])))  # (no view of the caller's
            return ResponseReceived(request_id, _decode_response(op, body, flags))  # buffer)
        if flags & ~ALLOWED_FLAGS.get(op, 0):
            raise ProtocolError(f"unknown flags {flags:#06x} for {op.name}")
        if op is Op.ADD:
            return RequestReceived(request_id, decode_add_request(frame, flags))
        if op is Op.ADD_BATCH:
            return RequestReceived(request_id, decode_batch_request(frame, flags, lazy_batches))
        body = BodyReader(memoryview(bytes(frame[BODY_OFFSET:])))
        return RequestReceived(request_id, _decode_request(op, flags, body))
    except ProtocolError as exc:
        return MessageRejected(request_id, op, exc)
