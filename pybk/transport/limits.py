"""The limits and deadlines of a bookie's TCP server: everything a remote peer can make it
hold has a bound here, and every bound is a ``pybk bookie`` option (see docs/protocol.md,
"Limits").

What a peer can make the server hold, and what bounds it (listed in docs/internals.md,
"pybk/transport/limits.py").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Final

from pybk.transport import codec

__all__ = ["REQUEST_OVERHEAD", "ServerConfig"]

#: bytes charged per request on top of its body and expected answer: what its objects
#: (the decoded request, a task or a reply callback, the answer) cost in memory
REQUEST_OVERHEAD: Final = 512


@dataclass
class ServerConfig:
    """Limits and deadlines of a :class:`pybk.transport.server.BookieServer` (seconds, bytes,
    counts). Checked when made: ValueError names the field."""

    max_frame: int = codec.DEFAULT_MAX_FRAME
    pre_auth_max_frame: int = codec.PRE_AUTH_MAX_FRAME
    #: requests started (not yet answered) per connection
    max_in_flight: int = 1024
    #: entries in requests started per connection (an ADD_BATCH counts its entries, a
    #: READ_BATCH its ids, anything else one): each costs Python work and memory however
    #: small its bytes; past it the connection starts nothing and soon stops being read
    max_entries_in_flight: int = 65536
    #: entries in flight over all connections (past it: a fair share per connection)
    bookie_entries_in_flight: int = 262144
    #: bytes of requests read ahead while none can start (more: the server stops reading)
    max_queued_bytes: int = 256 << 10
    #: connections in all, handshaking and unauthenticated ones included
    max_connections: int = 4096
    max_connections_per_ip: int = 512
    #: connections still in their TLS handshake or, with a token, before AUTH
    max_unauthenticated: int = 128
    #: bytes in flight per connection: bodies of adds being stored + answers not yet sent
    connection_budget: int = 16 << 20
    #: bytes in flight over all connections
    bookie_budget: int = 128 << 20
    #: a long poll waits at most this long, whatever its request asks
    long_poll_max_timeout: float = 60.0
    #: long polls waiting at once (beyond: answered at once with the current state)
    max_long_polls: int = 16384
    #: descriptors kept for the bookie's own files (journal, checkpoints, metadata)
    fd_reserve: int = 128
    #: TCP keepalive: seconds idle before the first probe (0: no keepalive)
    keepalive: float = 60.0
    idle_timeout: float = 300.0
    frame_timeout: float = 10.0  # a frame must arrive whole within this of its first byte
    write_timeout: float = 30.0  # a peer must take some of our answers within this
    auth_timeout: float = 5.0  # an unauthenticated connection must authenticate within this
    tls_handshake_timeout: float = 5.0
    stop_grace: float = 10.0  # on stop, in-flight requests get this long to finish
    #: rate-limited warnings (refused connections, accept errors) at most once per this
    log_interval: float = 10.0
    #: listen() backlog
    backlog: int = 1024

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"ServerConfig.{f.name} must be a number, not {value!r}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"ServerConfig.{f.name} must be >= 0, not {value!r}")
        for name in ("idle_timeout", "frame_timeout", "write_timeout", "auth_timeout",
                     "tls_handshake_timeout", "long_poll_max_timeout", "log_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ServerConfig.{name} must be > 0, not {getattr(self, name)!r}")
        for name in ("max_in_flight", "connection_budget", "bookie_budget", "backlog",
                     "max_queued_bytes", "max_entries_in_flight", "bookie_entries_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerConfig.{name} must be >= 1, not {getattr(self, name)!r}")
        for name in ("max_frame", "pre_auth_max_frame"):
            if getattr(self, name) < codec.MIN_FRAME:
                raise ValueError(f"ServerConfig.{name} must be at least {codec.MIN_FRAME} "
                                 f"bytes, not {getattr(self, name)!r}")
