"""Request/response types, status codes, entry framing and digests.

These are the messages a client exchanges with a bookie, whatever carries them: the
in-process transport passes the objects themselves, the TCP transport encodes them with
``pybk.transport.codec``, the simulator delays/drops/duplicates them. Keeping one set of
types means the protocol code is identical on every path.

Entry framing (what the client builds and the bookie stores opaquely)::

    offset 0   ledger_id   i64 big-endian
    offset 8   entry_id    i64
    offset 16  lac         i64   the writer's last-add-confirmed when this entry was sent
    offset 24  length      i64   ledger length in bytes *including* this entry
    offset 32  digest      CRC32C: 4 bytes, MAC (HMAC-SHA256): 32 bytes, DUMMY: 0 bytes
    offset 32+d payload

The digest covers bytes [0, 32) and the payload. Readers verify it and check that the
embedded ledger and entry ids are the ones they asked for.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import crc32c

from pybk.errors import BKError, DigestMismatchError, Status, error_for_status, status_of

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


# --------------------------------------------------------------------------- requests

#: Entry id meaning "the last entry you hold" in a read request.
LAST_ENTRY: Final = -1


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Store one framed entry. ``body`` is the whole digested entry (see module doc).

    ``recovery=True`` is a recovery add: it is accepted on a fenced ledger (that is how a
    recovering client writes entries back).
    """

    ledger_id: int
    entry_id: int
    master_key: bytes
    body: bytes
    recovery: bool = False
    op = Op.ADD


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


@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    """Ask for the explicit LAC body and the last entry the bookie holds."""

    ledger_id: int
    op = Op.READ_LAC


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    """Store an explicit LAC (``body`` = digested (ledger_id, lac), see :func:`frame_lac`)."""

    ledger_id: int
    lac: int
    master_key: bytes
    body: bytes
    op = Op.WRITE_LAC


@dataclass(frozen=True, slots=True)
class FenceRequest:
    """Fence a ledger (durably) without reading an entry."""

    ledger_id: int
    master_key: bytes
    op = Op.FENCE


@dataclass(frozen=True, slots=True)
class ListEntriesRequest:
    """Which entries of a ledger does this bookie hold?"""

    ledger_id: int
    op = Op.LIST_ENTRIES


@dataclass(frozen=True, slots=True)
class BookieInfoRequest:
    """Free space, total space and state of the bookie. ``versions=True`` also asks for the
    newest protocol version the bookie speaks (how a TCP client learns it may send
    :class:`AddBatchRequest`; an older bookie refuses the flag, see docs/protocol.md)."""

    versions: bool = False
    op = Op.BOOKIE_INFO


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """Authenticate a connection with a token (TCP transport only)."""

    token: bytes
    op = Op.AUTH


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
    op = Op.ADD_BATCH


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
    | ListEntriesRequest
    | BookieInfoRequest
    | AuthRequest
)

# --------------------------------------------------------------------------- responses


@dataclass(frozen=True, slots=True)
class AddResponse:
    status: Status
    ledger_id: int
    entry_id: int
    message: str = ""
    op = Op.ADD


@dataclass(frozen=True, slots=True)
class ReadResponse:
    """``body`` is the stored framed entry (None when absent). ``lac`` is the bookie's LAC for
    the ledger (-1 when unknown); a long poll uses it to report progress without an entry."""

    status: Status
    ledger_id: int
    entry_id: int
    body: bytes | None = None
    lac: int = -1
    message: str = ""
    op = Op.READ


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    status: Status
    ledger_id: int
    lac_body: bytes | None = None
    last_entry_body: bytes | None = None
    message: str = ""
    op = Op.READ_LAC


@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    status: Status
    ledger_id: int
    message: str = ""
    op = Op.WRITE_LAC


@dataclass(frozen=True, slots=True)
class FenceResponse:
    """``lac`` is the bookie's LAC for the ledger at fencing time."""

    status: Status
    ledger_id: int
    lac: int = -1
    message: str = ""
    op = Op.FENCE


@dataclass(frozen=True, slots=True)
class ListEntriesResponse:
    """``ranges`` are inclusive (first, last) entry-id runs the bookie holds, ascending."""

    status: Status
    ledger_id: int
    ranges: tuple[tuple[int, int], ...] = ()
    message: str = ""
    op = Op.LIST_ENTRIES


