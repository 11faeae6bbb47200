"""The bookie's index: where each entry lives, and what the bookie knows about each ledger.

Per ledger: an :class:`EntryIndex` entry id -> location (segment seq, offset, size of the framed
record) and the ledger's state (master key, fenced, explicit LAC, highest piggybacked LAC,
deleted tombstone). The index holds only *durable* entries: the store applies an entry after
the fsync that covers it, so "not in the index" means "never durably written here" (R2, I9).

The index is checkpointed to one CRC-framed, versioned file together with the journal position
it covers; start-up loads it and replays the journal after that position, or rebuilds from
every segment when the file is missing or damaged.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, ValuesView
from dataclasses import dataclass, field
from typing import Final, NamedTuple

import crc32c
from sortedcontainers import SortedList

from pybk.errors import CorruptRecordError


class Location(NamedTuple):
    """Where a framed ENTRY record lives: segment seq, byte offset, record size.

    The index itself stores these as *plain* ``(seg, offset, size)`` tuples (see
    :attr:`LedgerState.entries`); ``Location(*value)`` or :meth:`LedgerState.location` gives
    the named view."""

    seg: int
    offset: int
    size: int


class Position(NamedTuple):
    """A point in the journal: the end of a synced batch (next batch seq to expect there)."""

    seg: int
    offset: int
    batch_seq: int


#: A stored entry's location as the index keeps it: plain ``(seg, offset, size)``.
Loc = tuple[int, int, int]


class EntryIndex:
    """One ledger's entries: entry id -> plain ``(seg, offset, size)`` location tuple.

    Inserts and point lookups (the write path pays one insert per entry, reads look entries
    up by id) go to a plain dict; the ordered view (listings, range reads, ordered iteration)
    is a sortedcontainers ``SortedList`` of the ids, brought up to date from the ids added
    since it was last used, and the highest id is tracked as entries arrive. Why: a
    ``SortedDict`` insert costs about ten dict inserts in CPython and the write path paid it
    for every entry of every ledger, while ordered questions are rare and the highest id is
    all "read the last entry" needs. Entries are only ever added or moved (compaction), never
    removed one by one: a deleted ledger drops its whole index.

    The values are plain tuples, not :class:`Location`: the garbage collector stops tracking a
    plain tuple of ints after its first collection but tracks a NamedTuple forever, so an
    index of Locations made every full collection walk every entry the bookie holds."""

    __slots__ = ("_ids", "last", "locs", "unordered")

    def __init__(self, items: Iterable[tuple[int, Loc]] = ()) -> None:
        #: entry id -> location (the write path inserts here directly, see :meth:`add_new`)
        self.locs: dict[int, Loc] = dict(items)
        self._ids = SortedList(self.locs)
        #: ids added since the ordered view was last brought up to date
        self.unordered: list[int] = []
        #: the highest entry id held, -1 when none
        self.last: int = self._ids[-1] if self._ids else -1

    def add_new(self, entry_id: int, loc: Loc) -> None:
        """Insert an id the index does not hold yet (the caller checked: the hot path)."""
        self.locs[entry_id] = loc
        self.unordered.append(entry_id)
        if entry_id > self.last:
            self.last = entry_id

    def __setitem__(self, entry_id: int, loc: Loc) -> None:
        if entry_id in self.locs:
            self.locs[entry_id] = loc
        else:
            self.add_new(entry_id, loc)

    def get(self, entry_id: int) -> Loc | None:
        return self.locs.get(entry_id)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.locs

    def __len__(self) -> int:
        return len(self.locs)

    def _ordered(self) -> SortedList:
        if self.unordered:
            self._ids.update(self.unordered)
            self.unordered.clear()
        return self._ids

    def __iter__(self) -> Iterator[int]:
        """Entry ids, ascending."""
        return iter(self._ordered())

    def irange(self, first: int, last: int) -> Iterator[int]:
        """Entry ids in ``[first, last]``, ascending."""
        return iter(self._ordered().irange(first, last))

    def items(self) -> list[tuple[int, Loc]]:
        """``(entry id, location)``, ascending."""
        locs = self.locs
        return [(eid, locs[eid]) for eid in self._ordered()]

    def snapshot(self) -> tuple[list[int], dict[int, Loc]]:
        """Copies of the ids (ascending) and of the locations (C-level copies, for a
        checkpoint taken while the index keeps changing)."""
        return list(self._ordered()), self.locs.copy()

    def values(self) -> ValuesView[Loc]:
        """The locations, in no particular order."""
        return self.locs.values()

    def _check(self) -> None:
        ids = list(self._ordered())
        assert ids == sorted(self.locs), "ordered ids disagree with the locations"
        assert self.last == (ids[-1] if ids else -1), (self.last, ids[-1:])


@dataclass(slots=True)
class LedgerState:
    """What this bookie knows about one ledger."""

    master_key: bytes | None = None
    fenced: bool = False
    deleted: bool = False
    explicit_lac: int = -1
    explicit_lac_body: bytes | None = None
    max_piggyback_lac: int = -1
    entries: EntryIndex = field(default_factory=EntryIndex)
    #: entry id -> body of adds written to the journal but not yet durable (not in
    #: ``entries``): a second add of the same entry waits for the first or is refused
    pending: dict[int, bytes] = field(default_factory=dict, repr=False)

    def location(self, entry_id: int) -> Location | None:
        """Where ``entry_id`` is stored, or None."""
        loc = self.entries.get(entry_id)
        return None if loc is None else Location(*loc)

    @property
    def lac(self) -> int:
        return max(self.explicit_lac, self.max_piggyback_lac)

    @property
    def last_entry(self) -> int:
        return self.entries.last


class Index:
    """All ledgers' states plus per-segment live byte counts (for compaction)."""

    def __init__(self) -> None:
        self.ledgers: dict[int, LedgerState] = {}
        #: segment seq -> bytes of live ENTRY records located there
        self.seg_live: dict[int, int] = {}

    def get(self, ledger_id: int) -> LedgerState | None:
        return self.ledgers.get(ledger_id)

    def ledger(self, ledger_id: int) -> LedgerState:
        """The state of ``ledger_id``, created empty if unknown."""
        state = self.ledgers.get(ledger_id)
        if state is None:
            state = self.ledgers[ledger_id] = LedgerState()
        return state

    def put_entry(self, ledger_id: int, entry_id: int, loc: Loc,
                  piggyback_lac: int) -> None:
        """Record a durable entry (ignored for a deleted ledger: its bytes are garbage)."""
        state = self.ledger(ledger_id)
        if state.deleted:
            return
        old = state.entries.get(entry_id)
        if old is not None:
            self._sub_live(old)
        seg, offset, size = loc
        state.entries[entry_id] = (seg, offset, size)
        self.seg_live[seg] = self.seg_live.get(seg, 0) + size
        if piggyback_lac > state.max_piggyback_lac:
            state.max_piggyback_lac = piggyback_lac

    def delete_ledger(self, ledger_id: int) -> None:
        """Tombstone: the ledger's entries become garbage; the state stays as a marker."""
        state = self.ledger(ledger_id)
        for loc in state.entries.values():
            self._sub_live(loc)
        state.entries = EntryIndex()
        state.deleted = True
        state.explicit_lac_body = None

    def _sub_live(self, loc: Loc) -> None:
        seg, _offset, size = loc
        left = self.seg_live[seg] - size
        if left:
            self.seg_live[seg] = left
        else:
            del self.seg_live[seg]

    def _check(self) -> None:
        """Assert the internal invariants (called by the stateful tests after every step)."""
        live: dict[int, int] = {}
        for lid, state in self.ledgers.items():
            assert isinstance(lid, int)
            if state.deleted:
                assert not state.entries, f"deleted ledger {lid} still has entries"
            state.entries._check()
            for eid, loc in state.entries.items():
                assert eid >= 0, (lid, eid)
                assert type(loc) is tuple and len(loc) == 3, (lid, eid, loc)  # plain (see above)
                seg, offset, size = loc
                assert size > 0 and offset >= 0, (lid, eid, loc)
                live[seg] = live.get(seg, 0) + size
            assert state.explicit_lac_body is None or state.explicit_lac >= -1
        assert live == self.seg_live, (live, self.seg_live)


