"""The store's read side: entries and ledger state, answered from the index.

"Absent" (NoSuchEntry / NoSuchLedger) is answered only when the index proves it, and never
while the bookie runs over a suspect segment (then it is "unknown", rule R4); an I/O or
checksum error is raised as such, never turned into "absent" (rule R2). Each entry read is
verified (record CRC, ids) before it is returned.
"""

from __future__ import annotations

import enum
import functools
import posixpath
from collections.abc import Sequence
from typing import Final, NoReturn

import crc32c

from pybk.errors import (
    BKError,
    CorruptRecordError,
    IOBookieError,
    NoSuchEntryError,
    NoSuchLedgerError,
    Status,
    UnknownLedgerStateError,
    status_of,
)
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, LedgerState
from pybk.storage.journal import segment_name
from pybk.storage.records import (
    ENTRY_CRC,
    ENTRY_RECORD_IDS,
    ENTRY_TYPE,
    RECORD_HEADER_SIZE,
    decode_entry_at,
    decode_entry_in,
)

__all__ = ["READ_MAX_ABSENT", "Held", "StoreReads"]

#: a batched read reads two records of one segment with one pread when at most this many
#: bytes lie between them (what a syscall costs against reading a few KiB more)
_COALESCE: Final = 4096
#: a batched read's answer stops after this many ids the index does not hold (the reader
#: asks for the rest again): what one request can make the bookie look up for nothing
READ_MAX_ABSENT: Final = 1024
_RECORD_IDS_SIZE: Final = ENTRY_RECORD_IDS.size
_crc32c = crc32c.crc32c


@functools.lru_cache(maxsize=1024)
def _segment_path(journal_dir: str, seq: int) -> str:
    """A segment's path (every read names one: made once, not per read)."""
    return posixpath.join(journal_dir, segment_name(seq))


class Held(enum.Enum):
    """How an add's body compares with the copy of its entry held (:meth:`compare_held`)."""

    SAME = "same"
    DIFFERENT = "different"
    DAMAGED = "damaged"  # unreadable or failing its checksum: the add repairs it