class BookieState(enum.StrEnum):
    """What a bookie accepts: everything, reads and recovery adds only, or nothing.

    A ``StrEnum`` so the value travels as the plain string it always was (the registry, the
    wire's BookieInfo answer, logs) while code compares against named members. It lives
    here, with the messages that carry it, so a transport can read a bookie's state without
    importing the bookie package (``pybk.bookie`` re-exports it)."""

    WRITABLE = "writable"
    READ_ONLY = "read-only"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class BookieInfoResponse:
    status: Status
    bookie_id: str = ""
    free_bytes: int = 0
    total_bytes: int = 0
    state: str = ""  # a BookieState value, or "" in an error answer
    message: str = ""
    #: the newest protocol version the bookie speaks, when the request asked (else 0)
    protocol_version: int = 0
    op = Op.BOOKIE_INFO


@dataclass(frozen=True, slots=True)
class AuthResponse:
    status: Status
    message: str = ""
    op = Op.AUTH


@dataclass(frozen=True, slots=True)
class AddBatchResponse:
    """The answer to an :class:`AddBatchRequest` of ``count`` entries. ``statuses`` is empty
    when every entry has ``status`` (OK: all stored), else one status per entry in request
    order; ``status`` is then the first non-OK one and ``message`` says why."""

    status: Status
    ledger_id: int
    count: int
    statuses: tuple[Status, ...] = ()
    message: str = ""
    op = Op.ADD_BATCH


@dataclass(frozen=True, slots=True)
class ReadBatchResponse:
    """The answer to a :class:`ReadBatchRequest`: ``entries`` holds ``(entry_id, status,
    body)`` for a prefix of the requested ids, in their order (body None unless OK).
    ``status`` is not OK only when the whole request failed (no such ledger, bookie stopped):
    ``entries`` is then empty. ``lac`` is the bookie's LAC for the ledger."""

    status: Status
    ledger_id: int
    lac: int = -1
    entries: tuple[tuple[int, Status, bytes | None], ...] = ()
    message: str = ""
    op = Op.READ_BATCH


Response = (
    AddResponse
    | AddBatchResponse
    | ReadBatchResponse
    | ReadResponse
    | ReadLacResponse
    | WriteLacResponse
    | FenceResponse
    | ListEntriesResponse
    | BookieInfoResponse
    | AuthResponse
)


_new = object.__new__
_slots: Any = vars(AddResponse)  # the slot descriptors, set directly (frozen: no __setattr__)
_set_status = _slots["status"].__set__
_set_ledger = _slots["ledger_id"].__set__
_set_entry = _slots["entry_id"].__set__
_set_message = _slots["message"].__set__


def add_ok(ledger_id: int, entry_id: int) -> AddResponse:
    """``AddResponse(Status.OK, ledger_id, entry_id)``, built in about half the time of the
    frozen dataclass's ``__init__`` (one per replica per entry on the hot path)."""
    r: AddResponse = _new(AddResponse)
    _set_status(r, Status.OK)
    _set_ledger(r, ledger_id)
    _set_entry(r, entry_id)
    _set_message(r, "")
    return r


def error_response(request: Request, status: Status, message: str = "") -> Response:
    """A response of the right type for ``request`` carrying a non-OK ``status``."""
    if isinstance(request, AddRequest):
        return AddResponse(status, request.ledger_id, request.entry_id, message)
    if isinstance(request, AddBatchRequest):
        return AddBatchResponse(status, request.ledger_id, len(request.bodies), (), message)
    if isinstance(request, ReadBatchRequest):
        return ReadBatchResponse(status, request.ledger_id, message=message)
    if isinstance(request, ReadRequest):
        return ReadResponse(status, request.ledger_id, request.entry_id, message=message)
    if isinstance(request, ReadLacRequest):
        return ReadLacResponse(status, request.ledger_id, message=message)
    if isinstance(request, WriteLacRequest):
        return WriteLacResponse(status, request.ledger_id, message)
    if isinstance(request, FenceRequest):
        return FenceResponse(status, request.ledger_id, message=message)
    if isinstance(request, ListEntriesRequest):
        return ListEntriesResponse(status, request.ledger_id, message=message)
    if isinstance(request, BookieInfoRequest):
        return BookieInfoResponse(status, message=message)
    return AuthResponse(status, message)


