"""The metadata store seam: ledger metadata with compare-and-set, ids, bookie registry, watches.

One small interface, three backends (``memory://``, ``sqlite:///path``, ``zk://host:port/root``).
Nothing here is ZooKeeper-specific: versions are opaque integers that change on every write,
liveness is "the registration disappears when its owner stops heartbeating or its session
ends", and watches are callbacks that may coalesce several changes into one call (a watcher
always re-reads; it never trusts a delta) and never miss one (the watch guarantee, in
:class:`MetadataStore`).

All updates of existing ledger metadata go through :meth:`MetadataStore.update_ledger`, the
one read-check-transform-CAS retry loop (BookKeeper's ``MetadataUpdateLoop``).
"""

from __future__ import annotations

import abc
import asyncio
import base64
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import crc32c

from pybk.errors import CorruptRecordError, MetadataVersionError, NoSuchKeyError

__all__ = [
    "CLOSED",
    "FORMAT_VERSION",
    "IN_RECOVERY",
    "MAX_KEY_LENGTH",
    "MAX_VALUE_SIZE",
    "OPEN",
    "STATES",
    "BookieRegistration",
    "LedgerMetadata",
    "MetadataStore",
    "Transform",
    "ValueTransform",
    "VersionedValue",
    "Watch",
    "check_group",
    "check_rack",
]

OPEN: Final = "OPEN"
IN_RECOVERY: Final = "IN_RECOVERY"
CLOSED: Final = "CLOSED"
STATES: Final = (OPEN, IN_RECOVERY, CLOSED)


