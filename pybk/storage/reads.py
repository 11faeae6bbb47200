"""The store's read side: entries and ledger state, answered from the index.

"Absent" (NoSuchEntry / NoSuchLedger) is answered only when the index proves it, and never
while the bookie runs over a suspect segment (then it is "unknown", rule R4); an I/O or
checksum error is raised as such, never turned into "absent" (rule R2). Each entry read is
verified (record CRC, ids) before it is returned.
"""

from __future__ import annotations

import posixpath
from typing import NoReturn

from pybk.errors import (
    BKError,
    IOBookieError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnknownLedgerStateError,
)
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, LedgerState
from pybk.storage.journal import segment_name
from pybk.storage.records import decode_entry_at

__all__ = ["ReadsMixin"]


class ReadsMixin:
    """:class:`pybk.storage.store.LedgerStore`'s reads (a mixin: the store's state is one)."""

    fs: FileSystem
    index: Index
    journal_dir: str
    #: ``path@offset`` of each suspect segment the store started over
    suspect: list[str]

    def journal_path(self, seq: int) -> str:
        return posixpath.join(self.journal_dir, segment_name(seq))

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
