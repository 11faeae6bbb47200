"""The store's read side: entries and ledger state, answered from the index.

"Absent" (NoSuchEntry / NoSuchLedger) is answered only when the index proves it, and never
while the bookie runs over a suspect segment (then it is "unknown", rule R4); an I/O or
checksum error is raised as such, never turned into "absent" (rule R2). Each entry read is
verified (record CRC, ids) before it is returned.
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Sequence
from typing import Final, NoReturn

from pybk.errors import (
    BKError,
    CorruptRecordError,
    IOBookieError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnknownLedgerStateError,
)
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, LedgerState
from pybk.storage.journal import segment_name
from pybk.storage.records import decode_entry_at, decode_entry_in

__all__ = ["ReadsMixin"]

#: a batched read reads two records of one segment with one pread when at most this many
#: bytes lie between them (what a syscall costs against reading a few KiB more)
_COALESCE: Final = 4096


@functools.lru_cache(maxsize=1024)
def _segment_path(journal_dir: str, seq: int) -> str:
    """A segment's path (every read names one: made once, not per read)."""
    return posixpath.join(journal_dir, segment_name(seq))


class ReadsMixin:
    """:class:`pybk.storage.store.LedgerStore`'s reads (a mixin: the store's state is one)."""

    fs: FileSystem
    index: Index
    journal_dir: str
    #: ``path@offset`` of each suspect segment the store started over
    suspect: list[str]

    def journal_path(self, seq: int) -> str:
        return _segment_path(self.journal_dir, seq)

    def state(self, ledger_id: int) -> LedgerState:
        """The ledger's state; NoSuchLedgerError when unknown or deleted."""
        st = self.index.get(ledger_id)
        if st is None:
            if self.index.is_deleted(ledger_id):
                raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
            self._absent(f"ledger {ledger_id} is not on this bookie", NoSuchLedgerError)
        return st

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

    def read_many(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int,
                  ) -> list[tuple[int, BKError | None, bytes | None]]:
        """``(entry id, error, body)`` for a prefix of ``entry_ids`` (the batched read): each
        verified like :meth:`read`, each failing alone (absent, unknown, corrupt, I/O). Stops
        once the bodies reach ``max_bytes`` (at least one entry is read). Records near each
        other in one segment (a batch a writer sent, neighbours in a group commit) are read
        with one ``pread``. NoSuchLedgerError (or UnknownLedgerStateError) for the whole
        ledger is raised."""
        st = self.state(ledger_id)
        entries = st.entries
        fs = self.fs
        out: list[tuple[int, BKError | None, bytes | None]] = []
        total = 0
        i, n = 0, len(entry_ids)
        while i < n and (total < max_bytes or not out):
            eid = entry_ids[i]
            loc = entries.get(eid) if eid >= 0 else None
            if loc is None:
                out.append((eid, self._absent_error(ledger_id, eid), None))
                i += 1
                continue
            seg, start, size = loc
            run = [(eid, start, size)]
            end = start + size
            budget = max_bytes - total
            j = i + 1
            while j < n and end - start < budget:
                nxt = entries.get(entry_ids[j]) if entry_ids[j] >= 0 else None
                if nxt is None or nxt[0] != seg or not end <= nxt[1] <= end + _COALESCE:
                    break
                run.append((entry_ids[j], nxt[1], nxt[2]))
                end = nxt[1] + nxt[2]
                j += 1
            path = self.journal_path(seg)
            try:
                data = fs.pread(path, start, end - start)
            except OSError as exc:
                if len(run) == 1:
                    out.append((eid, IOBookieError(
                        f"reading ledger {ledger_id} entry {eid} from {path}@{start}: {exc}"),
                        None))
                else:  # each on its own: damage in one record, or between records, must
                    # not fail the others
                    for e, _off, sz in run:
                        try:
                            body = self.read(ledger_id, e)
                        except (IOBookieError, CorruptRecordError) as one:
                            out.append((e, one, None))
                            continue
                        out.append((e, None, body))
                        total += sz
            else:
                for e, off, sz in run:
                    try:
                        body = decode_entry_in(data, off - start, sz, path, off, ledger_id, e)
                    except CorruptRecordError as exc:
                        out.append((e, exc, None))
                        continue
                    out.append((e, None, body))
                    total += sz
            i = j
        return out

    def _absent_error(self, ledger_id: int, entry_id: int) -> BKError:
        what = f"ledger {ledger_id} entry {entry_id} is not on this bookie"
        try:
            self._absent(what, NoSuchEntryError)
        except BKError as exc:
            return exc

    def read_range(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        """(entry id, body) for the entries held in [first, last], ascending; each verified
        like :meth:`read` (a damaged one raises, it is never skipped)."""
        st = self.state(ledger_id)
        return [(int(eid), self.read(ledger_id, int(eid)))
                for eid in st.entries.irange(first, last)]

    def lac(self, ledger_id: int) -> int:
        st = self.index.get(ledger_id)
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
        return sorted(self.index.ledgers)
