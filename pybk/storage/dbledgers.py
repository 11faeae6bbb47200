"""The db engine's ledgers: per-ledger state, the write cache, and the adds, fences, LAC
writes, deletions and reads of :class:`pybk.storage.dbstore.DbLedgerStore`.

An add is journaled; once the fsync that covers it returns, the entry enters the write cache
(ledger -> entry -> body) and its caller is answered. Reads look in the write cache, the part
of it being flushed, then the entry logs (through their read-ahead cache). Ledger metadata
(key, fence, explicit LAC, deletion) takes effect in memory at once and is journaled with
the same record types as the journal engine's, so one replay path reads both.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pybk.errors import (
    BadRequestError,
    BKError,
    EntryExistsError,
    IOBookieError,
    LedgerFencedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    UnauthorizedError,
    fresh_copy,
)
from pybk.storage.config import MAX_MASTER_KEY_SIZE, StoreConfig
from pybk.storage.entrylogs import EntryLogs
from pybk.storage.idranges import IdRanges
from pybk.storage.journal import Journal
from pybk.storage.reads import READ_MAX_ABSENT
from pybk.storage.records import (
    RECORD_HEADER_SIZE,
    Record,
    RecordType,
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
)
from pybk.storage.replay import piggyback_lac
from pybk.storage.writes import AddCallback, BatchCallback, ResolveFuture
from pybk.wire import ENTRY_HEADER_SIZE, Status

__all__ = ["DbLedger", "DbLedgersMixin"]

_IDS = struct.Struct(">qq")
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


@dataclass
class _Batch:
    """The journal tag of one batched add's new entries (one append)."""

    ledger_id: int
    entry_ids: list[int]
    bodies: list[bytes]
    on_done: Callable[[BKError | None], None]


def _bk(exc: BaseException) -> BKError:
    return exc if isinstance(exc, BKError) else IOBookieError(str(exc))


