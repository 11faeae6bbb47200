"""The db engine's reads: entries (the write cache, the part of it being flushed, then the
entry logs through their read-ahead cache) and ledger state, for
:class:`pybk.storage.dbstore.DbLedgerStore`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pybk.errors import (
    BKError,
    CorruptRecordError,
    IOBookieError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnknownLedgerStateError,
)
from pybk.storage.dbledgers import DbLedger, DbLedgers
from pybk.storage.idranges import IdRanges
from pybk.storage.reads import READ_MAX_ABSENT
from pybk.storage.records import RECORD_HEADER_SIZE
from pybk.wire import Status

__all__ = ["DbReads"]


class DbReads:
    """The db engine's read part; given the ledger table and the store's suspect journal
    segments (while there are any, "absent" is "unknown": rule R4, as the journal engine)."""

    def __init__(self, table: DbLedgers, suspect: list[str]) -> None:
        self._t = table
        self._suspect = suspect

    def _absent(self, what: str, cls: type[BKError]) -> BKError:
        if self._suspect:
            return UnknownLedgerStateError(
                f"{what}, but this bookie started with suspect journal segments "
                f"({', '.join(self._suspect)}) and may have lost it: unknown, not absent")
        return cls(what)

    def find(self, ledger_id: int) -> DbLedger | None:
        return self._t.ledgers.get(ledger_id)

    def is_deleted(self, ledger_id: int) -> bool:
        return ledger_id in self._t.deleted

    def state(self, ledger_id: int) -> DbLedger:
        st = self._t.ledgers.get(ledger_id)
        if st is None:
            if ledger_id in self._t.deleted:
                raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
            raise self._absent(f"ledger {ledger_id} is not on this bookie", NoSuchLedgerError)
        return st

    def read(self, ledger_id: int, entry_id: int) -> bytes:
        st = self.state(ledger_id)
        if entry_id == -1:
            entry_id = st.last
        body = self._t.held(ledger_id, entry_id) if entry_id >= 0 else None
        if body is None:
            raise self._absent(f"ledger {ledger_id} entry {entry_id} is not on this bookie",
                               NoSuchEntryError)
        return body

    def read_many(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int,
                  max_absent: int = READ_MAX_ABSENT,
                  ) -> tuple[list[tuple[int, Status, bytes | None]], dict[int, BKError]]:
        self.state(ledger_id)
        out: list[tuple[int, Status, bytes | None]] = []
        errors: dict[int, BKError] = {}
        total = absent = 0
        ahead: dict[int, bytes] = {}
        cached = self._t.cache.get(ledger_id, {})
        for i, eid in enumerate(entry_ids):
            if eid not in ahead and eid not in cached and eid >= 0:
                # a run of ascending ids off the entry logs in two preads
                n = 1
                while (i + n < len(entry_ids) and entry_ids[i + n] == eid + n
                       and n < 1024):
                    n += 1
                if n > 1:
                    try:
                        run = self._t.logs.read_run(ledger_id, eid, n, max_bytes - total)
                    except OSError as exc:
                        raise IOBookieError(f"ledger {ledger_id}: {exc}") from None
                    except CorruptRecordError:
                        run = []  # (a damaged row: each read below says which entry)
                    ahead = dict(zip(range(eid, eid + len(run)), run, strict=True))
            try:
                body = ahead.get(eid) or self.read(ledger_id, eid)
            except BKError as exc:
                errors[len(out)] = exc
                out.append((eid, exc.status, None))
                absent += 1
                if absent >= max_absent:
                    break
                continue
            out.append((eid, Status.OK, body))
            total += len(body)
            if total >= max_bytes:
                break
        return out, errors

    def read_range(self, ledger_id: int, first: int, last: int) -> list[tuple[int, bytes]]:
        return [(eid, self.read(ledger_id, eid)) for eid in self._ids(ledger_id)
                if first <= eid <= last]

    def lac(self, ledger_id: int) -> int:
        st = self._t.ledgers.get(ledger_id)
        return -1 if st is None else st.lac

    def entry_size(self, ledger_id: int, entry_id: int) -> int | None:
        body = self._t.cache.get(ledger_id, {}).get(entry_id)
        if body is None:
            body = self._t.flushing.get(ledger_id, {}).get(entry_id)
        if body is not None:
            return RECORD_HEADER_SIZE + len(body)
        try:
            size = self._t.logs.size_of(ledger_id, entry_id) if entry_id >= 0 else None
        except BKError:  # (a damaged location row: a size hint has none; a read says why)
            return None
        return None if size is None else RECORD_HEADER_SIZE + size

    def _ids(self, ledger_id: int) -> list[int]:
        self.state(ledger_id)
        ids = set(self._t.logs.entry_ids(ledger_id))
        ids.update(self._t.flushing.get(ledger_id, ()))
        ids.update(self._t.cache.get(ledger_id, ()))
        return sorted(ids)

    def ranges(self, ledger_id: int) -> tuple[tuple[int, int], ...]:
        return tuple(IdRanges(self._ids(ledger_id)).ranges())

    def ledger_ids(self) -> list[int]:
        return sorted(self._t.ledgers)