# --------------------------------------------------------------------------- add outcomes

#: What a bookie did with an add, in process (``Transport.add``, ``Bookie.add_request``):
#: None, every entry is durable there; a BKError, no entry was stored (the bookie refused,
#: or could not be reached: BookieUnavailableError, TimeoutError); a list, one outcome per
#: entry of an :class:`AddBatchRequest`, in its order (some stored, some not)
AddOutcome = BKError | None | list[BKError | None]
#: ``on_done(outcome)``: called exactly once per add request, quick, never raising
AddCallback = Callable[[AddOutcome], None]
AddLike = AddRequest | AddBatchRequest


def add_response(request: AddLike, outcome: AddOutcome) -> AddResponse | AddBatchResponse:
    """The response reporting ``outcome`` (what the TCP server sends; the simulator's
    observers see it too). Unexpected exceptions are mapped like any other (status_of)."""
    if type(request) is AddRequest:
        if outcome is None:
            return add_ok(request.ledger_id, request.entry_id)
        if isinstance(outcome, BaseException):
            return AddResponse(status_of(outcome), request.ledger_id, request.entry_id,
                               str(outcome))
        return add_response(request, outcome[0])
    assert isinstance(request, AddBatchRequest)
    n = len(request.bodies)
    if outcome is None:
        return AddBatchResponse(Status.OK, request.ledger_id, n)
    if isinstance(outcome, BaseException):
        return AddBatchResponse(status_of(outcome), request.ledger_id, n, (), str(outcome))
    first = next((e for e in outcome if e is not None), None)
    if first is None:
        return AddBatchResponse(Status.OK, request.ledger_id, n)
    statuses = tuple(Status.OK if e is None else status_of(e) for e in outcome)
    return AddBatchResponse(status_of(first), request.ledger_id, n, statuses, str(first))


def add_outcome(response: Response, count: int = 1) -> AddOutcome:
    """The outcome a response to an add of ``count`` entries reports (the inverse of
    :func:`add_response`; error classes from :func:`pybk.errors.error_for_status`)."""
    status = response.status
    if status == Status.OK:
        return None
    if isinstance(response, AddBatchResponse) and response.statuses:
        message = response.message
        return [None if s == Status.OK else error_for_status(s, message)
                for s in response.statuses]
    return error_for_status(status, response.message)


def outcome_of(outcome: AddOutcome, index: int) -> BKError | None:
    """Entry ``index``'s part of a batch's ``outcome``."""
    if outcome is None or isinstance(outcome, BaseException):
        return outcome
    return outcome[index]


# --------------------------------------------------------------------------- keys & digests

DIGEST_TYPES: Final = ("CRC32C", "MAC", "DUMMY")
DIGEST_SIZES: Final = {"CRC32C": 4, "MAC": 32, "DUMMY": 0}

ENTRY_HEADER = struct.Struct(">qqqq")  # ledger_id, entry_id, lac, length
ENTRY_HEADER_SIZE: Final = ENTRY_HEADER.size  # 32
_pack_entry_header = ENTRY_HEADER.pack
LAC_HEADER = struct.Struct(">qq")  # ledger_id, lac
_CRC = struct.Struct(">I")
_pack_crc = _CRC.pack
_crc32c = crc32c.crc32c
#: up to this payload size, ``frame`` checksums one ``header + payload`` copy: a crc32c call
#: costs about as much as copying half a KiB, so one call on a copy beats two calls
_CONCAT_CRC_MAX: Final = 512


#: the CRC32C-digested entry's header and digest, and its smallest size
_ENTRY_CRC_HEADER = struct.Struct(">qqqqI")
_CRC_ENTRY_MIN: Final = _ENTRY_CRC_HEADER.size


def master_key(password: bytes) -> bytes:
    """The key a bookie checks on every add and fence (BookKeeper: SHA1("ledger"+pw))."""
    return hashlib.sha256(b"ledger" + password).digest()


