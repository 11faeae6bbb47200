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

from collections.abc import Iterable, Iterator, ValuesView
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

from sortedcontainers import SortedList

from pybk.storage.idranges import IdRanges


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
    is a sortedcontainers ``SortedList`` of the ids, brought up to date when it is used, and
    the highest id is tracked as entries arrive. Why: a ``SortedDict`` insert costs about ten
    dict inserts in CPython and the write path paid it for every entry of every ledger, while
    ordered questions are rare and the highest id is all "read the last entry" needs.

    Entries are only ever added or moved (compaction, repair), never removed one by one (a
    deleted ledger drops its whole index), and a dict keeps its keys in insertion order, so
    the ids added since any moment are the dict's last ``len - n`` keys: the ordered view and
    the index checkpoints (which write only what changed since the last one) each remember a
    count, and the write path pays nothing per entry for either. Moves change a value in
    place, so the ids moved since the last checkpoint are listed (:attr:`moved`, rare).

    The values are plain tuples, not :class:`Location`: the garbage collector stops tracking a
    plain tuple of ints after its first collection but tracks a NamedTuple forever, so an
    index of Locations made every full collection walk every entry the bookie holds."""

    __slots__ = ("_ids", "_n_ordered", "last", "locs", "moved", "n_checkpointed")

    def __init__(self, items: Iterable[tuple[int, Loc]] = ()) -> None:
        #: entry id -> location (the write path inserts here directly, see :meth:`add_new`)
        self.locs: dict[int, Loc] = dict(items)
        self._ids = SortedList(self.locs)
        #: how many of the dict's first keys the ordered view holds
        self._n_ordered = len(self.locs)
        #: how many of the dict's first keys the last checkpoint holds (see take_changes)
        self.n_checkpointed = len(self.locs)
        #: ids whose location changed in place since the last checkpoint
        self.moved: list[int] = []
        #: the highest entry id held, -1 when none
        self.last: int = self._ids[-1] if self._ids else -1

    def add_new(self, entry_id: int, loc: Loc) -> None:
        """Insert an id the index does not hold yet (the caller checked: the hot path)."""
        self.locs[entry_id] = loc
        if entry_id > self.last:
            self.last = entry_id

    def __setitem__(self, entry_id: int, loc: Loc) -> None:
        if entry_id in self.locs:
            self.locs[entry_id] = loc
            self.moved.append(entry_id)
        else:
            self.add_new(entry_id, loc)

    def get(self, entry_id: int) -> Loc | None:
        return self.locs.get(entry_id)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self.locs

    def __len__(self) -> int:
        return len(self.locs)

    def _added_since(self, n: int) -> list[int]:
        """The ids inserted after the dict's first ``n`` keys (its tail), newest first."""
        return list(islice(reversed(self.locs), len(self.locs) - n))

    def _ordered(self) -> SortedList:
        if len(self.locs) > self._n_ordered:
            self._ids.update(self._added_since(self._n_ordered))
            self._n_ordered = len(self.locs)
        return self._ids

    def take_changes(self) -> dict[int, Loc]:
        """The ids added or moved since the last call (or since this index was built), with
        their locations now; from here on they count as checkpointed."""
        changed = self._added_since(self.n_checkpointed)
        changed += self.moved
        self.n_checkpointed = len(self.locs)
        self.moved = []
        locs = self.locs
        return {eid: locs[eid] for eid in changed}

    def mark_checkpointed(self) -> None:
        """Every entry now counts as checkpointed (a base checkpoint holds them all)."""
        self.n_checkpointed = len(self.locs)
        self.moved = []

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
        assert self.n_checkpointed <= len(self.locs)
        assert all(eid in self.locs for eid in self.moved)


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
        old = state.entries.get(entry_id)
        if old is not None:
            self._sub_live(old)
        seg, offset, size = loc
        state.entries[entry_id] = (seg, offset, size)
        self.seg_live[seg] = self.seg_live.get(seg, 0) + size
        if piggyback_lac > state.max_piggyback_lac:
            state.max_piggyback_lac = piggyback_lac

    def delete_ledger(self, ledger_id: int) -> None:
        """The ledger's entries become garbage, its state leaves the index, its id is
        remembered in :attr:`deleted`."""
        state = self.ledgers.pop(ledger_id, None)
        if state is not None:
            for loc in state.entries.values():
                self._sub_live(loc)
            # a write still in flight holds this object (its journal tag): leave it marked
            # and empty, so its completion indexes nothing
            state.entries = EntryIndex()
            state.deleted = True
            state.explicit_lac_body = None
        if self.deleted.add(ledger_id):
            self._deleted_since.append(ledger_id)

    def take_deleted(self) -> list[int]:
        """The ids deleted since the last call (or since this index was built); from here on
        they count as checkpointed."""
        out, self._deleted_since = self._deleted_since, []
        return out

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
            assert not state.deleted and lid not in self.deleted, f"deleted ledger {lid} held"
            state.entries._check()
            for eid, loc in state.entries.items():
                assert eid >= 0, (lid, eid)
                assert type(loc) is tuple and len(loc) == 3, (lid, eid, loc)  # plain (see above)
                seg, offset, size = loc
                assert size > 0 and offset >= 0, (lid, eid, loc)
                live[seg] = live.get(seg, 0) + size
            assert state.explicit_lac_body is None or state.explicit_lac >= -1
        assert live == self.seg_live, (live, self.seg_live)
        assert all(lid in self.deleted for lid in self._deleted_since)
