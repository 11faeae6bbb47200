"""The db engine's ledger table: per-ledger state, the deleted ids, the write cache (and the
part of it being flushed), and the adds in flight, for
:class:`pybk.storage.dbstore.DbLedgerStore`.

It is the engine's state, explicit: the writes (:mod:`pybk.storage.dbwrites`), the journal
completions there and the reads (:mod:`pybk.storage.dbreads`) are each given this one table.
A durable entry enters the write cache (ledger -> entry -> body); a checkpoint takes the cache
(:meth:`DbLedgers.take_cache`) and writes it into an entry log. Ledger metadata (key, fence,
explicit LAC, deletion) is journaled with the same record types as the journal engine's, so
one replay path (:meth:`DbLedgers.apply`) reads both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pybk.errors import BKError, CorruptRecordError
from pybk.storage.entrylogs import EntryLogs
from pybk.storage.idranges import IdRanges
from pybk.storage.records import Record, RecordType
from pybk.storage.replay import piggyback_lac

__all__ = ["ENTRY_OVERHEAD", "DbLedger", "DbLedgers"]

#: what a cached entry costs in memory besides its body (its bytes object's header, the dict
#: slot, the id): counted against ``db_write_cache_bytes`` so the bound is memory, not payload
ENTRY_OVERHEAD = 120


@dataclass
class DbLedger:
    """What the db engine knows of one ledger (per ledger, never per entry)."""

    master_key: bytes | None = None
    fenced: bool = False
    explicit_lac: int = -1
    explicit_lac_body: bytes | None = None
    max_piggyback_lac: int = -1
    arrived_lac: int = -1
    #: the highest durable entry id, -1 when none
    last: int = -1

    @property
    def lac(self) -> int:
        return max(self.explicit_lac, self.max_piggyback_lac, self.arrived_lac)

    @property
    def last_entry(self) -> int:
        return self.last


class DbLedgers:
    """The db engine's state (see the module docstring). Attributes, not accessors: the
    parts read and change them directly (the cache dicts are replaced at each flush, so a
    part holds the table, never one of them)."""

    def __init__(self, logs: EntryLogs) -> None:
        #: the entry logs (flushed entries; their read-ahead cache)
        self.logs = logs
        #: the ledgers held, not deleted
        self.ledgers: dict[int, DbLedger] = {}
        #: every ledger deleted here
        self.deleted = IdRanges()
        #: the write cache: ledger -> entry -> body, durable in the journal only
        self.cache: dict[int, dict[int, bytes]] = {}
        #: the part of the cache a checkpoint is writing into an entry log
        self.flushing: dict[int, dict[int, bytes]] = {}
        #: the memory the write cache holds (bodies plus :data:`ENTRY_OVERHEAD` each)
        self.cache_bytes = 0
        #: (ledger, entry) -> body of adds journaled, not yet durable
        self.pending: dict[tuple[int, int], bytes] = {}
        #: (ledger, entry) -> callbacks of identical adds waiting for the pending one
        self.waiting: dict[tuple[int, int], list[Callable[[BKError | None], None]]] = {}

    def dump(self) -> dict[str, Any]:
        """The ledgers and deletions, for the checkpoint file."""
        return {"deleted": self.deleted.ranges(),
                "ledgers": {str(lid): [None if st.master_key is None else st.master_key.hex(),
                                       st.fenced, st.explicit_lac,
                                       None if st.explicit_lac_body is None
                                       else st.explicit_lac_body.hex(),
                                       st.max_piggyback_lac, st.last]
                            for lid, st in self.ledgers.items()}}

    def load(self, doc: dict[str, Any]) -> None:
        """The ledgers and deletions a checkpoint file holds (start-up)."""
        self.deleted = IdRanges.from_ranges(tuple(r) for r in doc["deleted"])
        for lid, (key, fenced, elac, ebody, plac, last) in doc["ledgers"].items():
            self.ledgers[int(lid)] = DbLedger(
                None if key is None else bytes.fromhex(key), fenced, elac,
                None if ebody is None else bytes.fromhex(ebody), plac, -1, last)

    def take_cache(self) -> dict[int, dict[int, bytes]]:
        """The write cache to flush (with what a failed flush left); a new one starts."""
        for lid, entries in self.cache.items():
            self.flushing.setdefault(lid, {}).update(entries)
        self.cache, self.cache_bytes = {}, 0
        return self.flushing

    def flushed(self, flushing: dict[int, dict[int, bytes]]) -> None:
        """``flushing`` (:meth:`take_cache`'s) is in an entry log named by a checkpoint."""
        if self.flushing is flushing:
            self.flushing = {}

    def apply(self, rec: Record) -> None:
        """A journal record replayed at start-up."""
        lid, t = rec.ledger_id, rec.rtype
        if lid in self.deleted:
            return
        if t is RecordType.DELETE_LEDGER:
            self.forget(lid)
            return
        if t is RecordType.CHECKPOINT:
            return
        st = self.ledgers.setdefault(lid, DbLedger())
        if t is RecordType.ENTRY:
            self.cached(lid, st, rec.entry_id, rec.data)
        elif t is RecordType.FENCE:
            st.fenced = True
        elif t is RecordType.MASTER_KEY:
            st.master_key = st.master_key or rec.data
        elif rec.lac >= st.explicit_lac:
            st.explicit_lac, st.explicit_lac_body = rec.lac, rec.data

    def cached(self, lid: int, st: DbLedger, eid: int, body: bytes) -> None:
        """A durable entry enters the write cache."""
        entries = self.cache.setdefault(lid, {})
        if eid not in entries:
            entries[eid] = body
            self.cache_bytes += len(body) + ENTRY_OVERHEAD
        st.last = max(st.last, eid)
        st.max_piggyback_lac = max(st.max_piggyback_lac, piggyback_lac(body))

    def cached_run(self, lid: int, st: DbLedger, eids: list[int], bodies: list[bytes],
                   lac: int) -> None:
        """Durable entries of one ledger (a batched add) enter the write cache at once;
        ``lac`` is the highest LAC their bodies carry."""
        entries = self.cache.get(lid)
        if entries is None:
            entries = self.cache[lid] = {}
        if not entries.keys().isdisjoint(eids):  # (some held already: only the others count)
            fresh = [(eid, body) for eid, body in zip(eids, bodies, strict=True)
                     if eid not in entries]
            entries.update(fresh)
            self.cache_bytes += sum(len(body) + ENTRY_OVERHEAD for _, body in fresh)
        else:
            entries.update(zip(eids, bodies, strict=True))
            self.cache_bytes += sum(map(len, bodies)) + ENTRY_OVERHEAD * len(bodies)
        st.last = max(st.last, max(eids))
        st.max_piggyback_lac = max(st.max_piggyback_lac, lac)

    def forget(self, ledger_id: int) -> None:
        """Delete a ledger: its state, cached entries and entry-log runs go."""
        self.deleted.add(ledger_id)
        self.ledgers.pop(ledger_id, None)
        gone = self.cache.pop(ledger_id, {})
        self.cache_bytes -= sum(len(b) + ENTRY_OVERHEAD for b in gone.values())
        self.flushing.pop(ledger_id, None)
        for log_id in self.logs.drop_ledger(ledger_id):
            self.logs.logs.pop(log_id)  # (its files go once a checkpoint no longer names it)

    def same_as_held(self, lid: int, eid: int, body: bytes) -> bool | None:
        """None when ``eid`` is not held, else whether ``body`` equals the held copy. A
        flushed copy is read back only when its stored size is ``body``'s: a small body
        claiming a large held entry cannot make the bookie read that entry (and its
        read-ahead) back."""
        held = self.cache.get(lid, {}).get(eid)
        if held is None:
            held = self.flushing.get(lid, {}).get(eid)
        if held is not None:
            return held == body
        try:
            size = self.logs.size_of(lid, eid)
            if size is None:
                return None
            if size != len(body):
                return False
            stored = self.logs.read(lid, eid)
        except CorruptRecordError:
            return None  # the flushed copy is damaged: the add stores a new one (repair)
        return None if stored is None else stored == body

    def held(self, lid: int, eid: int) -> bytes | None:
        """The body held for ``eid`` (cache, the part being flushed, entry logs), else None."""
        body = self.cache.get(lid, {}).get(eid)
        if body is None:
            body = self.flushing.get(lid, {}).get(eid)
        if body is None:
            body = self.logs.read(lid, eid)
        return body

    def check(self) -> None:
        """Assert the table's invariants (stateful tests)."""
        for lid in (*self.cache, *self.flushing):
            assert lid in self.ledgers and lid not in self.deleted, lid
        for lid, entries in self.cache.items():
            assert self.ledgers[lid].last >= max(entries, default=-1), lid