# --------------------------------------------------------------------------- checkpoint file

CHECKPOINT_MAGIC: Final = b"PYBKIDX\x00"
CHECKPOINT_VERSION: Final = 1
_CP_HEADER = struct.Struct(">8sHIQ")  # magic, version, crc, payload length
_CP_POS = struct.Struct(">QQQI")  # seg, offset, batch seq, ledger count
_CP_LEDGER = struct.Struct(">qBqqHII")  # id, flags, piggy lac, explicit lac, keylen, laclen, n
_CP_ENTRY_FMT: Final = "qQQI"
_CP_ENTRY_SIZE: Final = struct.calcsize(">" + _CP_ENTRY_FMT)
_FENCED, _DELETED, _HAS_KEY, _HAS_LAC = 1, 2, 4, 8


class CheckpointEncoder:
    """Encodes an index checkpoint in steps, from a snapshot taken when it is created.

    Why: encoding is a Python loop over every entry (about 0.3 s per million entries here),
    and a bookie that encoded its whole index in one go stopped serving for that long at every
    checkpoint. Creating the encoder copies what the checkpoint needs with C-level copies
    (each ledger's ordered ids and location dict, its flags and LACs; about a tenth of the
    encoding time), so the checkpoint is exactly the index at ``pos`` however the index
    changes afterwards; :meth:`steps` then encodes a bounded number of entries per step and
    the caller may serve between steps."""

    def __init__(self, index: Index, pos: Position) -> None:
        self._ledgers: list[tuple[bytes, list[int], dict[int, Loc]]] = []
        for lid in sorted(index.ledgers):
            st = index.ledgers[lid]
            flags = (
                (_FENCED if st.fenced else 0)
                | (_DELETED if st.deleted else 0)
                | (_HAS_KEY if st.master_key is not None else 0)
                | (_HAS_LAC if st.explicit_lac_body is not None else 0)
            )
            key = st.master_key or b""
            lac_body = st.explicit_lac_body or b""
            ids, locs = st.entries.snapshot()
            head = _CP_LEDGER.pack(lid, flags, st.max_piggyback_lac, st.explicit_lac,
                                   len(key), len(lac_body), len(ids)) + key + lac_body
            self._ledgers.append((head, ids, locs))
        self._parts: list[bytes] = [_CP_POS.pack(pos.seg, pos.offset, pos.batch_seq,
                                                 len(self._ledgers))]
        self._done = False

    def steps(self, entries_per_step: int = 16384) -> Iterator[None]:
        """Encode, pausing (yielding) after about ``entries_per_step`` entries each time."""
        parts = self._parts
        since = 0
        for head, ids, locs in self._ledgers:
            parts.append(head)
            for first in range(0, len(ids), entries_per_step):
                chunk = ids[first : first + entries_per_step]
                flat: list[int] = []
                for eid in chunk:
                    flat.append(eid)
                    flat.extend(locs[eid])
                parts.append(struct.pack(">" + _CP_ENTRY_FMT * len(chunk), *flat))
                since += len(chunk)
                if since >= entries_per_step:
                    since = 0
                    yield
        self._ledgers = []
        self._done = True

    def result(self) -> bytes:
        """The checkpoint file's bytes (after :meth:`steps` has run to its end)."""
        if not self._done:
            for _ in self.steps():
                pass
        payload = b"".join(self._parts)
        return _CP_HEADER.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, crc32c.crc32c(payload),
                               len(payload)) + payload


