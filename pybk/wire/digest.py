"""Entry framing and digests: what a client builds, a bookie stores opaquely, a reader checks.

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

import hashlib
import hmac
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import crc32c

from pybk.errors import DigestMismatchError

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


_new = object.__new__
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