@dataclass(frozen=True)
class LedgerMetadata:
    """What the metadata store knows about one ledger.

    ``ensembles`` maps the first entry id of each fragment to the bookie ids of its ensemble;
    entry ``e`` belongs to the fragment with the greatest first entry id <= ``e``.
    ``version`` is the store's version of this record (not serialized; -1 = never stored).
    """

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: Mapping[int, tuple[str, ...]]
    state: str = OPEN
    last_entry_id: int = -1
    length: int = 0
    digest_type: str = "CRC32C"
    password_hash: bytes = b""
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    ctime_ms: int = 0
    #: the keys auto-recovery needs to copy this ledger's entries without its password:
    #: the bookies' master key (recovery adds, fencing) and, for the MAC digest, the MAC
    #: key (verifying what it copies). One-way hashes of the password, never the password
    #: itself; b"" when the creator chose not to store them (recovery then needs the
    #: password from its configuration).
    master_key: bytes = field(default=b"", repr=False)
    mac_key: bytes = field(default=b"", repr=False)
    version: int = -1

    # -- derived views ---------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state == CLOSED

    @property
    def last_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[max(self.ensembles)]

    @property
    def last_ensemble_start(self) -> int:
        return max(self.ensembles)

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble in force for ``entry_id``."""
        starts = [s for s in self.ensembles if s <= entry_id]
        return self.ensembles[max(starts) if starts else min(self.ensembles)]

    def public_view(self, *, custom_values: bool = True) -> dict[str, Any]:
        """A JSON-able view for operators (``pybk ledger metadata``, the HTTP endpoint): the
        password hash and the recovery keys are left out. ``custom_values``: the custom
        metadata's values base64-encoded (else only its sorted keys)."""
        return {
            "ledger_id": self.ledger_id,
            "state": self.state,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type,
            "ensembles": {str(k): list(v) for k, v in sorted(self.ensembles.items())},
            "custom_metadata": (
                {k: base64.b64encode(v).decode() for k, v in sorted(self.custom_metadata.items())}
                if custom_values else sorted(self.custom_metadata)),
            "ctime_ms": self.ctime_ms,
            "version": self.version,
        }

    def with_changes(self, **changes: Any) -> LedgerMetadata:
        """A copy with some fields replaced (metadata objects are immutable)."""
        return replace(self, **changes)

    # -- serialization (versioned, checksummed) ---------------------------------------------

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "ensembles": [[k, list(v)] for k, v in sorted(self.ensembles.items())],
            "state": self.state,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type,
            "password_hash": base64.b64encode(self.password_hash).decode(),
            "custom_metadata": {
                k: base64.b64encode(v).decode() for k, v in sorted(self.custom_metadata.items())
            },
            "ctime_ms": self.ctime_ms,
        }
        if self.master_key:
            doc["master_key"] = base64.b64encode(self.master_key).decode()
        if self.mac_key:
            doc["mac_key"] = base64.b64encode(self.mac_key).decode()
        payload = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        return _MAGIC + _HDR.pack(FORMAT_VERSION, crc32c.crc32c(payload), len(payload)) + payload

    @classmethod
    def from_bytes(cls, data: bytes, version: int = -1) -> LedgerMetadata:
        """Parse serialized metadata; raise CorruptRecordError on any damage or unknown format."""
        if len(data) < len(_MAGIC) + _HDR.size or not data.startswith(_MAGIC):
            raise CorruptRecordError("ledger metadata: bad magic")
        fmt, crc, length = _HDR.unpack_from(data, len(_MAGIC))
        if fmt != FORMAT_VERSION:
            raise CorruptRecordError(f"ledger metadata: unknown format version {fmt}")
        payload = data[len(_MAGIC) + _HDR.size :]
        if len(payload) != length or crc32c.crc32c(payload) != crc:
            raise CorruptRecordError("ledger metadata: checksum mismatch")
        try:
            doc = json.loads(payload)
            return cls(
                ledger_id=int(doc["ledger_id"]),
                ensemble_size=int(doc["ensemble_size"]),
                write_quorum=int(doc["write_quorum"]),
                ack_quorum=int(doc["ack_quorum"]),
                ensembles={int(k): tuple(str(b) for b in v) for k, v in doc["ensembles"]},
                state=str(doc["state"]),
                last_entry_id=int(doc["last_entry_id"]),
                length=int(doc["length"]),
                digest_type=str(doc["digest_type"]),
                password_hash=base64.b64decode(doc["password_hash"]),
                custom_metadata={
                    str(k): base64.b64decode(v) for k, v in doc["custom_metadata"].items()
                },
                ctime_ms=int(doc.get("ctime_ms", 0)),
                master_key=base64.b64decode(doc.get("master_key", "")),
                mac_key=base64.b64decode(doc.get("mac_key", "")),
                version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(f"ledger metadata: malformed document ({exc})") from exc


FORMAT_VERSION: Final = 1
_MAGIC: Final = b"PYBKLM"
_HDR = struct.Struct(">HII")  # format version, crc32c(payload), payload length


@dataclass(frozen=True)
class BookieRegistration:
    """A live bookie as the registry sees it."""

    bookie_id: str
    address: str  # "host:port" for TCP bookies, "" for in-process ones
    read_only: bool = False
    #: network location ``/region/rack`` for rack-aware placement; "" when not configured
    rack: str = ""
    #: isolation group (bookies a namespace may be bound to); "" when in none
    group: str = ""


#: the longest network location a registration may carry
_MAX_RACK_LENGTH: Final = 256


def check_group(group: object) -> str:
    """An isolation group: "" (none) or 1-100 of ``[A-Za-z0-9._-]``."""
    if not isinstance(group, str):
        raise TypeError(f"group must be a str, not {type(group).__name__}")
    if group and (len(group) > 100 or not all(c.isalnum() or c in "._-" for c in group)
                  or not group.isascii()):
        raise ValueError(f"bad isolation group {group!r}: 1-100 letters, digits and ._-")
    return group


def check_rack(rack: object) -> str:
    """A network location: "" (unknown) or ``/seg[/seg...]`` with no empty segment."""
    if not isinstance(rack, str):
        raise TypeError(f"rack must be a str, not {type(rack).__name__}")
    if rack and (not rack.startswith("/") or any(not s for s in rack[1:].split("/"))
                 or len(rack) > _MAX_RACK_LENGTH):
        raise ValueError(f"bad rack {rack!r}: expected '' or a location like /region/rack")
    return rack


@dataclass(frozen=True)
class VersionedValue:
    """One value of the store's key/value namespace, with its version.

    Versions are opaque integers that change on every write and are never reused for a key,
    not even after it was deleted and created again (so a stale compare-and-set can never
    succeed on a new incarnation of the key).
    """

    key: str
    value: bytes
    version: int


#: Largest value the key/value namespace stores (ZooKeeper's znode limit is about 1 MiB).
MAX_VALUE_SIZE: Final = 1_000_000
#: Longest key.
MAX_KEY_LENGTH: Final = 512


class Watch(abc.ABC):
    """Handle of a registered watch; ``cancel()`` stops further callbacks."""

    @abc.abstractmethod
    def cancel(self) -> None: ...


#: A transform for :meth:`MetadataStore.update_ledger`: return the new metadata, or ``None``
#: when no update is needed (the "needs update" predicate is false).
Transform = Callable[[LedgerMetadata], "LedgerMetadata | None"]

#: A transform for :meth:`MetadataStore.update_value`: the new bytes, or ``None`` when no
#: update is needed.
ValueTransform = Callable[[VersionedValue], "bytes | None"]


class Election(abc.ABC):
    """One candidacy in a leader election (auto-recovery elects its auditor with it).

    ``await join()`` enters the candidate; from then on it campaigns by itself: when it
    becomes the leader ``is_leader`` turns True and ``on_change`` is called; when it stops
    leading (it resigned, or its session or lease was lost) ``is_leader`` turns False and
    ``on_change`` is called again, and it campaigns anew unless it resigned. A leader must
    stop acting as one as soon as ``is_leader`` is False.
    """

    def __init__(self, name: str, candidate: str) -> None:
        self.name = name
        self.candidate = candidate
        self.on_change: Callable[[bool], None] | None = None
        self._leader = False
        self._changed: asyncio.Event | None = None

    @property
    def is_leader(self) -> bool:
        return self._leader

    def _set_leader(self, leader: bool) -> None:
        """Implementations call this whenever leadership is won or lost."""
        if leader == self._leader:
            return
        self._leader = leader
        if self._changed is not None:
            self._changed.set()
        if self.on_change is not None:
            self.on_change(leader)

    async def wait_leader(self) -> None:
        """Return once this candidate leads (at once if it does)."""
        while not self._leader:
            if self._changed is None:
                self._changed = asyncio.Event()
            self._changed.clear()
            await self._changed.wait()

    @abc.abstractmethod
    async def join(self) -> None:
        """Enter the election (returns once the candidacy is recorded, not once elected)."""

    @abc.abstractmethod
    async def resign(self) -> None:
        """Leave the election (stop leading at once if leading). Idempotent."""


class MetadataStore(abc.ABC):
    """Ledger metadata, ledger ids, bookie registry and watches.

    **The watch guarantee** (every backend, checked by ``pybk.testing.watch_conformance``):
    a watch fires at least once for every change committed after the state this store last
    returned to a caller for that subject (the bookie registry, a ledger, a value, a lock,
    an election's lock), or, when this store never returned that subject, after the watch
    was set. Extra fires are allowed (a watcher re-reads); a missed change never is. A
    change and its undoing (a bookie that goes and comes back, a lock taken and released)
    between two looks is still a change: backends compare versions or counters, never the
    current state with a remembered one. A registration or lock whose owner died counts as
    changed when its session or lease ends.

    So a caller may read, then watch, in that order, and act on every fire by reading
    again. What counts as returning a subject: ``read_ledger``/``create_ledger``/
    ``write_ledger``/``delete_ledger`` for a ledger, the value calls for a key,
    ``list_bookies`` (and ``writable_bookies``/``read_only_bookies``) for the registry,
    ``lock_owner``/``try_lock``/``unlock`` for a lock (``list_locks`` does not count).
    """

    #: Seconds between polls for backends that watch by polling.
    poll_interval: float = 0.05

    # -- ledgers -----------------------------------------------------------------------------

    @abc.abstractmethod
    async def allocate_ledger_id(self) -> int:
        """A ledger id never handed out before (unique across processes sharing the store)."""

    @abc.abstractmethod
    async def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        """Store metadata for a new ledger; LedgerExistsError if the id is taken.
        Returns the stored metadata with its ``version`` set."""

    @abc.abstractmethod
    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        """Current metadata with its version; NoSuchLedgerError if absent."""

    async def sync_reads(self) -> bool:
        """Catch this store's reads up with every write committed before the call, through
        any session (ZooKeeper's ``sync``: its session's server may lag the leader). True when
        reads could have been stale (a "no such ledger" read before may be read once more);
        False, the default, for backends whose reads are never stale."""
        return False

    @abc.abstractmethod
    async def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        """Compare-and-set: store ``metadata`` only if the stored version is
        ``expected_version``. MetadataVersionError if it is not, NoSuchLedgerError if the
        ledger is gone. Returns the stored metadata with its new version."""

    @abc.abstractmethod
    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        """Remove a ledger's metadata (CAS when ``expected_version`` is given).
        NoSuchLedgerError if absent."""

    @abc.abstractmethod
    async def list_ledgers(self) -> list[int]:
        """All ledger ids, ascending."""

    async def update_ledger(
        self, ledger_id: int, transform: Transform, *, max_attempts: int = 100
    ) -> LedgerMetadata:
        """The one read-check-transform-CAS loop every metadata update goes through.

        Reads the current metadata, calls ``transform`` on it; ``None`` means "no update
        needed" and returns the current metadata unchanged. Otherwise CAS-writes the result;
        on MetadataVersionError re-reads and tries again (``transform`` must be a pure
        function of its argument). Exceptions raised by ``transform`` propagate.
        """
        last_error: MetadataVersionError | None = None
        for _ in range(max_attempts):
            current = await self.read_ledger(ledger_id)
            new = transform(current)
            if new is None:
                return current
            try:
                return await self.write_ledger(new, current.version)
            except MetadataVersionError as exc:
                last_error = exc
        raise MetadataVersionError(
            f"ledger {ledger_id}: gave up after {max_attempts} conflicting updates"
        ) from last_error

    # -- bookies -----------------------------------------------------------------------------

    @abc.abstractmethod
    async def register_bookie(self, registration: BookieRegistration) -> None:
        """Announce a live bookie. It stays listed while its owner lives (heartbeat/session);
        registering again updates it (e.g. to flip ``read_only``)."""

    @abc.abstractmethod
    async def unregister_bookie(self, bookie_id: str) -> None:
        """Remove a bookie's registration now (clean shutdown)."""

    @abc.abstractmethod
    async def list_bookies(self) -> list[BookieRegistration]:
        """Live bookies (writable and read-only), sorted by id."""

    async def writable_bookies(self) -> list[str]:
        return [b.bookie_id for b in await self.list_bookies() if not b.read_only]

    async def read_only_bookies(self) -> list[str]:
        return [b.bookie_id for b in await self.list_bookies() if b.read_only]

    # -- watches -----------------------------------------------------------------------------

    @abc.abstractmethod
    def watch_ledger(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        """Call ``callback(ledger_id)`` (on the event loop) after the ledger's metadata changes
        or it is deleted. Several changes may produce one call. See the watch guarantee
        (class doc): a change since this store's last read of the ledger counts."""

    @abc.abstractmethod
    def watch_bookies(self, callback: Callable[[], None]) -> Watch:
        """Call ``callback()`` (on the event loop) after the set of live bookies changes
        (a registration made, removed, flipped read-only, or lapsed with its owner). A
        change since this store's last ``list_bookies`` counts (the watch guarantee)."""

    async def sync_watches(self) -> bool:
        """Return once every watch this store had set when called is established: compared
        with the store's state at least once (a polling backend polled it, ZooKeeper's watch
        reported). True when there was something to wait for (a caller that read before
        that may read once more); False when every watch was established already (the
        default, for backends whose watches are established when set). Bounded: a watch
        that cannot be established in reasonable time is given up on, and True returned."""
        return False

    # -- under-replication marks (used by auto-recovery, a later wave) ------------------------

    @abc.abstractmethod
    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        """Record that ``ledger_id`` lacks replicas on ``missing_bookies`` (merged with any
        existing mark)."""

    @abc.abstractmethod
    async def list_under_replicated(self) -> dict[int, list[str]]:
        """Ledger id -> missing bookies, for every marked ledger."""

    @abc.abstractmethod
    async def clear_under_replicated(
        self, ledger_id: int, expected: Sequence[str] | None = None
    ) -> bool:
        """Remove the mark (the ledger was re-replicated or deleted). With ``expected``,
        only if the mark still lists exactly those bookies: a replication worker clears what
        it repaired, never a mark an auditor widened meanwhile. True when a mark was removed."""

    # -- bookie cookies (identity of a bookie's data directory, rule R4) ----------------------

    @abc.abstractmethod
    async def read_cookie(self, bookie_id: str) -> bytes | None:
        """The cookie stored for ``bookie_id`` (None if the bookie was never registered)."""

    @abc.abstractmethod
    async def write_cookie(self, bookie_id: str, cookie: bytes) -> None:
        """Store (or replace) the cookie of ``bookie_id``."""

    @abc.abstractmethod
    async def delete_cookie(self, bookie_id: str) -> None:
        """Forget a bookie's cookie (operator action: the bookie's data was deliberately wiped)."""

    # -- key/value namespace (logs; later leases and locks) -------------------------------------
    #
    # Keys are '/'-separated paths of segments made of letters, digits and ``._:-`` (no empty
    # segment, no ``.`` or ``..``), at most MAX_KEY_LENGTH characters; values are bytes of at
    # most MAX_VALUE_SIZE. A key may have keys below it ("a/b" and "a/b/c" are independent).
    # Every change goes through compare-and-set on the version, like ledger metadata.

    @abc.abstractmethod
    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        """Store ``value`` under a new key; KeyExistsError if the key exists."""

    @abc.abstractmethod
    async def read_value(self, key: str) -> VersionedValue:
        """The current value and version; NoSuchKeyError if absent."""

    @abc.abstractmethod
    async def write_value(
        self, key: str, value: bytes, expected_version: int
    ) -> VersionedValue:
        """Compare-and-set: replace the value only if its version is ``expected_version``
        (MetadataVersionError otherwise; NoSuchKeyError if the key is gone)."""

    @abc.abstractmethod
    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        """Remove a key (CAS when ``expected_version`` is given); NoSuchKeyError if absent.
        Keys below it stay."""

    @abc.abstractmethod
    async def list_keys(self, prefix: str = "") -> list[str]:
        """Every key starting with ``prefix`` (``""`` or a path ending in ``/``), at any
        depth, sorted."""

    @abc.abstractmethod
    def watch_value(self, key: str, callback: Callable[[str], None]) -> Watch:
        """Call ``callback(key)`` (on the event loop) after the key is created, changed or
        deleted. Several changes may produce one call; the watcher re-reads."""

    async def update_value(
        self, key: str, transform: ValueTransform, *, max_attempts: int = 100
    ) -> VersionedValue:
        """The read-transform-CAS loop for values (as :meth:`update_ledger` for ledgers):
        ``transform`` gets the current value and returns the new bytes, or ``None`` for "no
        update" (the current value is returned). It must be a pure function of its
        argument; what it raises propagates. NoSuchKeyError if the key does not exist."""
        last_error: MetadataVersionError | None = None
        for _ in range(max_attempts):
            current = await self.read_value(key)
            new = transform(current)
            if new is None:
                return current
            try:
                return await self.write_value(key, new, current.version)
            except MetadataVersionError as exc:
                last_error = exc
            except NoSuchKeyError:
                raise
        raise MetadataVersionError(
            f"key {key!r}: gave up after {max_attempts} conflicting updates"
        ) from last_error

    # -- ephemeral locks (auto-recovery: replication workers, the auditor) ----------------------
    #
    # A lock is held by one store object (one session) at a time and carries an owner label
    # (who holds it, for operators). It vanishes when the holder unlocks it, closes, or dies
    # (its session expires / its lease is not renewed), exactly like a bookie registration.
    # Lock names follow the key syntax of the key/value namespace (a separate namespace).

    @abc.abstractmethod
    async def try_lock(self, name: str, owner: str) -> bool:
        """Take lock ``name`` for this store if nobody holds it. True when this store holds
        it now (also when it already did), False when someone else does."""

    @abc.abstractmethod
    async def unlock(self, name: str) -> None:
        """Release ``name`` if this store holds it (nothing happens otherwise)."""

    @abc.abstractmethod
    async def lock_owner(self, name: str) -> str | None:
        """The owner label of whoever holds ``name``, or None when it is free."""

    @abc.abstractmethod
    async def list_locks(self, prefix: str = "") -> dict[str, str]:
        """Held locks whose name starts with ``prefix`` (``""`` or a path ending in ``/``):
        name -> owner label."""

    @abc.abstractmethod
    def holds_lock(self, name: str) -> bool:
        """Whether this store still holds ``name`` as far as it knows (no I/O): False once
        released, or once its session or lease was lost (then another may hold it)."""

    @abc.abstractmethod
    def watch_lock(self, name: str, callback: Callable[[str], None]) -> Watch:
        """Call ``callback(name)`` (on the event loop) after lock ``name`` is taken,
        released, or lost by its holder. Several changes may produce one call."""

    # -- leader election ---------------------------------------------------------------------

    @abc.abstractmethod
    def election(self, name: str, candidate: str) -> Election:
        """A candidacy of ``candidate`` (a label, e.g. a bookie id) in election ``name``; see
        :class:`Election`. One leader at a time per election; when it dies, resigns or loses
        its session, another candidate takes over."""

    @abc.abstractmethod
    async def election_leader(self, name: str) -> str | None:
        """The label of the current leader of election ``name`` (None when nobody leads)."""

    # -- lifecycle -----------------------------------------------------------------------------

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and stop heartbeats/watch pollers."""
