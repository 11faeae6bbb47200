"""The pybk wire format's messages: how each request and response is laid out, sans-IO.

Pure functions from messages to frame bytes and from frame bytes to messages (the framing
state machine that cuts a byte stream into frames is :class:`pybk.transport.codec.Connection`).
The format is documented in ``docs/protocol.md``; in short, every frame is (listed in
docs/internals.md, "pybk/transport/messages.py").
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any, Final

import crc32c

from pybk.errors import ProtocolError
from pybk.transport.errorreplies import error_response_for_op
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

#: The newest protocol version this code speaks. Version 2 adds ADD_BATCH (and the
#: BOOKIE_INFO flag that tells a client so), version 3 FORCE and the deferred-sync add flag; a
#: frame carries the lowest version that defines its operation, so everything a version-1 peer
#: knows still travels as version 1.
PROTOCOL_VERSION: Final = 3
#: the operations each frame version may carry
_OPS_OF_VERSION: Final = {
    1: frozenset(op for op in Op if op not in (Op.ADD_BATCH, Op.READ_BATCH, Op.FORCE)),
    2: frozenset(op for op in Op if op is not Op.FORCE), 3: frozenset(Op)}

#: Default cap on one frame (length field value), as BookKeeper's nettyMaxFrameSizeBytes.
DEFAULT_MAX_FRAME: Final = 5 * 1024 * 1024
#: Cap on frames before a connection has authenticated (only AUTH is allowed then).
PRE_AUTH_MAX_FRAME: Final = 4 * 1024

_PREFIX = struct.Struct(">II")  # length, crc32c
_HEADER = struct.Struct(">BBHQ")  # version, op, flags, request id
PREFIX_SIZE: Final = _PREFIX.size  # 8
HEADER_SIZE: Final = _HEADER.size  # 12
#: Smallest legal value of the length field (CRC + header, empty body).
MIN_FRAME: Final = 4 + HEADER_SIZE

# flags
FLAG_RESPONSE: Final = 0x8000
FLAG_RECOVERY: Final = 0x0001  # ADD: recovery add
FLAG_DEFERRED_SYNC: Final = 0x0002  # ADD: answer before the journal's fsync (version 3)
FLAG_FENCE: Final = 0x0001  # READ: fence first
FLAG_LONG_POLL: Final = 0x0002  # READ: previous_lac present
#: BOOKIE_INFO request: also tell your newest protocol version; on the response: it follows
FLAG_VERSIONS: Final = 0x0001
_ALLOWED_FLAGS: Final = {
    Op.ADD: FLAG_RECOVERY | FLAG_DEFERRED_SYNC,
    Op.ADD_BATCH: FLAG_RECOVERY | FLAG_DEFERRED_SYNC,
    Op.READ: FLAG_FENCE | FLAG_LONG_POLL,
    Op.BOOKIE_INFO: FLAG_VERSIONS,
}
#: the most entries one ADD_BATCH may carry (a count above it is refused before anything is
#: decoded: it bounds the per-entry objects a frame can make a bookie build)
MAX_BATCH_ENTRIES: Final = 65536

_NONE_LEN: Final = 0xFFFFFFFF  # length value meaning "absent" (optional bytes)
MAX_MESSAGE: Final = 64 * 1024  # cap on an error message / short string
MAX_TIMEOUT: Final = 24 * 3600.0  # long-poll timeouts beyond a day are refused

_Q = struct.Struct(">q")
_QQ = struct.Struct(">qq")
_QQQ = struct.Struct(">qqq")
_B = struct.Struct(">B")
_H = struct.Struct(">H")
_D = struct.Struct(">d")
_I = struct.Struct(">I")

_OPS: Final = {int(op): op for op in Op}
_STATUSES: Final = frozenset(int(s) for s in Status)
_STATUS_BY_CODE: Final = {int(s): s for s in Status}


# --------------------------------------------------------------------------- body writer


class _Writer:
    """Accumulates body parts; every int is range-checked by struct (ValueError if not)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def raw(self, data: bytes) -> None:
        self.parts.append(data)

    def blob(self, data: bytes | None) -> None:
        if data is None:
            self.parts.append(_I.pack(_NONE_LEN))
            return
        if len(data) >= _NONE_LEN:
            raise ValueError(f"byte string of {len(data)} bytes is too long to encode")
        self.parts.append(_I.pack(len(data)))
        self.parts.append(bytes(data))

    def text(self, value: str) -> None:
        data = value.encode("utf-8")
        if len(data) > MAX_MESSAGE:
            data = data[: MAX_MESSAGE - 3].decode("utf-8", "ignore").encode() + b"..."
        self.blob(data)