class StoreReads:
    """:class:`pybk.storage.store.LedgerStore`'s read part. It is given what reads need and
    nothing else: the filesystem, the journal's directory, the index, and the store's list
    of suspect segments (the same list object: start-up extends it)."""

    def __init__(self, fs: FileSystem, journal_dir: str, index: Index,
                 suspect: list[str]) -> None:
        self.fs = fs
        self.journal_dir = journal_dir
        self._index = index
        #: ``path@offset`` of each suspect segment the store started over
        self.suspect = suspect

    def adopt(self, index: Index) -> None:
        """Answer from ``index`` from now on (start-up's, replacing the empty one)."""
        self._index = index

    def journal_path(self, seq: int) -> str:
        return _segment_path(self.journal_dir, seq)

    def state(self, ledger_id: int) -> LedgerState:
        """The ledger's state; NoSuchLedgerError when unknown or deleted."""
        st = self._index.get(ledger_id)
        if st is None:
            if self._index.is_deleted(ledger_id):
                raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
            self._absent(f"ledger {ledger_id} is not on this bookie", NoSuchLedgerError)
        return st

    def find(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state, or None when unknown or deleted (each add asks: one lookup)."""
        return self._index.ledgers.get(ledger_id)

    def is_deleted(self, ledger_id: int) -> bool:
        return self._index.is_deleted(ledger_id)

    def entry_size(self, ledger_id: int, entry_id: int) -> int | None:
        """The record size of a held entry (from the index, no disk access), else None."""
        st = self._index.get(ledger_id)
        loc = None if st is None or entry_id < 0 else st.entries.get(entry_id)
        return None if loc is None else loc[2]

    def _absent(self, what: str, cls: type[BKError]) -> NoReturn:
        """Raise "absent", or "unknown" while data may have been lost (rule R4: a bookie that
        started without part of a suspect segment cannot prove absence; it is in limbo)."""
        if self.suspect:
            raise UnknownLedgerStateError(
                f"{what}, but this bookie started with suspect journal segments "
                f"({', '.join(self.suspect)}) and may have lost it: unknown, not absent")
        raise cls(what)

    def read(self, ledger_id: int, entry_id: int) -> bytes:
        """The stored framed entry; ``entry_id == -1`` reads the last one held."""
        st = self.state(ledger_id)
        if entry_id == -1:
            entry_id = st.entries.last
            if entry_id < 0:
                self._absent(f"ledger {ledger_id} holds no entries on this bookie",
                             NoSuchEntryError)
        loc = st.entries.get(entry_id)
        if loc is None:
            self._absent(f"ledger {ledger_id} entry {entry_id} is not on this bookie",
                         NoSuchEntryError)
        seg, offset, size = loc
        path = self.journal_path(seg)
        try:
            data = self.fs.pread(path, offset, size)
        except OSError as exc:
            raise IOBookieError(
                f"reading ledger {ledger_id} entry {entry_id} from {path}@{offset}: {exc}"
            ) from None
        return decode_entry_at(data, path, offset, ledger_id, entry_id)

    def compare_held(self, ledger_id: int, st: LedgerState, entry_id: int,
                     body: bytes) -> Held:
        """How ``body`` compares with the held copy of ``entry_id``. The index's record size
        decides first, with no disk access: a body of another length differs. Only a body
        of the stored length is read back and compared, so checking a duplicate add reads
        at most the bytes the request carried (a small body claiming a large held entry
        cannot make the bookie read that entry back)."""
        loc = st.entries.get(entry_id)
        if loc is None or loc[2] != RECORD_HEADER_SIZE + len(body):
            return Held.DIFFERENT
        try:
            stored = self.read(ledger_id, entry_id)
        except (CorruptRecordError, IOBookieError):
            return Held.DAMAGED
        return Held.SAME if stored == body else Held.DIFFERENT

    def read_many(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int,
                  max_absent: int = READ_MAX_ABSENT,
                  ) -> tuple[list[tuple[int, Status, bytes | None]], dict[int, BKError]]:
        """The batched read: ``(entries, errors)``. ``entries`` holds ``(entry id, status,
        body)`` for a prefix of ``entry_ids`` (the form a batched read's answer carries);
        ``errors`` maps the position in ``entries`` of each entry that failed (absent,
        unknown, corrupt, I/O: each fails alone, its status that error's) to its error. Each
        body is verified like :meth:`read`. Stops once the bodies reach ``max_bytes`` (at
        least one entry is read), and once ``max_absent`` ids were not held (answering
        an id costs a lookup even when it carries no bytes: a request of absent ids is
        budgeted by their count). Records near each other in one segment (a batch a writer
        sent, neighbours in a group commit) are read with one ``pread``. NoSuchLedgerError (or
        UnknownLedgerStateError) for the whole ledger is raised.

        The read path's hot loop (once per entry read): locations come straight from the
        index's dense columns (no location tuple), each record is checked with one unpack and
        one CRC; anything unusual (a sparse id, a record that does not check out) takes the
        general path (:meth:`EntryIndex.get`, :func:`decode_entry_in`) for its answer."""
        st = self.state(ledger_id)
        entries = st.entries
        first, segs, offs, sizes = entries.first, entries.segs, entries.offs, entries.sizes
        dense = len(sizes)
        fs = self.fs
        out: list[tuple[int, Status, bytes | None]] = []
        append = out.append
        errors: dict[int, BKError] = {}
        unpack, crc32c = ENTRY_RECORD_IDS.unpack_from, _crc32c
        ok, entry_type, entry_crc, hsize = Status.OK, ENTRY_TYPE, ENTRY_CRC, RECORD_HEADER_SIZE
        total = absent = 0
        i, n = 0, len(entry_ids)
        while i < n and (total < max_bytes or not out) and absent < max_absent:
            eid = entry_ids[i]
            k = eid - first
            if 0 <= k < dense and sizes[k]:
                seg, start, size = segs[k], offs[k], sizes[k]
            else:
                loc = entries.get(eid) if eid >= 0 else None
                if loc is None:
                    err = self._absent_error(ledger_id, eid)
                    errors[len(out)] = err
                    append((eid, status_of(err), None))
                    absent += 1
                    i += 1
                    continue
                total += self._read_one(ledger_id, eid, loc, out, errors)
                i += 1
                continue
            budget = max_bytes - total
            span = self._span(entry_ids, i, seg, start, size, budget, first, segs, offs, sizes)
            if span:  # every id left lies in one stretch of this segment: one pread
                j, end = n, start + span
            else:  # the run of neighbours one pread reads
                end = start + size
                j = i + 1
                while j < n and end - start < budget:
                    k = entry_ids[j] - first
                    if not 0 <= k < dense:
                        break
                    sz = sizes[k]
                    off = offs[k]
                    if not sz or segs[k] != seg or not end <= off <= end + _COALESCE:
                        break
                    end = off + sz
                    j += 1
            path = self.journal_path(seg)
            try:
                data = fs.pread(path, start, end - start)
            except OSError as exc:
                if j - i > 1:  # the entries one at a time then, only the unreadable failing
                    i, total = self._read_singly(ledger_id, entry_ids, i, j, max_bytes, total,
                                                 out, errors)
                    continue
                err = IOBookieError(f"reading ledger {ledger_id} from {path}@{start}: {exc}")
                errors[len(out)] = err
                append((eid, status_of(err), None))
                i = j
                continue
            got = min(len(data), end - start)
            m = i
            while m < j and (total < max_bytes or not out) and absent < max_absent:
                e = entry_ids[m]
                m += 1
                k = e - first
                if not 0 <= k < dense or not sizes[k]:  # (a span's own check: not held)
                    loc = entries.get(e) if e >= 0 else None
                    if loc is None:
                        err = self._absent_error(ledger_id, e)
                        errors[len(out)] = err
                        append((e, status_of(err), None))
                        absent += 1
                    else:
                        total += self._read_one(ledger_id, e, loc, out, errors)
                    continue
                sz = sizes[k]
                pos = offs[k] - start
                stop = pos + sz
                if segs[k] != seg or pos < 0 or stop > got:  # (a span: moved elsewhere)
                    total += self._read_one(ledger_id, e, (segs[k], offs[k], sz), out, errors)
                    continue
                if sz >= _RECORD_IDS_SIZE:
                    length, crc, rtype, lid, eid_in = unpack(data, pos)
                    if (rtype == entry_type and length == sz - hsize and lid == ledger_id
                            and eid_in == e):
                        body = data[pos + hsize:stop]
                        if crc32c(body, entry_crc) == crc:
                            append((e, ok, body))
                            total += sz
                            continue
                try:  # the general path, for the error
                    body = decode_entry_in(data, pos, sz, path, offs[k], ledger_id, e)
                except CorruptRecordError as exc:
                    errors[len(out)] = exc
                    append((e, status_of(exc), None))
                    continue
                append((e, ok, body))
                total += sz
            i = m
        return out, errors

    @staticmethod
    def _span(entry_ids: Sequence[int], i: int, seg: int, start: int, size: int, budget: int,
              first: int, segs: Sequence[int], offs: Sequence[int], sizes: Sequence[int],
              ) -> int:
        """The bytes from ``start`` to the end of the record of the last id of
        ``entry_ids[i:]`` when that record is in the same segment after it and the stretch is
        not much more than the entries themselves (at most 3x their bytes at ``size`` each,
        bounded by the budget): the common batched read (a reader's ids of one bookie,
        written together) then costs one ``pread`` and no walk over the ids to find it.
        0 otherwise. Each entry is still checked to lie inside it."""
        n = len(entry_ids)
        if n - i < 4:
            return 0
        k = entry_ids[n - 1] - first
        if not 0 <= k < len(sizes) or not sizes[k] or segs[k] != seg or offs[k] < start:
            return 0
        span = offs[k] + sizes[k] - start
        if span > 3 * min(budget, (n - i) * size) + _COALESCE:
            return 0
        return span

    def _read_singly(self, ledger_id: int, entry_ids: Sequence[int], i: int, j: int,
                     max_bytes: int, total: int, out: list[tuple[int, Status, bytes | None]],
                     errors: dict[int, BKError]) -> tuple[int, int]:
        """:meth:`read_many`'s answers for ``entry_ids[i:j]`` read one by one (a stretch whose
        one ``pread`` failed: only the unreadable records fail, each once); (the position
        reached, the bytes answered so far)."""
        entries = self.state(ledger_id).entries
        while i < j and (total < max_bytes or not out):
            eid = entry_ids[i]
            i += 1
            loc = entries.get(eid) if eid >= 0 else None
            if loc is None:
                err = self._absent_error(ledger_id, eid)
                errors[len(out)] = err
                out.append((eid, status_of(err), None))
                continue
            total += self._read_one(ledger_id, eid, loc, out, errors)
        return i, total

    def _read_one(self, ledger_id: int, entry_id: int, loc: tuple[int, int, int],
                  out: list[tuple[int, Status, bytes | None]], errors: dict[int, BKError],
                  ) -> int:
        """:meth:`read_many`'s read of one entry the index's dense columns do not hold: its
        answer appended to ``out`` (and ``errors``); the bytes read."""
        seg, offset, size = loc
        path = self.journal_path(seg)
        try:
            data = self.fs.pread(path, offset, size)
            body = decode_entry_at(data, path, offset, ledger_id, entry_id)
        except OSError as exc:
            err: BKError = IOBookieError(
                f"reading ledger {ledger_id} entry {entry_id} from {path}@{offset}: {exc}")
        except CorruptRecordError as exc:
            err = exc
        else:
            out.append((entry_id, Status.OK, body))
            return size
        errors[len(out)] = err
        out.append((entry_id, status_of(err), None))
        return 0

    def _absent_error(self, ledger_id: int, entry_id: int) -> BKError:
        """:meth:`_absent`'s error, made and not raised: a batched read answers many absent
        ids, and a raised-and-caught exception per id left a reference cycle each (its
        traceback holds the frame that holds it) for the collector to find."""
        what = f"ledger {ledger_id} entry {entry_id} is not on this bookie"
        if self.suspect:
            return UnknownLedgerStateError(
                f"{what}, but this bookie started with suspect journal segments "
                f"({', '.join(self.suspect)}) and may have lost it: unknown, not absent")
        return NoSuchEntryError(what)

    def read_range(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        """(entry id, body) for the entries held in [first, last], ascending; each verified
        like :meth:`read` (a damaged one raises, it is never skipped)."""
        st = self.state(ledger_id)
        return [(int(eid), self.read(ledger_id, int(eid)))
                for eid in st.entries.irange(first, last)]

    def lac(self, ledger_id: int) -> int:
        st = self._index.get(ledger_id)
        return -1 if st is None else st.lac

    def ranges(self, ledger_id: int) -> tuple[tuple[int, int], ...]:
        st = self.state(ledger_id)
        out: list[tuple[int, int]] = []
        first = prev = None
        for eid in st.entries:
            if prev is not None and eid == prev + 1:
                prev = eid
                continue
            if first is not None and prev is not None:
                out.append((first, prev))
            first = prev = eid
        if first is not None and prev is not None:
            out.append((first, prev))
        return tuple(out)

    def ledger_ids(self) -> list[int]:
        """Ledgers held (not deleted), ascending."""
        return sorted(self._index.ledgers)
