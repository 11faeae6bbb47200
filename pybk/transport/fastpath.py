"""The write path's messages in one pass each: ADD and ADD_BATCH requests, ADD responses.

These are the messages sent once per replica per entry (or per batch), so each is encoded
with one struct pack for the header and fixed fields, the CRC chained over the parts and one
join, and decoded straight from the frame without a :class:`~.wireformat.BodyReader`. They
give the same bytes and the same refusals as the generic tables of
:mod:`pybk.transport.messages` (tests/tcp/test_codec.py runs both on arbitrary input), which
dispatches to them.
"""

from __future__ import annotations

import struct

import crc32c

from pybk.errors import ProtocolError
from pybk.transport.batchbodies import LAZY_ENTRIES, BatchBodies, BatchIds
from pybk.transport.wireformat import (
    BODY_OFFSET,
    FLAG_DEFERRED_SYNC,
    FLAG_RECOVERY,
    FLAG_RESPONSE,
    MAX_BATCH_ENTRIES,
    MAX_MESSAGE,
    NONE_LEN,
    PREFIX,
    STATUS_BY_CODE,
    BodyWriter,
)
from pybk.wire import AddBatchRequest, AddRequest, AddResponse, Op

__all__ = [
    "add_flags",
    "check_batch",
    "decode_add_request",
    "decode_add_response",
    "decode_batch_request",
    "encode_add_request",
    "encode_add_response",
    "encode_batch_request",
]

_ADD_REQ_HEAD = struct.Struct(">BBHQqqI")  # header, ledger, entry, key length
_ADD_RESP_HEAD = struct.Struct(">BBHQHI")  # header, status, message length
_BATCH_REQ_HEAD = struct.Struct(">BBHQqI")  # header, ledger, key length
_QI = struct.Struct(">qI")  # one batch entry: id, body length
_QQI = struct.Struct(">qqI")
_HI = struct.Struct(">HI")
_QQ = struct.Struct(">qq")
_I = struct.Struct(">I")
# (module constants: each ``Op.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_ADD = Op.ADD
_ADD_BATCH = Op.ADD_BATCH


def add_flags(req: AddRequest | AddBatchRequest) -> int:
    """The flags of an add or a batch (recovery, deferred sync)."""
    return (FLAG_RECOVERY if req.recovery else 0) | (
        FLAG_DEFERRED_SYNC if req.deferred_sync else 0)


def check_batch(req: AddBatchRequest) -> None:
    """ValueError unless ``req`` carries 1 to MAX_BATCH_ENTRIES entries, each with an id."""
    n = len(req.bodies)
    if not 1 <= n <= MAX_BATCH_ENTRIES or len(req.entry_ids) != n:
        raise ValueError(f"an ADD_BATCH carries 1 to {MAX_BATCH_ENTRIES} entries, each with "
                         f"an id: {len(req.entry_ids)} ids, {n} bodies")


def encode_add_request(request_id: int, req: AddRequest) -> bytes:
    """The frame of an ADD request (version 1)."""
    key, body = req.master_key, req.body
    head = _ADD_REQ_HEAD.pack(
        1,
        _ADD,
        add_flags(req),
        request_id,
        req.ledger_id,
        req.entry_id,
        len(key),
    )
    mid = _I.pack(len(body))
    crc = crc32c.crc32c(body, crc32c.crc32c(mid, crc32c.crc32c(key, crc32c.crc32c(head))))
    length = 4 + len(head) + len(key) + 4 + len(body)
    return b"".join((PREFIX.pack(length, crc), head, key, mid, body))


def encode_batch_request(request_id: int, req: AddBatchRequest) -> bytes:
    """ADD_BATCH: the bodies are referenced, not copied, until the one join of the frame."""
    check_batch(req)
    key = req.master_key
    parts: list[bytes] = [b"", _BATCH_REQ_HEAD.pack(
        2, _ADD_BATCH, add_flags(req), request_id, req.ledger_id,
        len(key)), key, _I.pack(len(req.bodies))]
    crc32 = crc32c.crc32c
    crc = crc32(parts[3], crc32(key, crc32(parts[1])))
    length = 4 + _BATCH_REQ_HEAD.size + len(key) + 4
    pack = _QI.pack
    append = parts.append
    for entry_id, body in zip(req.entry_ids, req.bodies, strict=True):
        mid = pack(entry_id, len(body))
        crc = crc32(body, crc32(mid, crc))
        append(mid)
        append(body)
        length += 12 + len(body)
    parts[0] = PREFIX.pack(length, crc)
    return b"".join(parts)


def encode_add_response(request_id: int, resp: AddResponse) -> bytes:
    """The frame of an ADD response."""
    msg = resp.message.encode("utf-8") if resp.message else b""
    if len(msg) > MAX_MESSAGE:
        w = BodyWriter()
        w.text(resp.message)
        msg = w.parts[-1]
    head = _ADD_RESP_HEAD.pack(1, _ADD, FLAG_RESPONSE, request_id, int(resp.status), len(msg))
    tail = _QQ.pack(resp.ledger_id, resp.entry_id)
    crc = crc32c.crc32c(tail, crc32c.crc32c(msg, crc32c.crc32c(head)))
    return b"".join((PREFIX.pack(4 + len(head) + len(msg) + 16, crc), head, msg, tail))