# --------------------------------------------------------------------------- body reader


class _Reader:
    """Reads a body strictly: every length is checked against the bytes left before use."""

    __slots__ = ("data", "pos")

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, st: struct.Struct) -> tuple[Any, ...]:
        if st.size > self.left():
            raise ProtocolError(f"body truncated: need {st.size} bytes, {self.left()} left")
        values = st.unpack_from(self.data, self.pos)
        self.pos += st.size
        return values

    def i64(self) -> int:
        return int(self.take(_Q)[0])

    def blob(self, limit: int | None = None) -> bytes | None:
        (n,) = self.take(_I)
        if n == _NONE_LEN:
            return None
        if n > self.left():
            raise ProtocolError(f"byte string of {n} bytes exceeds the {self.left()} bytes left")
        if limit is not None and n > limit:
            raise ProtocolError(f"string of {n} bytes exceeds its {limit}-byte cap")
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def required_blob(self, what: str, limit: int | None = None) -> bytes:
        data = self.blob(limit)
        if data is None:
            raise ProtocolError(f"{what} must be present")
        return data

    def text(self, what: str) -> str:
        data = self.required_blob(what, MAX_MESSAGE)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} is not valid UTF-8") from exc

    def status(self) -> Status:
        (code,) = self.take(_H)
        if code not in _STATUSES:
            raise ProtocolError(f"unknown status code {code}")
        return Status(code)

    def done(self) -> None:
        if self.left():
            raise ProtocolError(f"{self.left()} trailing bytes after the message body")


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


def frame_version(op: Op) -> int:
    """The version byte of a frame of ``op``: the first protocol version defining ``op``."""
    return 3 if op is Op.FORCE else 2 if op is Op.ADD_BATCH or op is Op.READ_BATCH else 1


def _encode_request_body(req: Request, w: _Writer) -> int:
    """Append the body of ``req`` to ``w``; return its flags."""
    if isinstance(req, AddRequest):
        w.raw(_QQ.pack(req.ledger_id, req.entry_id))
        w.blob(req.master_key)
        w.blob(req.body)
        return _add_flags(req)
    if isinstance(req, AddBatchRequest):
        _check_batch(req)
        w.raw(_Q.pack(req.ledger_id))
        w.blob(req.master_key)
        w.raw(_I.pack(len(req.bodies)))
        for entry_id, body in zip(req.entry_ids, req.bodies, strict=True):
            w.raw(_Q.pack(entry_id))
            w.blob(body)
        return _add_flags(req)
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


def _add_flags(req: AddRequest | AddBatchRequest) -> int:
    return (FLAG_RECOVERY if req.recovery else 0) | (
        FLAG_DEFERRED_SYNC if req.deferred_sync else 0)


def _check_batch(req: AddBatchRequest) -> None:
    n = len(req.bodies)
    if not 1 <= n <= MAX_BATCH_ENTRIES or len(req.entry_ids) != n:
        raise ValueError(f"an ADD_BATCH carries 1 to {MAX_BATCH_ENTRIES} entries, each with "
                         f"an id: {len(req.entry_ids)} ids, {n} bodies")


def _encode_response_body(resp: Response, w: _Writer) -> int:
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
    header = _HEADER.pack(frame_version(Op(op)), op, flags, request_id)
    crc = crc32c.crc32c(header)
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    length = 4 + HEADER_SIZE + sum(len(p) for p in parts)
    if length > 0xFFFFFFFF:
        raise ValueError(f"message of {length} bytes is too large for one frame")
    return b"".join([_PREFIX.pack(length, crc), header, *parts])


