"""The bookie's index: where each entry lives, and what the bookie knows about each ledger.

Per ledger: an :class:`EntryIndex` entry id -> location (segment seq, offset, size of the framed
record) and the ledger's state (master key, fenced, explicit LAC, highest piggybacked LAC).
A deleted ledger's state leaves the index and only its id stays, in :attr:`Index.deleted`
(compact ranges: deletions never end on a bookie under rolling logs). The index holds only
*durable* entries: the store applies an entry after the fsync that covers it, so "not in the
index" means "never durably written here" (R2, I9).

The index is checkpointed (:mod:`pybk.storage.checkpoint`) together with the journal position
it covers; start-up loads it and replays the journal after that position, or rebuilds from
every segment when a checkpoint file is missing or damaged.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice, repeat
from operator import add as _add
from operator import eq as _eq
from operator import sub as _sub
from typing import Any, Final, NamedTuple

from sortedcontainers import SortedDict

from pybk.storage.idranges import IdRanges

__all__ = [
    "MAX_GAP",
    "EntryColumns",
    "EntryIndex",
    "Index",
    "LedgerState",
    "Loc",
    "Location",
    "Position",
    "empty_columns",
]


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


class EntryColumns(NamedTuple):
    """A run of consecutive entry ids ``first, first + 1, ...`` as three parallel arrays (a
    size of 0: the id is not held). What checkpoints copy and write, column by column."""

    first: int
    segs: array[int]
    offs: array[int]
    sizes: array[int]


def empty_columns() -> EntryColumns:
    return EntryColumns(0, array("I"), array("Q"), array("I"))


#: an id at most this far past the dense run's end extends the run (leaving holes); further
#: ones go to the sparse part
MAX_GAP: Final = 64
_HOLES: Final = 16  # holes per entry held the dense run takes (more: sparse, bounded memory)
_ZEROS: Final = memoryview(bytes(8 * MAX_GAP))


#: the most ids per repeating period :meth:`EntryIndex._append_periodic` looks for (a
#: bookie of an E/Qw ledger gets Qw ids per period of E)
_MAX_PERIOD_IDS: Final = 8


class EntryIndex:
    """One ledger's entries: entry id -> ``(seg, offset, size)`` of its ENTRY record.

    Why arrays: a bookie holds every entry it stores in this index, and a dict of location
    tuples cost ~160 bytes an entry (a dict slot, a tuple, its ints), 16 GB for 100 million
    entries. A ledger's entries arrive in id order, so most of them form one *dense run*:
    ids ``first .. end - 1`` in three parallel ``array`` columns (segment ``I``, offset ``Q``,
    size ``I``; 16 bytes an entry), a size of 0 marking a hole (an id this bookie does not
    hold: with striping, E > Qw, each bookie holds only some ids). The write path appends to
    the columns in place (the store inlines it: ``eid == end``); ids before ``first`` or far
    past ``end`` (recovery adds, re-replication) go to ``sparse``, a sortedcontainers
    ``SortedDict``. Checkpoints copy and write the columns whole (C-level copies), not entry
    by entry.

    Entries are only ever added or moved (compaction, repair), never removed one by one (a
    deleted ledger drops its whole index). Since the last checkpoint, the new dense slots are
    those from ``cp_n`` on; ids changed in place before it (moves, filled holes) and every
    sparse change are listed in :attr:`changed` (rare).
    """

    __slots__ = ("changed", "cp_n", "end", "first", "holes", "offs", "segs", "sizes",
                 "sparse")

    def __init__(self) -> None:
        #: the entry id of the dense run's slot 0 (set by the first insert into an empty run)
        self.first = 0
        #: ``first + len(sizes)``: the id the write path appends in place
        self.end = 0
        self.segs: array[int] = array("I")
        self.offs: array[int] = array("Q")
        self.sizes: array[int] = array("I")
        #: slots of the dense run with size 0
        self.holes = 0
        #: ids off the dense run -> location (None until the first one: most ledgers have none)
        self.sparse: SortedDict | None = None
        #: how many dense slots the last checkpoint holds
        self.cp_n = 0
        #: ids changed since the last checkpoint other than in the new slots (see above)
        self.changed: list[int] = []

    @classmethod
    def from_columns(cls, cols: EntryColumns, rows: Iterable[tuple[int, Loc]] = ()
                     ) -> EntryIndex:
        """An index holding ``cols`` (taken over, not copied) and ``rows``, all counted as
        checkpointed."""
        out = cls()
        out.add_columns(cols)
        for eid, loc in rows:
            out.put(eid, loc)
        out.mark_checkpointed()
        return out

    def _extend(self, cols: EntryColumns) -> bool:
        """Append ``cols`` (which must not end in a hole) to the dense run if it continues
        it (or the run is empty) and meets no sparse id; False (nothing done) otherwise."""
        n = len(cols.sizes)
        if not n:
            return True
        if len(self.sizes) and cols.first != self.end:
            return False
        if self.sparse and any(True for _ in self.sparse.irange(cols.first, cols.first + n - 1)):
            return False  # (an id both dense and sparse: put them one by one)
        if not len(self.sizes):
            self.first = self.end = cols.first
            self.segs, self.offs, self.sizes = cols.segs, cols.offs, cols.sizes
        else:
            self.segs.extend(cols.segs)
            self.offs.extend(cols.offs)
            self.sizes.extend(cols.sizes)
        self.end += n
        self.holes += cols.sizes.count(0)
        return True

    def add_columns(self, cols: EntryColumns) -> None:
        """Put every entry of ``cols`` (a checkpoint delta's new slots): appended whole when
        they continue the dense run, else one by one."""
        if self._extend(cols):
            return
        first, segs, offs, sizes = cols
        for i, size in enumerate(sizes):
            if size:
                self.put(first + i, (segs[i], offs[i], size))

    def put(self, entry_id: int, loc: Loc) -> Loc | None:
        """Insert or move ``entry_id``; its previous location, if it had one."""
        sparse = self.sparse
        if sparse is not None and entry_id in sparse:
            old: Loc | None = sparse[entry_id]
            sparse[entry_id] = loc
            self.changed.append(entry_id)
            return old
        seg, offset, size = loc
        sizes = self.sizes
        n = len(sizes)
        i = entry_id - self.first
        if 0 <= i < n:
            old = (self.segs[i], self.offs[i], sizes[i]) if sizes[i] else None
            if old is None:
                self.holes -= 1
            self.segs[i], self.offs[i], sizes[i] = seg, offset, size
            if i < self.cp_n:
                self.changed.append(entry_id)
            return old
        if not n and entry_id >= 0:
            self.first = self.end = entry_id
            i = 0
        if n <= i <= n + MAX_GAP and self.holes + i - n <= _HOLES * (n - self.holes) + MAX_GAP:
            gap = i - n
            if gap:  # (zero bytes, no array made: striped ledgers leave a hole every few ids)
                self.segs.frombytes(_ZEROS[: 4 * gap])
                self.offs.frombytes(_ZEROS[: 8 * gap])
                sizes.frombytes(_ZEROS[: 4 * gap])
                self.holes += gap
            self.segs.append(seg)
            self.offs.append(offset)
            sizes.append(size)
            self.end = entry_id + 1
            return None
        if sparse is None:
            sparse = self.sparse = SortedDict()
        sparse[entry_id] = loc
        self.changed.append(entry_id)
        return None

    def append_run(self, ids: list[int], seg: int, offsets: list[int],
                   sizes: list[int]) -> bool:
        """Append entries ``ids`` (strictly ascending, the caller checked) found at
        ``offsets`` of segment ``seg`` with record ``sizes``: the batched write path's index
        update, a few C-level extends per batch rather than three appends per entry. Only
        when they extend the dense run (the first at or past its end, every gap at most
        :data:`MAX_GAP`, no sparse ids); False otherwise, and nothing is changed (the caller
        puts them one by one)."""
        if self.sparse is not None or not ids:
            return False
        n = len(self.sizes)
        first = ids[0]
        end = self.end if n else first
        k = len(ids)
        # the hole budget is :meth:`put`'s, id by id (the same layout either way): here for the
        # first id, and below for the rest when a later gap could exceed what an id adds
        if first < end or first < 0 or first - end > MAX_GAP or (
                self.holes + first - end > _HOLES * (n - self.holes) + MAX_GAP):
            return False
        if ids[-1] - first == k - 1:  # consecutive: the striping-free case (E == Qw)
            if not n:
                self.first = self.end = end
            gap = first - end
            if gap:
                self._holes(gap)
            self.segs.extend(array("I", (seg,)) * k)
            self.offs.extend(offsets)
            self.sizes.extend(sizes)
            self.end = first + k
            return True
        if k >= 4 and self._append_periodic(ids, seg, offsets, sizes, end, n):
            return True
        segs: list[int] = []
        offs: list[int] = []
        szs: list[int] = []
        cur = end
        holes = 0
        held = n - self.holes
        for eid, off, size in zip(ids, offsets, sizes, strict=True):
            gap = eid - cur
            if gap:
                if gap > MAX_GAP or self.holes + holes + gap > _HOLES * held + MAX_GAP:
                    return False
                segs += (0,) * gap
                offs += (0,) * gap
                szs += (0,) * gap
                holes += gap
            segs.append(seg)
            offs.append(off)
            szs.append(size)
            held += 1
            cur = eid + 1
        if not n:
            self.first = self.end = end
        self.segs.extend(segs)
        self.offs.extend(offs)
        self.sizes.extend(szs)
        self.holes += holes
        self.end = cur
        return True

    def _append_periodic(self, ids: list[int], seg: int, offsets: list[int],
                         sizes: list[int], end: int, n: int) -> bool:
        """:meth:`append_run` of striped ids whose holes repeat (a bookie of an E > Qw
        ledger gets Qw of every E ids: ``q`` ids per period of ``p``), by one stride slice
        per column and residue instead of a Python step per entry. False (nothing changed)
        when the ids do not repeat so within the first few periods' shapes."""
        k = len(ids)
        first = ids[0]
        for q in range(1, min(_MAX_PERIOD_IDS, k // 2) + 1):
            p = ids[q] - first
            # every id is the one q places before it plus p (C-level, stops at the first
            # that is not)
            if not all(map(_eq, islice(ids, q, None), map(_add, ids, repeat(p)))):
                continue
            if max(map(_sub, islice(ids, 1, q + 1), ids)) - 1 > min(MAX_GAP, _HOLES):
                return False  # (gaps of at most _HOLES: an id pays for its gap, as in put)
            m = ids[-1] + 1 - end
            segs = array("I", bytes(4 * m))
            offs = array("Q", bytes(8 * m))
            szs = array("I", bytes(4 * m))
            for r in range(q):
                start = ids[r] - end
                count = len(range(start, m, p))
                if count != len(range(r, k, q)):
                    return False  # (a class ends early: not one repeating pattern)
                szs[start::p] = array("I", sizes[r::q])
                offs[start::p] = array("Q", offsets[r::q])
                segs[start::p] = array("I", (seg,)) * count
            if not n:
                self.first = self.end = end
            self.segs.extend(segs)
            self.offs.extend(offs)
            self.sizes.extend(szs)
            self.holes += m - k
            self.end = end + m
            return True
        return False

    def _holes(self, gap: int) -> None:
        """Append ``gap`` empty slots (zero bytes, no array made)."""
        self.segs.frombytes(_ZEROS[: 4 * gap])
        self.offs.frombytes(_ZEROS[: 8 * gap])
        self.sizes.frombytes(_ZEROS[: 4 * gap])
        self.holes += gap

    def get(self, entry_id: int) -> Loc | None:
        i = entry_id - self.first
        if 0 <= i < len(self.sizes):
            size = self.sizes[i]
            if size:
                return (self.segs[i], self.offs[i], size)
        if self.sparse is not None:
            loc: Loc | None = self.sparse.get(entry_id)
            return loc
        return None

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int):
            return False
        i = entry_id - self.first
        if 0 <= i < len(self.sizes) and self.sizes[i]:
            return True
        return self.sparse is not None and entry_id in self.sparse

    def __len__(self) -> int:
        return len(self.sizes) - self.holes + (len(self.sparse) if self.sparse else 0)

    @property
    def last(self) -> int:
        """The highest entry id held, -1 when none."""
        dense = self.end - 1 if len(self.sizes) else -1
        if self.sparse:
            top: int = self.sparse.peekitem(-1)[0]
            return max(dense, top)
        return dense

    def take_changes(self) -> tuple[EntryColumns, dict[int, Loc]]:
        """What changed since the last call (or since this index was built): the new dense
        slots as columns (copies), and the other changed ids with their locations now; from
        here on everything counts as checkpointed."""
        n = self.cp_n
        cols = EntryColumns(self.first + n, self.segs[n:], self.offs[n:], self.sizes[n:])
        rows = {eid: loc for eid in self.changed if (loc := self.get(eid)) is not None}
        self.mark_checkpointed()
        return cols, rows

    def mark_checkpointed(self) -> None:
        """Every entry now counts as checkpointed (a base checkpoint holds them all)."""
        self.cp_n = len(self.sizes)
        self.changed = []

    def snapshot(self) -> tuple[EntryColumns, dict[int, Loc]]:
        """Copies of the dense run's columns and of the sparse part (C-level copies, for a
        checkpoint taken while the index keeps changing)."""
        return (EntryColumns(self.first, self.segs[:], self.offs[:], self.sizes[:]),
                dict(self.sparse or {}))

    def _dense_ids(self, lo: int, hi: int) -> Iterator[int]:
        """Ids held by the dense run within ``[lo, hi]``, ascending."""
        first, sizes = self.first, self.sizes
        start = max(lo - first, 0)
        stop = min(hi - first + 1, len(sizes))
        if self.holes:
            return (first + i for i in range(start, stop) if sizes[i])
        return iter(range(first + start, first + max(stop, start)))

    def irange(self, first: int, last: int) -> Iterator[int]:
        """Entry ids in ``[first, last]``, ascending."""
        dense = self._dense_ids(first, last)
        if self.sparse is None:
            return dense
        return heapq.merge(dense, self.sparse.irange(first, last))

    def __iter__(self) -> Iterator[int]:
        """Entry ids, ascending."""
        return self.irange(-(1 << 63), (1 << 63) - 1)

    def items(self) -> list[tuple[int, Loc]]:
        """``(entry id, location)``, ascending."""
        out = []
        for eid in self:
            loc = self.get(eid)
            assert loc is not None
            out.append((eid, loc))
        return out

    def values(self) -> Iterator[Loc]:
        """The locations, in no particular order."""
        segs, offs, sizes = self.segs, self.offs, self.sizes
        for i, size in enumerate(sizes):
            if size:
                yield (segs[i], offs[i], size)
        if self.sparse is not None:
            yield from self.sparse.values()

    def live_by_segment(self) -> dict[int, int]:
        """Bytes held per segment (what a deleted ledger's entries free)."""
        live: dict[int, int] = {}
        for seg, size in zip(self.segs, self.sizes, strict=True):
            if size:
                live[seg] = live.get(seg, 0) + size
        for seg, _offset, size in (self.sparse or {}).values():
            live[seg] = live.get(seg, 0) + size
        return live

    def _check(self) -> None:
        n = len(self.sizes)
        assert len(self.segs) == len(self.offs) == n
        assert self.end == self.first + n, (self.end, self.first, n)
        assert self.holes == self.sizes.count(0), (self.holes, self.sizes.count(0))
        assert not n or self.sizes[-1], "the dense run ends in a hole"
        assert 0 <= self.cp_n <= n
        for eid in self.sparse or ():
            i = eid - self.first
            assert not (0 <= i < n and self.sizes[i]), f"entry {eid} both dense and sparse"
        assert all(eid in self for eid in self.changed)
        ids = list(self)
        assert ids == sorted(set(ids)), "ids not ascending"


@dataclass(slots=True)
class LedgerState:
    """What this bookie knows about one ledger."""

    master_key: bytes | None = None
    fenced: bool = False
    #: set when the ledger is deleted: the state has then left the index, and only a write
    #: still in flight (whose journal tag holds this object) can see the mark
    deleted: bool = False
    explicit_lac: int = -1
    explicit_lac_body: bytes | None = None
    max_piggyback_lac: int = -1
    #: the highest LAC carried by an add that arrived (written, maybe not durable yet): a
    #: LAC the writer had confirmed, so readers may have it at once; in memory only
    arrived_lac: int = -1
    entries: EntryIndex = field(default_factory=EntryIndex)
    #: entry id -> body of adds written to the journal but not yet durable (not in
    #: ``entries``): a second add of the same entry waits for the first or is refused
    pending: dict[int, bytes] = field(default_factory=dict, repr=False)
    #: batches in flight the same way, whole (the store's batch tags, each with ascending
    #: ``entry_ids`` and their ``bodies``): a clean batch costs one list entry, not a dict
    #: entry per entry; :meth:`pending_body` looks in both
    runs: list[Any] = field(default_factory=list, repr=False)

    def pending_body(self, entry_id: int) -> bytes | None:
        """The body of ``entry_id`` if an add of it is in flight (written, not durable)."""
        body = self.pending.get(entry_id)
        if body is None:
            for run in self.runs:
                ids = run.entry_ids
                if ids[0] <= entry_id <= ids[-1]:
                    i = bisect_left(ids, entry_id)
                    if ids[i] == entry_id:
                        found: bytes = run.bodies[i]
                        return found
        return body

    def pending_items(self) -> Iterator[tuple[int, bytes]]:
        """Every add in flight: (entry id, body)."""
        yield from self.pending.items()
        for run in self.runs:
            yield from zip(run.entry_ids, run.bodies, strict=True)

    def location(self, entry_id: int) -> Location | None:
        """Where ``entry_id`` is stored, or None."""
        loc = self.entries.get(entry_id)
        return None if loc is None else Location(*loc)

    @property
    def lac(self) -> int:
        return max(self.explicit_lac, self.max_piggyback_lac, self.arrived_lac)

    @property
    def last_entry(self) -> int:
        return self.entries.last


class Index:
    """The live ledgers' states, the deleted ledgers' ids, and per-segment live byte counts
    (for compaction)."""

    def __init__(self) -> None:
        #: the ledgers held, not deleted
        self.ledgers: dict[int, LedgerState] = {}
        #: every ledger deleted here (never held again: adds, fences and LAC writes refused)
        self.deleted = IdRanges()
        #: ids deleted since the last :meth:`take_deleted` (what a delta checkpoint records)
        self._deleted_since: list[int] = []
        #: segment seq -> bytes of live ENTRY records located there
        self.seg_live: dict[int, int] = {}

    def get(self, ledger_id: int) -> LedgerState | None:
        """The state of a held ledger; None when unknown *or deleted* (see :meth:`is_deleted`)."""
        return self.ledgers.get(ledger_id)

    def is_deleted(self, ledger_id: int) -> bool:
        return ledger_id in self.deleted

    def ledger(self, ledger_id: int) -> LedgerState:
        """The state of ``ledger_id``, created empty if unknown. ValueError for a deleted
        ledger: it is never held again (callers refuse or skip it first)."""
        state = self.ledgers.get(ledger_id)
        if state is None:
            if ledger_id in self.deleted:
                raise ValueError(f"ledger {ledger_id} was deleted")
            state = self.ledgers[ledger_id] = LedgerState()
        return state

    def put_entry(self, ledger_id: int, entry_id: int, loc: Loc,
                  piggyback_lac: int) -> None:
        """Record a durable entry (ignored for a deleted ledger: its bytes are garbage)."""
        state = self.ledgers.get(ledger_id)
        if state is None:
            if ledger_id in self.deleted:  # (looked up only when the ledger is not held)
                return
            state = self.ledgers[ledger_id] = LedgerState()
        old = state.entries.put(entry_id, loc)
        if old is not None:
            self._sub_live(old[0], old[2])
        seg, _offset, size = loc
        self.seg_live[seg] = self.seg_live.get(seg, 0) + size
        if piggyback_lac > state.max_piggyback_lac:
            state.max_piggyback_lac = piggyback_lac

    def delete_ledger(self, ledger_id: int) -> None:
        """The ledger's entries become garbage, its state leaves the index, its id is
        remembered in :attr:`deleted`."""
        state = self.ledgers.pop(ledger_id, None)
        if state is not None:
            for seg, size in state.entries.live_by_segment().items():
                self._sub_live(seg, size)
            # a write still in flight holds this object (its journal tag): leave it marked
            # and empty, so its completion indexes nothing
            state.entries = EntryIndex()
            state.deleted = True
            state.explicit_lac_body = None
        if self.deleted.add(ledger_id):
            self._deleted_since.append(ledger_id)

    def load_deleted(self, deleted: IdRanges) -> None:
        """Delete (:meth:`delete_ledger`) every held ledger ``deleted`` names and remember
        all its ids, range by range: what a checkpoint delta read from disk says. A range of
        any length costs the same (a malformed delta whose checksum holds may name billions
        of ids: taken one by one, loading never ended and held every id in memory)."""
        for lid in [lid for lid in self.ledgers if lid in deleted]:
            self.delete_ledger(lid)
        for first, last in deleted.ranges():
            self.deleted.add_range(first, last)

    def take_deleted(self) -> list[int]:
        """The ids deleted since the last call (or since this index was built); from here on
        they count as checkpointed."""
        out, self._deleted_since = self._deleted_since, []
        return out

    def live_from_entries(self) -> dict[int, int]:
        """Live bytes per segment summed over every entry held (what :attr:`seg_live` keeps
        up to date; for a checkpoint that does not carry it, and for the checks)."""
        live: dict[int, int] = {}
        for state in self.ledgers.values():
            for seg, n in state.entries.live_by_segment().items():
                live[seg] = live.get(seg, 0) + n
        return live

    def _sub_live(self, seg: int, size: int) -> None:
        left = self.seg_live[seg] - size
        if left:
            self.seg_live[seg] = left
        else:
            del self.seg_live[seg]

    def _check(self) -> None:
        """Assert the internal invariants (called by the stateful tests after every step)."""
        for lid, state in self.ledgers.items():
            assert isinstance(lid, int)
            assert not state.deleted and lid not in self.deleted, f"deleted ledger {lid} held"
            state.entries._check()
            for eid, loc in state.entries.items():
                assert eid >= 0, (lid, eid)
                assert type(loc) is tuple and len(loc) == 3, (lid, eid, loc)
                _seg, offset, size = loc
                assert size > 0 and offset >= 0, (lid, eid, loc)
            assert state.explicit_lac_body is None or state.explicit_lac >= -1
        live = self.live_from_entries()
        assert live == self.seg_live, (live, self.seg_live)
        assert all(lid in self.deleted for lid in self._deleted_since)
        self.deleted._check()
