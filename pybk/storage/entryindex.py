"""One ledger's entries in the bookie's index: entry id -> where its ENTRY record lives.

:class:`EntryIndex` keeps a ledger's locations in three parallel ``array`` columns (a dense
run) plus a sorted dict for the ids off that run, so a bookie's index costs about 16 bytes
an entry rather than a dict slot and a tuple; :class:`EntryColumns` is a run of it as
checkpoints copy and write it. Kept apart from :mod:`pybk.storage.index` (the ledgers'
states and the deleted ids), which holds one of these per ledger.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Iterator
from itertools import islice, repeat
from operator import add as _add
from operator import eq as _eq
from operator import sub as _sub
from typing import Final, NamedTuple

from sortedcontainers import SortedDict

__all__ = ["MAX_GAP", "EntryColumns", "EntryIndex", "Loc", "empty_columns"]


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