# Fast paths for the messages of the write path (one per replica per entry, or per batch):
# one struct pack for header + fixed fields, CRC chained over the parts, one join. Same bytes
# as the generic path (the round-trip tests run through both).
_ADD_REQ_HEAD = struct.Struct(">BBHQqqI")  # header, ledger, entry, key length
_ADD_RESP_HEAD = struct.Struct(">BBHQHI")  # header, status, message length
_BATCH_REQ_HEAD = struct.Struct(">BBHQqI")  # header, ledger, key length
_QI = struct.Struct(">qI")  # one batch entry: id, body length
_QQI = struct.Struct(">qqI")
_HI = struct.Struct(">HI")
_II = struct.Struct(">II")
_QII = struct.Struct(">qII")
_QH = struct.Struct(">qH")


def _encode_add_request(request_id: int, req: AddRequest) -> bytes:
    key, body = req.master_key, req.body
    head = _ADD_REQ_HEAD.pack(
        1,
        Op.ADD,
        _add_flags(req),
        request_id,
        req.ledger_id,
        req.entry_id,
        len(key),
    )
    mid = _I.pack(len(body))
    crc = crc32c.crc32c(body, crc32c.crc32c(mid, crc32c.crc32c(key, crc32c.crc32c(head))))
    length = 4 + len(head) + len(key) + 4 + len(body)
    return b"".join((_PREFIX.pack(length, crc), head, key, mid, body))