class DbLedgersMixin:
    """See the module docstring."""

    journal: Journal
    logs: EntryLogs
    config: StoreConfig
    suspect: list[str]

    def _cache_full(self) -> None:
        raise NotImplementedError

    def _init_ledgers(self, on_change: Callable[[int], None]) -> None:
        self._ledgers: dict[int, DbLedger] = {}
        self._deleted = IdRanges()
        self._cache: dict[int, dict[int, bytes]] = {}
        self._flushing: dict[int, dict[int, bytes]] = {}
        self.cache_bytes = 0
        self._pending: dict[tuple[int, int], bytes] = {}
        self._waiting: dict[tuple[int, int], list[AddCallback]] = {}
        self._on_change = on_change

    # ================================================================== persistence

    def _dump_ledgers(self) -> dict[str, Any]:
        return {"deleted": self._deleted.ranges(),
                "ledgers": {str(lid): [None if st.master_key is None else st.master_key.hex(),
                                       st.fenced, st.explicit_lac,
                                       None if st.explicit_lac_body is None
                                       else st.explicit_lac_body.hex(),
                                       st.max_piggyback_lac, st.last]
                            for lid, st in self._ledgers.items()}}

    def _load_ledgers(self, doc: dict[str, Any]) -> None:
        self._deleted = IdRanges.from_ranges(tuple(r) for r in doc["deleted"])
        for lid, (key, fenced, elac, ebody, plac, last) in doc["ledgers"].items():
            self._ledgers[int(lid)] = DbLedger(
                None if key is None else bytes.fromhex(key), fenced, elac,
                None if ebody is None else bytes.fromhex(ebody), plac, -1, last)

    def _take_cache(self) -> dict[int, dict[int, bytes]]:
        """The write cache to flush (with what a failed flush left); a new one starts."""
        for lid, entries in self._cache.items():
            self._flushing.setdefault(lid, {}).update(entries)
        self._cache, self.cache_bytes = {}, 0
        return self._flushing

    def _flushed(self, flushing: dict[int, dict[int, bytes]]) -> None:
        if self._flushing is flushing:
            self._flushing = {}

    def _apply(self, rec: Record) -> None:
        """A journal record replayed at start-up."""
        lid, t = rec.ledger_id, rec.rtype
        if lid in self._deleted:
            return
        if t is RecordType.DELETE_LEDGER:
            self._forget(lid)
            return
        if t is RecordType.CHECKPOINT:
            return
        st = self._ledgers.setdefault(lid, DbLedger())
        if t is RecordType.ENTRY:
            self._cached(lid, st, rec.entry_id, rec.data)
        elif t is RecordType.FENCE:
            st.fenced = True
        elif t is RecordType.MASTER_KEY:
            st.master_key = st.master_key or rec.data
        elif rec.lac >= st.explicit_lac:
            st.explicit_lac, st.explicit_lac_body = rec.lac, rec.data

    def _cached(self, lid: int, st: DbLedger, eid: int, body: bytes) -> None:
        entries = self._cache.setdefault(lid, {})
        if eid not in entries:
            entries[eid] = body
            self.cache_bytes += len(body) + ENTRY_OVERHEAD
        st.last = max(st.last, eid)
        st.max_piggyback_lac = max(st.max_piggyback_lac, piggyback_lac(body))

    # ================================================================== journal callbacks

    def _on_synced(self, seg: int, tags: list[Any], offsets: list[int]) -> None:
        changed: set[int] = set()
        for tag in tags:
            if tag is None:
                continue
            if type(tag) is _Batch:
                self._batch_synced(tag)
                changed.add(tag.ledger_id)
                continue
            lid, eid, body, on_done = tag
            self._pending.pop((lid, eid), None)
            st = self._ledgers.get(lid)
            if st is not None and lid not in self._deleted:
                self._cached(lid, st, eid, body)
                changed.add(lid)
            for waiter in [on_done, *self._waiting.pop((lid, eid), ())]:
                waiter(None)
        for lid in changed:
            self._on_change(lid)
        if self.cache_bytes > self.config.db_write_cache_bytes:
            self._cache_full()

    def _batch_synced(self, tag: _Batch) -> None:
        lid = tag.ledger_id
        st = self._ledgers.get(lid)
        live = st is not None and lid not in self._deleted
        for eid, body in zip(tag.entry_ids, tag.bodies, strict=True):
            self._pending.pop((lid, eid), None)
            if live and st is not None:
                self._cached(lid, st, eid, body)
            for waiter in self._waiting.pop((lid, eid), ()):
                waiter(None)
        tag.on_done(None)

    def _on_failed(self, tags: list[Any], exc: BaseException) -> None:
        for tag in tags:
            if tag is None:
                continue
            if type(tag) is _Batch:
                for eid in tag.entry_ids:
                    self._pending.pop((tag.ledger_id, eid), None)
                    for waiter in self._waiting.pop((tag.ledger_id, eid), ()):
                        waiter(_bk(fresh_copy(exc)))
                tag.on_done(_bk(exc))
                continue
            lid, eid, _body, on_done = tag
            self._pending.pop((lid, eid), None)
            for waiter in [on_done, *self._waiting.pop((lid, eid), ())]:
                waiter(_bk(fresh_copy(exc)))

    # ================================================================== writes

    def _checked(self, lid: int, key: bytes, recovery: bool, *, create: bool = True,
                 deleted: type[BKError] = LedgerFencedError) -> DbLedger:
        if lid < 0:
            raise BadRequestError(f"ledger id {lid}: ledger ids are never negative")
        if lid in self._deleted:
            raise deleted(f"ledger {lid} was deleted on this bookie")
        st = self._ledgers.get(lid)
        if st is not None and st.master_key is not None and st.master_key != key:
            raise UnauthorizedError(f"ledger {lid}: master key does not match")
        if len(key) > MAX_MASTER_KEY_SIZE:
            raise BadRequestError(f"ledger {lid}: a master key of {len(key)} bytes (at most "
                                  f"{MAX_MASTER_KEY_SIZE})")
        if st is not None and st.fenced and not recovery:
            raise LedgerFencedError(f"ledger {lid} is fenced")
        if st is None:
            st = self._ledgers[lid] = DbLedger()
        if st.master_key is None:
            st.master_key = key
            self.journal.append_nowait(encode_master_key(lid, key), None)
        return st

    def add(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
            recovery: bool = False) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_entry(ledger_id, entry_id, body, master_key, recovery, ResolveFuture(fut))
        return fut

    def add_entry(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
                  recovery: bool, on_done: AddCallback) -> None:
        """Journal one framed entry; ``on_done(error)`` once (see LedgerStorage)."""
        if len(body) < ENTRY_HEADER_SIZE:
            raise BadRequestError(
                f"ledger {ledger_id} entry {entry_id}: entry of {len(body)} bytes is shorter "
                f"than the {ENTRY_HEADER_SIZE}-byte header")
        if entry_id < 0 or ledger_id < 0:
            raise BadRequestError(f"add of ({ledger_id}, {entry_id}): ledger and entry ids are "
                                  "never negative")
        if _IDS.unpack_from(body) != (ledger_id, entry_id):
            raise BadRequestError(f"add of ({ledger_id}, {entry_id}) carries an entry framed "
                                  f"as {_IDS.unpack_from(body)}")
        st = self._checked(ledger_id, master_key, recovery)
        key = (ledger_id, entry_id)
        pending = self._pending.get(key)
        if pending is not None:
            if pending != body:
                raise EntryExistsError(
                    f"ledger {ledger_id} entry {entry_id} is being written with different bytes")
            self._waiting.setdefault(key, []).append(on_done)
            return
        # (an id past the last durable one is not held: no lookup on the common path)
        same = self._same_as_held(ledger_id, entry_id, body) if entry_id <= st.last else None
        if same is not None:
            if not same:
                raise EntryExistsError(
                    f"ledger {ledger_id} entry {entry_id} exists with different bytes")
            on_done(None)
            return
        self.journal.append_nowait(encode_entry(body), (ledger_id, entry_id, body, on_done))
        self._pending[key] = body
        lac = piggyback_lac(body)
        if lac > st.arrived_lac:
            st.arrived_lac = lac
            self._on_change(ledger_id)

    def add_batch(self, ledger_id: int, entry_ids: Sequence[int], bodies: Sequence[bytes],
                  master_key: bytes, recovery: bool, on_done: BatchCallback) -> None:
        """Entries of one ledger: each checked like a single add, the new ones journaled as
        one append (their records back to back); ``on_done`` once for the lot."""
        st = self._checked(ledger_id, master_key, recovery)
        if len(entry_ids) != len(bodies) or not bodies:
            raise BadRequestError(f"ledger {ledger_id}: a batch of {len(bodies)} entries "
                                  f"and {len(entry_ids)} ids")
        outcomes: list[BKError | None] = [None] * len(bodies)
        left = [len(bodies) + 1]  # (+1: the setup below, settled last)

        def settle(i: int, error: BKError | None) -> None:
            if i >= 0:
                outcomes[i] = error
            left[0] -= 1
            if not left[0]:
                on_done(None if not any(outcomes) else outcomes)

        new_ids: list[int] = []
        new_bodies: list[bytes] = []
        #: entries refused for one reason share one error (named after the first of them):
        #: a batch of 65,536 refusals holds one error object, not 65,536
        shared: dict[type, BKError] = {}
        for i, (eid, body) in enumerate(zip(entry_ids, bodies, strict=True)):
            if (eid <= st.last or (ledger_id, eid) in self._pending
                    or len(body) < ENTRY_HEADER_SIZE or eid < 0
                    or _IDS.unpack_from(body) != (ledger_id, eid)):
                try:  # the general path: a duplicate, a refusal
                    self.add_entry(ledger_id, eid, body, master_key, recovery,
                                   lambda e, i=i: settle(i, e))  # type: ignore[misc]
                except BKError as exc:
                    settle(i, shared.setdefault(type(exc), exc))
                continue
            new_ids.append(eid)
            new_bodies.append(body)
            self._pending[(ledger_id, eid)] = body
        if new_ids:
            index = {eid: i for i, eid in enumerate(entry_ids)}

            def batch_done(error: BKError | None) -> None:
                for eid in new_ids:
                    settle(index[eid], error)

            self.journal.append_nowait(b"".join(map(encode_entry, new_bodies)),
                                       _Batch(ledger_id, new_ids, new_bodies, batch_done),
                                       len(new_ids))
            lac = max(map(piggyback_lac, new_bodies))
            if lac > st.arrived_lac:
                st.arrived_lac = lac
                self._on_change(ledger_id)
        settle(-1, None)

    def fence(self, ledger_id: int, master_key: bytes) -> Awaitable[None]:
        st = self._checked(ledger_id, master_key, True, deleted=NoSuchLedgerError)
        st.fenced = True
        self._on_change(ledger_id)
        return self.journal.append(encode_fence(ledger_id))

    def write_lac(self, ledger_id: int, lac: int, body: bytes,
                  master_key: bytes) -> Awaitable[None]:
        if lac < -1:
            raise BadRequestError(f"ledger {ledger_id}: explicit LAC {lac} (at least -1)")
        st = self._checked(ledger_id, master_key, True)
        fut = self.journal.append(encode_explicit_lac(ledger_id, lac, body))
        if lac >= st.explicit_lac:
            st.explicit_lac, st.explicit_lac_body = lac, body
            self._on_change(ledger_id)
        return fut

    def delete_ledger(self, ledger_id: int) -> Awaitable[None]:
        if ledger_id < 0:
            raise BadRequestError(f"ledger id {ledger_id}: ledger ids are never negative")
        self._forget(ledger_id)
        fut = self.journal.append(encode_delete(ledger_id))
        self._on_change(ledger_id)
        return fut

    def _forget(self, ledger_id: int) -> None:
        self._deleted.add(ledger_id)
        self._ledgers.pop(ledger_id, None)
        gone = self._cache.pop(ledger_id, {})
        self.cache_bytes -= sum(len(b) + ENTRY_OVERHEAD for b in gone.values())
        self._flushing.pop(ledger_id, None)
        for log_id in self.logs.drop_ledger(ledger_id):
            self.logs.logs.pop(log_id)  # (its files go once a checkpoint no longer names it)

    # ================================================================== reads

    def _same_as_held(self, lid: int, eid: int, body: bytes) -> bool | None:
        """None when ``eid`` is not held, else whether ``body`` equals the held copy. A
        flushed copy is read back only when its stored size is ``body``'s: a small body
        claiming a large held entry cannot make the bookie read that entry (and its
        read-ahead) back."""
        held = self._cache.get(lid, {}).get(eid)
        if held is None:
            held = self._flushing.get(lid, {}).get(eid)
        if held is not None:
            return held == body
        size = self.logs.size_of(lid, eid)
        if size is None:
            return None
        if size != len(body):
            return False
        stored = self.logs.read(lid, eid)
        return None if stored is None else stored == body

    def _held(self, lid: int, eid: int) -> bytes | None:
        body = self._cache.get(lid, {}).get(eid)
        if body is None:
            body = self._flushing.get(lid, {}).get(eid)
        if body is None:
            body = self.logs.read(lid, eid)
        return body

    def find(self, ledger_id: int) -> DbLedger | None:
        return self._ledgers.get(ledger_id)

    def is_deleted(self, ledger_id: int) -> bool:
        return ledger_id in self._deleted

    def state(self, ledger_id: int) -> DbLedger:
        st = self._ledgers.get(ledger_id)
        if st is None:
            if ledger_id in self._deleted:
                raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
            raise NoSuchLedgerError(f"ledger {ledger_id} is not on this bookie")
        return st

    def read(self, ledger_id: int, entry_id: int) -> bytes:
        st = self.state(ledger_id)
        if entry_id == -1:
            entry_id = st.last
        body = self._held(ledger_id, entry_id) if entry_id >= 0 else None
        if body is None:
            raise NoSuchEntryError(f"ledger {ledger_id} entry {entry_id} is not on this bookie")
        return body

    def read_many(self, ledger_id: int, entry_ids: Sequence[int], max_bytes: int,
                  max_absent: int = READ_MAX_ABSENT,
                  ) -> tuple[list[tuple[int, Status, bytes | None]], dict[int, BKError]]:
        self.state(ledger_id)
        out: list[tuple[int, Status, bytes | None]] = []
        errors: dict[int, BKError] = {}
        total = absent = 0
        ahead: dict[int, bytes] = {}
        cached = self._cache.get(ledger_id, {})
        for i, eid in enumerate(entry_ids):
            if eid not in ahead and eid not in cached and eid >= 0:
                # a run of ascending ids off the entry logs in two preads
                n = 1
                while (i + n < len(entry_ids) and entry_ids[i + n] == eid + n
                       and n < 1024):
                    n += 1
                if n > 1:
                    try:
                        run = self.logs.read_run(ledger_id, eid, n, max_bytes - total)
                    except OSError as exc:
                        raise IOBookieError(f"ledger {ledger_id}: {exc}") from None
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
        st = self._ledgers.get(ledger_id)
        return -1 if st is None else st.lac

    def entry_size(self, ledger_id: int, entry_id: int) -> int | None:
        body = self._cache.get(ledger_id, {}).get(entry_id)
        if body is None:
            body = self._flushing.get(ledger_id, {}).get(entry_id)
        if body is not None:
            return RECORD_HEADER_SIZE + len(body)
        size = self.logs.size_of(ledger_id, entry_id) if entry_id >= 0 else None
        return None if size is None else RECORD_HEADER_SIZE + size

    def _ids(self, ledger_id: int) -> list[int]:
        self.state(ledger_id)
        ids = set(self.logs.entry_ids(ledger_id))
        ids.update(self._flushing.get(ledger_id, ()))
        ids.update(self._cache.get(ledger_id, ()))
        return sorted(ids)

    def ranges(self, ledger_id: int) -> tuple[tuple[int, int], ...]:
        return tuple(IdRanges(self._ids(ledger_id)).ranges())

    def ledger_ids(self) -> list[int]:
        return sorted(self._ledgers)

    def _check_ledgers(self) -> None:
        for lid in (*self._cache, *self._flushing):
            assert lid in self._ledgers and lid not in self._deleted, lid
        for lid, entries in self._cache.items():
            assert self._ledgers[lid].last >= max(entries, default=-1), lid