def password_hash(password: bytes) -> bytes:
    """What the metadata stores to check a password at open (never the password itself)."""
    return hashlib.sha256(b"pybk-password" + password).digest()


def mac_key(password: bytes) -> bytes:
    """HMAC key for the MAC digest type (BookKeeper: SHA1("mac"+pw))."""
    return hashlib.sha256(b"mac" + password).digest()


@dataclass(frozen=True, slots=True)
class DecodedEntry:
    """A framed entry after its digest was verified."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes


@dataclass(slots=True)
class DigestManager:
    """Frames and verifies entries for one ledger (one digest type and key)."""

    ledger_id: int
    digest_type: str = "CRC32C"
    password: bytes = b""
    _key: bytes = field(init=False, repr=False, default=b"")
    _size: int = field(init=False, default=0)
    _crc: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        if self.digest_type not in DIGEST_SIZES:
            raise ValueError(
                f"digest_type must be one of {', '.join(DIGEST_TYPES)}, not {self.digest_type!r}"
            )
        self._size = DIGEST_SIZES[self.digest_type]
        self._crc = self.digest_type == "CRC32C"
        self._key = mac_key(self.password) if self.digest_type == "MAC" else b""

    @classmethod
    def from_mac_key(cls, ledger_id: int, digest_type: str, key: bytes) -> DigestManager:
        """A digest manager for one who holds the ledger's MAC key but not its password
        (auto-recovery, with the key from the ledger's metadata)."""
        dm = cls(ledger_id, digest_type)
        if digest_type == "MAC":
            if len(key) != 32:
                raise ValueError(f"ledger {ledger_id}: a MAC key has 32 bytes, not {len(key)}")
            dm._key = key
        return dm

    def _digest(self, header: bytes, payload: bytes | memoryview) -> bytes:
        if self.digest_type == "CRC32C":
            return _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))
        if self.digest_type == "MAC":
            mac = hmac.new(self._key, header, hashlib.sha256)
            mac.update(payload)
            return mac.digest()
        return b""

    def frame(self, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        """The bytes sent to and stored by bookies for one entry."""
        header = _pack_entry_header(self.ledger_id, entry_id, lac, length)
        if self._crc:  # the default digest, inlined: once per entry on the write path
            # (two concatenations: the small header + digest first, then the payload, copied
            # once; cheaper than a join's tuple for the common small entry)
            if len(payload) <= _CONCAT_CRC_MAX:  # one crc32c call (its fixed cost dominates)
                return header + _pack_crc(_crc32c(header + payload)) + payload
            return header + _pack_crc(_crc32c(payload, _crc32c(header))) + payload
        return header + self._digest(header, payload) + payload

    def crc_checked(self, body: bytes, expected_entry_id: int | None = None,
                    ) -> tuple[int, int, int, bytes] | None:
        """The default digest's check, for the read paths' hot loops (once per entry): one
        unpack, one CRC over header + payload, no views. ``(entry_id, lac, length, payload)``
        when ``body`` is a good CRC32C entry of this ledger (and of ``expected_entry_id``, if
        given); None otherwise, also for another digest type: the caller then takes
        :meth:`verify`, which says what is wrong."""
        if not self._crc or len(body) < _CRC_ENTRY_MIN:
            return None
        ledger_id, entry_id, lac, length, digest = _ENTRY_CRC_HEADER.unpack_from(body)
        if (ledger_id != self.ledger_id
                or (expected_entry_id is not None and entry_id != expected_entry_id)):
            return None
        data = body[_CRC_ENTRY_MIN:]
        if _crc32c(data, _crc32c(body[:ENTRY_HEADER_SIZE])) != digest:
            return None
        return entry_id, lac, length, data

    def verify(self, body: bytes, expected_entry_id: int | None = None) -> DecodedEntry:
        """Check the digest and the embedded ids; raise DigestMismatchError if anything is off.

        ``expected_entry_id=None`` skips the entry-id check (LAC reads of "the last entry").
        """
        good = self.crc_checked(body, expected_entry_id)
        if good is not None:
            entry: DecodedEntry = _new(DecodedEntry)
            _set_d_ledger(entry, self.ledger_id)
            _set_d_entry(entry, good[0])
            _set_d_lac(entry, good[1])
            _set_d_length(entry, good[2])
            _set_d_payload(entry, good[3])
            return entry
        hsize = ENTRY_HEADER_SIZE
        if len(body) < hsize + self._size:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: entry of {len(body)} bytes is shorter than its header"
            )
        header = body[:hsize]
        ledger_id, entry_id, lac, length = ENTRY_HEADER.unpack(header)
        view = memoryview(body)
        payload = view[hsize + self._size :]
        if not hmac.compare_digest(body[hsize : hsize + self._size], self._digest(header, payload)):
            raise DigestMismatchError(
                f"ledger {self.ledger_id} entry {entry_id}: digest mismatch ({self.digest_type})"
            )
        if ledger_id != self.ledger_id:
            raise DigestMismatchError(
                f"entry claims ledger {ledger_id}, expected ledger {self.ledger_id}"
            )
        if expected_entry_id is not None and entry_id != expected_entry_id:
            raise DigestMismatchError(
                f"ledger {self.ledger_id}: entry claims id {entry_id}, expected {expected_entry_id}"
            )
        return DecodedEntry(ledger_id, entry_id, lac, length, bytes(payload))

    def frame_lac(self, lac: int) -> bytes:
        """Digested explicit-LAC body: (ledger_id, lac) + digest."""
        header = LAC_HEADER.pack(self.ledger_id, lac)
        return header + self._digest(header, b"")

    def verify_lac(self, body: bytes) -> int:
        """Verify an explicit-LAC body and return the LAC."""
        hsize = LAC_HEADER.size
        if len(body) != hsize + self._size:
            raise DigestMismatchError(f"ledger {self.ledger_id}: bad explicit LAC body length")
        header = body[:hsize]
        ledger_id, lac = LAC_HEADER.unpack(header)
        if not hmac.compare_digest(body[hsize:], self._digest(header, b"")) or (
            ledger_id != self.ledger_id
        ):
            raise DigestMismatchError(f"ledger {self.ledger_id}: explicit LAC digest mismatch")
        return int(lac)