def _encode_batch_request(request_id: int, req: AddBatchRequest) -> bytes:
    """ADD_BATCH: the bodies are referenced, not copied, until the one join of the frame."""
    _check_batch(req)
    key = req.master_key
    parts: list[bytes] = [b"", _BATCH_REQ_HEAD.pack(
        2, Op.ADD_BATCH, _add_flags(req), request_id, req.ledger_id,
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
    parts[0] = _PREFIX.pack(length, crc)
    return b"".join(parts)


def _encode_add_response(request_id: int, resp: AddResponse) -> bytes:
    msg = resp.message.encode("utf-8") if resp.message else b""
    if len(msg) > MAX_MESSAGE:
        w = _Writer()
        w.text(resp.message)
        msg = w.parts[-1]
    head = _ADD_RESP_HEAD.pack(1, Op.ADD, FLAG_RESPONSE, request_id, int(resp.status), len(msg))
    tail = _QQ.pack(resp.ledger_id, resp.entry_id)
    crc = crc32c.crc32c(tail, crc32c.crc32c(msg, crc32c.crc32c(head)))
    return b"".join((_PREFIX.pack(4 + len(head) + len(msg) + 16, crc), head, msg, tail))


def encode_request(request_id: int, request: Request) -> bytes:
    """One frame carrying ``request``. ValueError/TypeError if it cannot be encoded."""
    kind = type(request)
    try:
        if kind is AddRequest:
            return _encode_add_request(request_id, request)  # type: ignore[arg-type]
        if kind is AddBatchRequest:
            return _encode_batch_request(request_id, request)  # type: ignore[arg-type]
        w = _Writer()
        flags = _encode_request_body(request, w)
        return _frame(int(request.op), flags, request_id, w.parts)
    except struct.error as exc:
        raise ValueError(f"cannot encode {request!r}: {exc}") from exc


def encode_response(request_id: int, response: Response) -> bytes:
    """One frame carrying ``response`` to request ``request_id``."""
    try:
        if type(response) is AddResponse:
            return _encode_add_response(request_id, response)
        w = _Writer()
        flags = _encode_response_body(response, w)
        return _frame(int(response.op), flags, request_id, w.parts)
    except struct.error as exc:
        raise ValueError(f"cannot encode {response!r}: {exc}") from exc


# --------------------------------------------------------------------------- decoding


def _decode_request(op: Op, flags: int, r: _Reader) -> Request:
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


def _decode_response(op: Op, r: _Reader, flags: int = FLAG_RESPONSE) -> Response:
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
    status = _STATUS_BY_CODE.get(code)
    if status is None:
        raise ProtocolError(f"unknown status code {code}")
    return status


_BODY = PREFIX_SIZE - 4 + HEADER_SIZE  # offset of the body in a frame without its length


def _fast_add_request(f: bytes | memoryview, flags: int) -> AddRequest:
    """ADD request body, decoded straight from the frame (``f`` = crc + header + body)."""
    n, p = len(f), _BODY
    if n - p < _QQI.size:
        raise ProtocolError(f"body truncated: need {_QQI.size} bytes, {n - p} left")
    ledger_id, entry_id, klen = _QQI.unpack_from(f, p)
    p += _QQI.size
    if klen == _NONE_LEN:
        raise ProtocolError("master key must be present")
    if klen > n - p:
        raise ProtocolError(f"byte string of {klen} bytes exceeds the {n - p} bytes left")
    key = bytes(f[p : p + klen])
    p += klen
    if n - p < 4:
        raise ProtocolError(f"body truncated: need 4 bytes, {n - p} left")
    (blen,) = _I.unpack_from(f, p)
    p += 4
    if blen == _NONE_LEN:
        raise ProtocolError("entry body must be present")
    if blen > n - p:
        raise ProtocolError(f"byte string of {blen} bytes exceeds the {n - p} bytes left")
    if blen < n - p:
        raise ProtocolError(f"{n - p - blen} trailing bytes after the message body")
    return AddRequest(ledger_id, entry_id, key, bytes(f[p:]), bool(flags & FLAG_RECOVERY),
                      bool(flags & FLAG_DEFERRED_SYNC))


def _fast_batch_request(f: bytes | memoryview, flags: int) -> AddBatchRequest:
    """ADD_BATCH request body, decoded straight from the frame (same refusals as
    :func:`_decode_request`): each body is copied out once, nothing else per entry."""
    n, p = len(f), _BODY
    if n - p < 12:
        raise ProtocolError(f"body truncated: need 12 bytes, {n - p} left")
    ledger_id, klen = _QI.unpack_from(f, p)
    p += 12
    if klen == _NONE_LEN:
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
    ids: list[int] = []
    bodies: list[bytes] = []
    unpack = _QI.unpack_from
    for _ in range(count):
        if n - p < 12:
            raise ProtocolError(f"body truncated: need 12 bytes, {n - p} left")
        entry_id, blen = unpack(f, p)
        p += 12
        if blen == _NONE_LEN:
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


def _fast_add_response(f: bytes | memoryview) -> AddResponse:
    n, p = len(f), _BODY
    if n - p < _HI.size:
        raise ProtocolError(f"body truncated: need {_HI.size} bytes, {n - p} left")
    code, mlen = _HI.unpack_from(f, p)
    p += _HI.size
    status = _STATUS_BY_CODE.get(code)
    if status is None:
        raise ProtocolError(f"unknown status code {code}")
    if mlen == _NONE_LEN:
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


# --------------------------------------------------------------------------- one frame


def decode_frame(frame: bytes | memoryview, role: str) -> Event:
    """Decode one whole frame (``frame`` = crc + header + body, the length field already
    stripped) as received by ``role`` ("client": responses, "server": requests).

    Raises :class:`ProtocolError` when the framing is damaged (CRC, version, operation,
    direction: fatal to the connection); a body that does not parse is a
    :class:`MessageRejected` event (the connection can go on). Nothing returned or raised
    keeps a view of ``frame`` (a connection's buffer is resized once the frame is done)."""
    (crc,) = _I.unpack_from(frame, 0)
    if crc32c.crc32c(frame[4:]) != crc:
        raise ProtocolError("frame CRC mismatch")
    version, op_code, flags, request_id = _HEADER.unpack_from(frame, 4)
    ops = _OPS_OF_VERSION.get(version)
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
            if flags & ~FLAG_RESPONSE & ~_ALLOWED_FLAGS.get(op, 0) or (
                    flags != FLAG_RESPONSE and op is not Op.BOOKIE_INFO):
                raise ProtocolError(f"unknown response flags {flags:#06x}")
            if op is Op.ADD:
                return ResponseReceived(request_id, _fast_add_response(frame))
            body = _Reader(memoryview(bytes(frame[_BODY:])))  # (no view of the caller's
            return ResponseReceived(request_id, _decode_response(op, body, flags))  # buffer)
        if flags & ~_ALLOWED_FLAGS.get(op, 0):
            raise ProtocolError(f"unknown flags {flags:#06x} for {op.name}")
        if op is Op.ADD:
            return RequestReceived(request_id, _fast_add_request(frame, flags))
        if op is Op.ADD_BATCH:
            return RequestReceived(request_id, _fast_batch_request(frame, flags))
        body = _Reader(memoryview(bytes(frame[_BODY:])))
        return RequestReceived(request_id, _decode_request(op, flags, body))
    except ProtocolError as exc:
        return MessageRejected(request_id, op, exc)
