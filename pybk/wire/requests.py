"""The requests a client sends a bookie, and the operations they name.

One set of types on every path: the in-process transport passes these objects, the TCP
transport encodes them (``pybk.transport.codec``), the simulator delays and drops them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pybk.wire.fastinit import fast_init

# --------------------------------------------------------------------------- operations

#: ``Status`` (the wire status codes) lives in :mod:`pybk.errors` with the error classes it
#: maps to (the one status table); it is importable from here too.


class Op(enum.IntEnum):
    """Operations a bookie serves."""

    ADD = 1
    READ = 2
    READ_LAC = 3
    WRITE_LAC = 4
    FENCE = 5
    LIST_ENTRIES = 6
    BOOKIE_INFO = 7
    AUTH = 8
    #: several entries of one ledger in one request (protocol version 2)
    ADD_BATCH = 9
    #: read several entries of one ledger in one request (protocol version 2)
    READ_BATCH = 10
    #: make every deferred-sync add of a ledger durable (protocol version 3)
    FORCE = 11


# --------------------------------------------------------------------------- requests

#: Entry id meaning "the last entry you hold" in a read request.
LAST_ENTRY: Final = -1


@fast_init
@dataclass(frozen=True, slots=True)
class AddRequest:
    """Store one framed entry. ``body`` is the whole digested entry (see module doc).

    ``recovery=True`` is a recovery add: it is accepted on a fenced ledger (that is how a
    recovering client writes entries back). ``deferred_sync=True`` (protocol version 3): answer
    once the journal has taken it, before its fsync (:class:`ForceRequest` makes it durable).
    """

    ledger_id: int
    entry_id: int
    master_key: bytes
    body: bytes
    recovery: bool = False
    deferred_sync: bool = False
    op = Op.ADD


@fast_init
@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read one entry.

    * ``entry_id == LAST_ENTRY`` reads the last entry the bookie holds.
    * ``fence=True`` fences the ledger first (durably) and needs ``master_key``; a fencing
      read of a ledger the bookie has never seen creates it, fenced.
    * Long poll: ``previous_lac`` set and ``timeout > 0``: the bookie waits until its LAC for
      the ledger is above ``previous_lac`` (or the ledger is fenced, or the timeout passes),
      then answers with its LAC and, when it holds it, entry ``previous_lac + 1``.
    """

    ledger_id: int
    entry_id: int
    fence: bool = False
    master_key: bytes = b""
    previous_lac: int | None = None
    timeout: float = 0.0
    op = Op.READ


@fast_init
@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    """Ask for the explicit LAC body and the last entry the bookie holds."""

    ledger_id: int
    op = Op.READ_LAC


@fast_init
@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    """Store an explicit LAC (``body`` = digested (ledger_id, lac), see :func:`frame_lac`)."""

    ledger_id: int
    lac: int
    master_key: bytes
    body: bytes
    op = Op.WRITE_LAC


@fast_init
@dataclass(frozen=True, slots=True)
class FenceRequest:
    """Fence a ledger (durably) without reading an entry."""

    ledger_id: int
    master_key: bytes
    op = Op.FENCE


@fast_init
@dataclass(frozen=True, slots=True)
class ForceRequest:
    """Answer once every deferred-sync add of the ledger this bookie acknowledged before is
    durable (BookKeeper's FORCE_LEDGER; protocol version 3)."""

    ledger_id: int
    master_key: bytes
    op = Op.FORCE


@fast_init
@dataclass(frozen=True, slots=True)
class ListEntriesRequest:
    """Which entries of a ledger does this bookie hold?"""

    ledger_id: int
    op = Op.LIST_ENTRIES


@fast_init
@dataclass(frozen=True, slots=True)
class BookieInfoRequest:
    """Free space, total space and state of the bookie. ``versions=True`` also asks for the
    newest protocol version the bookie speaks (how a TCP client learns it may send
    :class:`AddBatchRequest`; an older bookie refuses the flag, see docs/protocol.md)."""

    versions: bool = False
    op = Op.BOOKIE_INFO


@fast_init
@dataclass(frozen=True, slots=True)
class AuthRequest:
    """Authenticate a connection with a token (TCP transport only)."""

    token: bytes
    op = Op.AUTH


@fast_init
@dataclass(frozen=True, slots=True)
class AddBatchRequest:
    """Store several framed entries of one ledger: ``bodies[i]`` is entry ``entry_ids[i]``
    (ascending; not necessarily consecutive: with striping a bookie holds only some ids).

    What a writer sends one bookie for the entries of one ledger it pushed together: one
    request, one journal append, one index update and one answer for the lot, instead of one
    each per entry. The bookie checks each body's embedded ids like a single add's and answers
    each entry on its own (:class:`AddBatchResponse`). The bodies are the very bytes framed
    once by the writer and handed to every replica (never copied per replica)."""

    ledger_id: int
    master_key: bytes
    entry_ids: Sequence[int]
    bodies: Sequence[bytes]
    recovery: bool = False
    deferred_sync: bool = False
    op = Op.ADD_BATCH


def batch_bytes(bodies: Sequence[bytes]) -> int:
    """The bytes of a batch's bodies. A sequence that knows its total (``nbytes``: a
    server's bodies left in their frame, :mod:`pybk.transport.batchbodies`) says it without
    a body being made."""
    total = getattr(bodies, "nbytes", None)
    return total if isinstance(total, int) else sum(map(len, bodies))


@fast_init
@dataclass(frozen=True, slots=True)
class ReadBatchRequest:
    """Read the entries ``entry_ids`` of one ledger from one bookie (protocol version 2).

    What a reader sends each bookie for the entries of a range it reads there first (a
    sequential read of a closed ledger): one request and one answer for many entries,
    instead of one each. The bookie answers each entry on its own
    (:class:`ReadBatchResponse`), in order, and may stop early to keep its answer within a
    frame: the entries it did not get to are simply not in the answer."""

    ledger_id: int
    entry_ids: Sequence[int]
    op = Op.READ_BATCH


Request = (
    AddRequest
    | AddBatchRequest
    | ReadBatchRequest
    | ReadRequest
    | ReadLacRequest
    | WriteLacRequest
    | FenceRequest
    | ForceRequest
    | ListEntriesRequest
    | BookieInfoRequest
    | AuthRequest
)
