"""The pybk wire connection, sans-IO: bytes in, events out; messages in, bytes out.

:class:`Connection` is the framing state machine of one end of a connection: it cuts the byte
stream into frames, checks each length prefix against the frame cap *before* buffering the
frame, holds frames back after an AUTH request until the caller has judged the token, and stays
broken after damage to the framing. How each message is laid out is
:mod:`pybk.transport.messages` (the message tables, on :mod:`pybk.transport.wireformat`); the
format is documented in ``docs/protocol.md``.

Nothing here touches a socket, a clock or a thread (the h11 pattern), so the same object runs
under the TCP server, the TCP client, the simulator and hypothesis.
"""

from __future__ import annotations

import struct

from pybk.errors import ProtocolError
from pybk.transport.errorreplies import error_response_for_op
from pybk.transport.messages import (
    Event,
    MessageRejected,
    RequestReceived,
    ResponseReceived,
    decode_frame,
    encode_request,
    encode_response,
)
from pybk.transport.wireformat import (
    DEFAULT_MAX_FRAME,
    FLAG_FENCE,
    FLAG_LONG_POLL,
    FLAG_RECOVERY,
    FLAG_RESPONSE,
    FLAG_VERSIONS,
    HEADER_SIZE,
    MAX_BATCH_ENTRIES,
    MAX_MESSAGE,
    MAX_TIMEOUT,
    MIN_FRAME,
    PRE_AUTH_MAX_FRAME,
    PREFIX_SIZE,
    PROTOCOL_VERSION,
)
from pybk.wire import AuthRequest, Request, Response

__all__ = [
    "DEFAULT_MAX_FRAME",
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
    "Connection",
    "Event",
    "MessageRejected",
    "RequestReceived",
    "ResponseReceived",
    "encode_request",
    "encode_response",
    "error_response_for_op",
]

_LENGTH = struct.Struct(">I")
_LENGTH_SIZE = _LENGTH.size


class Connection:
    """One end of a pybk connection: feed bytes with :meth:`receive_data`, get events back.

    ``role="server"`` decodes requests and encodes responses; ``role="client"`` the reverse.
    ``max_frame`` may be changed at any time (a server raises it after authentication); it
    applies to the next length prefix examined.

    After a fatal :class:`ProtocolError` the connection is broken: every later
    :meth:`receive_data` raises the same error again.
    """

    def __init__(self, role: str, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if role not in ("client", "server"):
            raise ValueError(f"role must be 'client' or 'server', not {role!r}")
        if max_frame < MIN_FRAME:
            raise ValueError(f"max_frame must be at least {MIN_FRAME}, not {max_frame}")
        self.role = role
        self.max_frame = max_frame
        self._buf = bytearray()
        self._error: ProtocolError | None = None
        self.frames_received = 0
        self.bytes_received = 0
        #: Stop decoding right after an AUTH request, leaving later bytes buffered: the
        #: frames that follow AUTH must be checked against the cap that applies *after*
        #: the server has judged the token. Call ``receive_data(b"")`` to go on.
        self.hold_after_auth = False
        #: decoding stopped after an AUTH request with frames still buffered
        self._held = False
        #: a large ADD_BATCH's entry table is left for the caller to walk in pieces
        #: (:class:`~pybk.transport.batchbodies.BatchBodies`; a server sets this)
        self.lazy_batches = False

    @property
    def broken(self) -> ProtocolError | None:
        """The fatal error, once the peer broke the framing."""
        return self._error

    @property
    def buffered(self) -> int:
        """Bytes of a partial frame waiting for the rest (0 between frames)."""
        return len(self._buf)

    @property
    def header_complete(self) -> bool:
        """Whether the partial frame's prefix + header has arrived (only its body is missing)."""
        return len(self._buf) >= PREFIX_SIZE + HEADER_SIZE

    def send(self, request_id: int, message: Request | Response) -> bytes:
        """Bytes to put on the wire for ``message`` (a request if client, response if server)."""
        if self.role == "client":
            return encode_request(request_id, message)  # type: ignore[arg-type]
        return encode_response(request_id, message)  # type: ignore[arg-type]

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Buffer ``data`` and return every complete message it finishes.

        Raises :class:`ProtocolError` (and stays broken) when the framing is damaged.
        Never buffers more than one frame cap plus ``len(data)`` bytes.
        """
        if self._error is not None:
            raise self._error
        self.bytes_received += len(data)
        buf = self._buf
        buf += data
        events: list[Event] = []
        pos = 0
        self._held = False
        try:
            with memoryview(buf) as view:  # (released before ``buf`` is resized below)
                while len(buf) - pos >= _LENGTH_SIZE:
                    (length,) = _LENGTH.unpack_from(view, pos)
                    if length > self.max_frame:
                        raise ProtocolError(
                            f"frame of {length} bytes exceeds the {self.max_frame}-byte cap"
                        )
                    if length < MIN_FRAME:
                        raise ProtocolError(
                            f"frame length {length} is below the minimum {MIN_FRAME}")
                    end = pos + 4 + length
                    if len(buf) < end:
                        break
                    # decoded from a view of the buffer: each field is copied out once, and
                    # nothing keeps a view into ``buf`` (the decoders return bytes)
                    with view[pos + 4 : end] as frame:
                        event = decode_frame(frame, self.role, self.lazy_batches)
                    self.frames_received += 1
                    events.append(event)
                    pos = end
                    if (
                        self.hold_after_auth
                        and isinstance(event, RequestReceived)
                        and isinstance(event.request, AuthRequest)
                    ):
                        self._held = len(buf) > pos
                        break  # the caller decides the next frame cap (see hold_after_auth)
        except ProtocolError as exc:
            self._error = exc
            self._buf = bytearray()
            raise
        finally:
            if pos and self._error is None:
                del buf[:pos]
        return events

    def _check(self) -> None:
        """Assert the framing invariants (the stateful and property tests call this after
        every step): a broken connection buffers nothing; otherwise the buffer holds less
        than one whole frame (every complete frame was decoded, unless decoding is held after
        an AUTH request), and a buffered length prefix is within the cap it was checked
        against."""
        buf = self._buf
        assert self.bytes_received >= len(buf)
        assert self.frames_received >= 0
        if self._error is not None:
            assert not buf, "a broken connection keeps no bytes"
            return
        if len(buf) >= _LENGTH_SIZE and not self._held:
            length = int.from_bytes(buf[:4], "big")
            assert MIN_FRAME <= length <= self.max_frame, (length, self.max_frame)
            assert len(buf) < 4 + length, "a complete frame was left undecoded"
