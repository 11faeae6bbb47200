"""The bookie's index: where each entry lives, and what the bookie knows about each ledger.

Per ledger: an :class:`~pybk.storage.entryindex.EntryIndex` entry id -> location (segment
seq, offset, size of the framed record) and the ledger's state (master key, fenced, explicit
LAC, highest piggybacked LAC).
A deleted ledger's state leaves the index and only its id stays, in :attr:`Index.deleted`
(compact ranges: deletions never end on a bookie under rolling logs). The index holds only
*durable* entries: the store applies an entry after the fsync that covers it, so "not in the
index" means "never durably written here" (R2, I9).

The index is checkpointed (:mod:`pybk.storage.checkpoint`) together with the journal position
it covers; start-up loads it and replays the journal after that position, or rebuilds from
every segment when a checkpoint file is missing or damaged.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pybk.storage.entryindex import EntryIndex, Loc
from pybk.storage.idranges import IdRanges

__all__ = ["Index", "LedgerState", "Location", "Position"]


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