_d_slots: Any = vars(DecodedEntry)  # (frozen: its fields are set through the slots)
_set_d_ledger = _d_slots["ledger_id"].__set__
_set_d_entry = _d_slots["entry_id"].__set__
_set_d_lac = _d_slots["lac"].__set__
_set_d_length = _d_slots["length"].__set__
_set_d_payload = _d_slots["payload"].__set__


def parse_entry_header(body: bytes) -> tuple[int, int, int, int]:
    """(ledger_id, entry_id, lac, length) of a framed entry, without verifying the digest.

    Bookies use this: they store entries opaquely but need the ids and the piggybacked LAC.
    Raises ValueError when the body is too short to hold a header.
    """
    if len(body) < ENTRY_HEADER_SIZE:
        raise ValueError(f"entry body of {len(body)} bytes is shorter than the 32-byte header")
    ledger_id, entry_id, lac, length = ENTRY_HEADER.unpack_from(body)
    return int(ledger_id), int(entry_id), int(lac), int(length)


__all__ = [
    "DIGEST_SIZES",
    "DIGEST_TYPES",
    "ENTRY_HEADER",
    "ENTRY_HEADER_SIZE",
    "LAC_HEADER",
    "LAST_ENTRY",
    "AddBatchRequest",
    "AddBatchResponse",
    "AddCallback",
    "AddLike",
    "AddOutcome",
    "AddRequest",
    "AddResponse",
    "AuthRequest",
    "AuthResponse",
    "BookieInfoRequest",
    "BookieInfoResponse",
    "BookieState",
    "DecodedEntry",
    "DigestManager",
    "FenceRequest",
    "FenceResponse",
    "ListEntriesRequest",
    "ListEntriesResponse",
    "Op",
    "ReadBatchRequest",
    "ReadBatchResponse",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRequest",
    "ReadResponse",
    "Request",
    "Response",
    "Status",
    "WriteLacRequest",
    "WriteLacResponse",
    "add_ok",
    "add_outcome",
    "add_response",
    "error_response",
    "mac_key",
    "master_key",
    "outcome_of",
    "parse_entry_header",
    "password_hash",
]