def encode_checkpoint(index: Index, pos: Position) -> bytes:
    """The index checkpoint at ``pos`` in one go (see :class:`CheckpointEncoder`)."""
    return CheckpointEncoder(index, pos).result()


def decode_checkpoint(data: bytes, path: str) -> tuple[Index, Position]:
    """Parse an index checkpoint; CorruptRecordError on any damage or unknown version."""
    if len(data) < _CP_HEADER.size:
        raise CorruptRecordError(f"{path}: index checkpoint is truncated", path=path, offset=0)
    magic, version, crc, length = _CP_HEADER.unpack_from(data)
    if magic != CHECKPOINT_MAGIC:
        raise CorruptRecordError(f"{path}: not a pybk index checkpoint", path=path, offset=0)
    if version != CHECKPOINT_VERSION:
        raise CorruptRecordError(
            f"{path}: unknown index checkpoint version {version} (expected "
            f"{CHECKPOINT_VERSION})", path=path, offset=0)
    payload = data[_CP_HEADER.size :]
    if len(payload) != length or crc32c.crc32c(payload) != crc:
        raise CorruptRecordError(f"{path}: index checkpoint checksum mismatch", path=path,
                                 offset=0)
    try:
        return _decode_payload(payload)
    except (struct.error, ValueError) as exc:
        raise CorruptRecordError(f"{path}: malformed index checkpoint ({exc})", path=path,
                                 offset=0) from None


def _decode_payload(payload: bytes) -> tuple[Index, Position]:
    seg, offset, batch_seq, count = _CP_POS.unpack_from(payload)
    pos = _CP_POS.size
    index = Index()
    for _ in range(count):
        lid, flags, piggy, elac, keylen, laclen, n = _CP_LEDGER.unpack_from(payload, pos)
        pos += _CP_LEDGER.size
        key = payload[pos : pos + keylen]
        pos += keylen
        lac_body = payload[pos : pos + laclen]
        pos += laclen
        st = LedgerState(
            master_key=key if flags & _HAS_KEY else None,
            fenced=bool(flags & _FENCED),
            deleted=bool(flags & _DELETED),
            explicit_lac=elac,
            explicit_lac_body=lac_body if flags & _HAS_LAC else None,
            max_piggyback_lac=piggy,
        )
        if n:
            flat = struct.unpack_from(">" + _CP_ENTRY_FMT * n, payload, pos)
            pos += _CP_ENTRY_SIZE * n
            items = []
            for i in range(0, 4 * n, 4):
                eseg, esize = flat[i + 1], flat[i + 3]
                items.append((flat[i], (eseg, flat[i + 2], esize)))
                index.seg_live[eseg] = index.seg_live.get(eseg, 0) + esize
            st.entries = EntryIndex(items)
        index.ledgers[lid] = st
    if pos != len(payload):
        raise ValueError(f"{len(payload) - pos} trailing bytes")
    return index, Position(seg, offset, batch_seq)
