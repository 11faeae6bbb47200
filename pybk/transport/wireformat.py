"""The fixed parts of the pybk wire format: versions, frame header, flags, caps, body primitives.

Every message of :mod:`pybk.transport.messages` (and the write path's one-pass forms in
:mod:`pybk.transport.fastpath`) is built from these: the frame prefix and header, the flags
each operation may carry, the caps a decoder enforces, and :class:`BodyWriter` /
:class:`BodyReader`, which write a body and read one strictly (every length checked against the
bytes left before use). The format is documented in ``docs/protocol.md``.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from pybk.errors import ProtocolError
from pybk.wire import Op, Status

__all__ = [
    "ALLOWED_FLAGS",
    "BODY_OFFSET",
    "DEFAULT_MAX_FRAME",
    "FLAG_DEFERRED_SYNC",
    "FLAG_FENCE",
    "FLAG_LONG_POLL",
    "FLAG_RECOVERY",
    "FLAG_RESPONSE",
    "FLAG_VERSIONS",
    "HEADER",
    "HEADER_SIZE",
    "MAX_BATCH_ENTRIES",
    "MAX_MESSAGE",
    "MAX_TIMEOUT",
    "MIN_FRAME",
    "NONE_LEN",
    "OPS_OF_VERSION",
    "PREFIX",
    "PREFIX_SIZE",
    "PRE_AUTH_MAX_FRAME",
    "PROTOCOL_VERSION",
    "STATUS_BY_CODE",
    "BodyReader",
    "BodyWriter",
    "frame_version",
]

#: The newest protocol version this code speaks. Version 2 adds ADD_BATCH (and the
#: BOOKIE_INFO flag that tells a client so), version 3 FORCE and the deferred-sync add flag; a
#: frame carries the lowest version that defines its operation, so everything a version-1 peer
#: knows still travels as version 1.
PROTOCOL_VERSION: Final = 3
#: the operations each frame version may carry
OPS_OF_VERSION: Final = {
    1: frozenset(op for op in Op if op not in (Op.ADD_BATCH, Op.READ_BATCH, Op.FORCE)),
    2: frozenset(op for op in Op if op is not Op.FORCE), 3: frozenset(Op)}

#: Default cap on one frame (length field value), as BookKeeper's nettyMaxFrameSizeBytes.
DEFAULT_MAX_FRAME: Final = 5 * 1024 * 1024
#: Cap on frames before a connection has authenticated (only AUTH is allowed then).
PRE_AUTH_MAX_FRAME: Final = 4 * 1024

PREFIX = struct.Struct(">II")  # length, crc32c
HEADER = struct.Struct(">BBHQ")  # version, op, flags, request id
PREFIX_SIZE: Final = PREFIX.size  # 8
HEADER_SIZE: Final = HEADER.size  # 12
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
ALLOWED_FLAGS: Final = {
    Op.ADD: FLAG_RECOVERY | FLAG_DEFERRED_SYNC,
    Op.ADD_BATCH: FLAG_RECOVERY | FLAG_DEFERRED_SYNC,
    Op.READ: FLAG_FENCE | FLAG_LONG_POLL,
    Op.BOOKIE_INFO: FLAG_VERSIONS,
}
#: the most entries one ADD_BATCH may carry (a count above it is refused before anything is
#: decoded: it bounds the per-entry objects a frame can make a bookie build)
MAX_BATCH_ENTRIES: Final = 65536

NONE_LEN: Final = 0xFFFFFFFF  # length value meaning "absent" (optional bytes)
MAX_MESSAGE: Final = 64 * 1024  # cap on an error message / short string
MAX_TIMEOUT: Final = 24 * 3600.0  # long-poll timeouts beyond a day are refused

#: offset of the body in a frame without its length field (CRC + header before it)
BODY_OFFSET: Final = PREFIX_SIZE - 4 + HEADER_SIZE
STATUS_BY_CODE: Final = {int(s): s for s in Status}

_Q = struct.Struct(">q")
_H = struct.Struct(">H")
_I = struct.Struct(">I")


def frame_version(op: Op) -> int:
    """The version byte of a frame of ``op``: the first protocol version defining ``op``."""
    return 3 if op is Op.FORCE else 2 if op is Op.ADD_BATCH or op is Op.READ_BATCH else 1


# --------------------------------------------------------------------------- body writer


class BodyWriter:
    """Accumulates body parts; every int is range-checked by struct (ValueError if not)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def raw(self, data: bytes) -> None:
        self.parts.append(data)

    def blob(self, data: bytes | None) -> None:
        if data is None:
            self.parts.append(_I.pack(NONE_LEN))
            return
        if len(data) >= NONE_LEN:
            raise ValueError(f"byte string of {len(data)} bytes is too long to encode")
        self.parts.append(_I.pack(len(data)))
        self.parts.append(bytes(data))

    def text(self, value: str) -> None:
        data = value.encode("utf-8")
        if len(data) > MAX_MESSAGE:
            data = data[: MAX_MESSAGE - 3].decode("utf-8", "ignore").encode() + b"..."
        self.blob(data)


# --------------------------------------------------------------------------- body reader


class BodyReader:
    """Reads a body strictly: every length is checked against the bytes left before use.

    ``start``: where the body begins in ``data`` (a whole frame can be read in place; every
    byte string read is a copy, so nothing read keeps a view of ``data``)."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: memoryview | bytes, start: int = 0) -> None:
        self.data = data
        self.pos = start
        self.end = len(data)

    def left(self) -> int:
        return self.end - self.pos

    def take(self, st: struct.Struct) -> tuple[Any, ...]:
        pos = self.pos
        size = st.size
        if pos + size > self.end:
            raise ProtocolError(f"body truncated: need {size} bytes, {self.end - pos} left")
        self.pos = pos + size
        return st.unpack_from(self.data, pos)

    def i64(self) -> int:
        return int(self.take(_Q)[0])

    def blob(self, limit: int | None = None) -> bytes | None:
        pos = self.pos
        left = self.end - pos
        if left < 4:
            raise ProtocolError(f"body truncated: need 4 bytes, {left} left")
        (n,) = _I.unpack_from(self.data, pos)
        pos += 4
        if n == NONE_LEN:
            self.pos = pos
            return None
        if n > left - 4:
            raise ProtocolError(f"byte string of {n} bytes exceeds the {left - 4} bytes left")
        if limit is not None and n > limit:
            raise ProtocolError(f"string of {n} bytes exceeds its {limit}-byte cap")
        self.pos = pos + n
        return bytes(self.data[pos : pos + n])

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
        status = STATUS_BY_CODE.get(code)
        if status is None:
            raise ProtocolError(f"unknown status code {code}")
        return status

    def done(self) -> None:
        if self.pos != self.end:
            raise ProtocolError(f"{self.end - self.pos} trailing bytes after the message body")