def decode_add_request(f: bytes | memoryview, flags: int) -> AddRequest:
    """ADD request body, decoded straight from the frame (``f`` = crc + header + body)."""
    n, p = len(f), BODY_OFFSET
    if n - p < _QQI.size:
        raise ProtocolError(f"body truncated: need {_QQI.size} bytes, {n - p} left")
    ledger_id, entry_id, klen = _QQI.unpack_from(f, p)
    p += _QQI.size
    if klen == NONE_LEN:
        raise ProtocolError("master key must be present")
    if klen > n - p:
        raise ProtocolError(f"byte string of {klen} bytes exceeds the {n - p} bytes left")
    key = bytes(f[p : p + klen])
    p += klen
    if n - p < 4:
        raise ProtocolError(f"body truncated: need 4 bytes, {n - p} left")
    (blen,) = _I.unpack_from(f, p)
    p += 4
    if blen == NONE_LEN:
        raise ProtocolError("entry body must be present")
    if blen > n - p:
        raise ProtocolError(f"byte string of {blen} bytes exceeds the {n - p} bytes left")
    if blen < n - p:
        raise ProtocolError(f"{n - p - blen} trailing bytes after the message body")
    return AddRequest(ledger_id, entry_id, key, bytes(f[p:]), bool(flags & FLAG_RECOVERY),
                      bool(flags & FLAG_DEFERRED_SYNC))


def decode_batch_request(f: bytes | memoryview, flags: int,
                         lazy: bool = False) -> AddBatchRequest:
    """ADD_BATCH request body, decoded straight from the frame (same refusals as the generic
    decoder of :mod:`.messages`): each body is copied out once, nothing else per entry.
    ``lazy``: a batch of more than :data:`~.batchbodies.LAZY_ENTRIES` entries keeps its
    entries in a copy of the frame, its table walked later (:class:`~.batchbodies.BatchBodies`;
    the header and the count are checked now)."""
    n, p = len(f), BODY_OFFSET
    if n - p < 12:
        raise ProtocolError(f"body truncated: need 12 bytes, {n - p} left")
    ledger_id, klen = _QI.unpack_from(f, p)
    p += 12
    if klen == NONE_LEN:
        raise ProtocolError("master key must be present")
    if klen > n - p:
        raise ProtocolError(f"byte string of {klen} bytes exceeds the {n - p} bytes left")
    key = bytes(f[p : p + klen])
    p += klen
    if n - p < 4:
        raise ProtocolError(f"body truncated: need 4 bytes, {n - p} left")
    (count,) = _I.unpack_from(f, p)
    p += 4
    if not 1 <= count <= MAX_BATCH_ENTRIES or count * 12 > n - p:
        raise ProtocolError(f"batch of {count} entries: 1 to {MAX_BATCH_ENTRIES}, "
                            f"each at least 12 bytes of the {n - p} left")
    if lazy and count > LAZY_ENTRIES:
        bodies_of = BatchBodies(bytes(f), p, count)
        return AddBatchRequest(ledger_id, key, BatchIds(bodies_of), bodies_of,
                               bool(flags & FLAG_RECOVERY), bool(flags & FLAG_DEFERRED_SYNC))
    ids: list[int] = []
    bodies: list[bytes] = []
    unpack = _QI.unpack_from
    for _ in range(count):
        if n - p < 12:
            raise ProtocolError(f"body truncated: need 12 bytes, {n - p} left")
        entry_id, blen = unpack(f, p)
        p += 12
        if blen == NONE_LEN:
            raise ProtocolError("entry body must be present")
        if blen > n - p:
            raise ProtocolError(f"byte string of {blen} bytes exceeds the {n - p} bytes left")
        ids.append(entry_id)
        bodies.append(bytes(f[p : p + blen]))
        p += blen
    if p != n:
        raise ProtocolError(f"{n - p} trailing bytes after the message body")
    return AddBatchRequest(ledger_id, key, ids, bodies, bool(flags & FLAG_RECOVERY),
                           bool(flags & FLAG_DEFERRED_SYNC))


def decode_add_response(f: bytes | memoryview) -> AddResponse:
    """ADD response body, decoded straight from the frame (``f`` = crc + header + body)."""
    n, p = len(f), BODY_OFFSET
    if n - p < _HI.size:
        raise ProtocolError(f"body truncated: need {_HI.size} bytes, {n - p} left")
    code, mlen = _HI.unpack_from(f, p)
    p += _HI.size
    status = STATUS_BY_CODE.get(code)
    if status is None:
        raise ProtocolError(f"unknown status code {code}")
    if mlen == NONE_LEN:
        raise ProtocolError("message must be present")
    if mlen > n - p:
        raise ProtocolError(f"byte string of {mlen} bytes exceeds the {n - p} bytes left")
    if mlen > MAX_MESSAGE:
        raise ProtocolError(f"string of {mlen} bytes exceeds its {MAX_MESSAGE}-byte cap")
    try:
        message = bytes(f[p : p + mlen]).decode("utf-8") if mlen else ""
    except UnicodeDecodeError as exc:
        raise ProtocolError("message is not valid UTF-8") from exc
    p += mlen
    if n - p < _QQ.size:
        raise ProtocolError(f"body truncated: need {_QQ.size} bytes, {n - p} left")
    if n - p > _QQ.size:
        raise ProtocolError(f"{n - p - _QQ.size} trailing bytes after the message body")
    ledger_id, entry_id = _QQ.unpack_from(f, p)
    return AddResponse(status, ledger_id, entry_id, message)
