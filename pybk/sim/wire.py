"""Bytes on the simulated wire: every message between simulated processes goes through the
production codec (:mod:`pybk.transport.messages`), as it does between real processes.

A client's request is encoded as the TCP transport would frame it (the protocol version its
operation needs: single adds in version 1, batches in version 2), and decoded on the bookie's
side by the server's decoder; answers likewise in the other direction. A codec bug then shows
as a violation (a request that changed on the way, a reply that no longer decodes), and the
network's corruption fault flips a real bit that the frame CRC must catch.
"""

from __future__ import annotations

import random

from pybk.transport.messages import (
    MessageRejected,
    RequestReceived,
    ResponseReceived,
    decode_frame,
)
from pybk.wire import Request, Response

__all__ = ["WireRejected", "damage", "decode_request", "decode_response"]

#: the length prefix that precedes each frame on a stream (the decoder takes what follows)
_PREFIX = 4


class WireRejected(Exception):
    """A frame that arrived whole but did not decode as what was sent (a codec bug, never a
    fault of the simulated network: damaged frames raise ProtocolError)."""


def decode_request(frame: bytes, seq: int) -> Request:
    """The request a bookie decodes from ``frame``; ProtocolError when the frame is damaged,
    WireRejected when its body does not parse or it names another request id."""
    event = decode_frame(memoryview(frame)[_PREFIX:], "server")
    if isinstance(event, MessageRejected):
        raise WireRejected(f"request {seq} rejected by the decoder: {event.error}")
    if not isinstance(event, RequestReceived) or event.request_id != seq:
        raise WireRejected(f"request {seq} decoded as {event!r}")
    return event.request


def decode_response(frame: bytes, seq: int) -> Response:
    """The answer a client decodes from ``frame`` (errors as :func:`decode_request`)."""
    event = decode_frame(memoryview(frame)[_PREFIX:], "client")
    if isinstance(event, MessageRejected):
        raise WireRejected(f"answer to {seq} rejected by the decoder: {event.error}")
    if not isinstance(event, ResponseReceived) or event.request_id != seq:
        raise WireRejected(f"answer to {seq} decoded as {event!r}")
    return event.response


def damage(frame: bytes, rng: random.Random) -> bytes:
    """``frame`` with one bit flipped after its length prefix (what the CRC must catch)."""
    at = rng.randrange(_PREFIX, len(frame))
    out = bytearray(frame)
    out[at] ^= 1 << rng.randrange(8)
    return bytes(out)
