"""The db engine's writes: adds (one entry or a batch), fences, explicit LACs, deletions
(:class:`DbWrites`), and the journal callbacks that complete the adds
(:class:`DbCompletions`), for :class:`pybk.storage.dbstore.DbLedgerStore`.

An add is journaled; once the fsync that covers it returns, the entry enters the write cache
of the ledger table (:class:`~pybk.storage.dbledgers.DbLedgers`) and its caller is answered.
Ledger metadata takes effect in memory at once and is answered after the covering fsync.

Backpressure: while a flush of the write cache is in flight and the cache filling beside it
has passed its bound too (both caches full), adds are held, in order, and run when the flush
ends (:meth:`DbWrites.release`): their callers wait, as BookKeeper's throttled adds do.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from pybk.errors import (
    BadRequestError,
    BKError,
    EntryExistsError,
    IOBookieError,
    LedgerFencedError,
    NoSuchLedgerError,
    UnauthorizedError,
    fresh_copy,
)
from pybk.storage.addbatch import checked_run, encode_run
from pybk.storage.config import MAX_MASTER_KEY_SIZE
from pybk.storage.dbledgers import DbLedger, DbLedgers
from pybk.storage.journal import Journal
from pybk.storage.records import (
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
)
from pybk.storage.replay import piggyback_lac
from pybk.storage.writes import AddCallback, BatchCallback, ResolveFuture
from pybk.wire import ENTRY_HEADER_SIZE

__all__ = ["DbCompletions", "DbWrites"]

_IDS = struct.Struct(">qq")


@dataclass
class _Batch:
    """The journal tag of one batched add's new entries (one append)."""

    ledger_id: int
    entry_ids: list[int]
    bodies: list[bytes]
    on_done: Callable[[BKError | None], None]
    #: the highest LAC the bodies carry
    lac: int


def _bk(exc: BaseException) -> BKError:
    return exc if isinstance(exc, BKError) else IOBookieError(str(exc))


class DbCompletions:
    """The db engine's journal callbacks. Given the ledger table, the store's
    ``on_ledger_change``, the write cache's bound (``db_write_cache_bytes``) and what to call
    when the cache passes it (the store starts a flush)."""

    def __init__(self, table: DbLedgers, on_change: Callable[[int], None], cache_limit: int,
                 cache_full: Callable[[], None]) -> None:
        self._t = table
        self._on_change = on_change
        self._cache_limit = cache_limit
        self._cache_full = cache_full

    def on_synced(self, seg: int, tags: list[Any], offsets: list[int]) -> None:
        """A journal batch is durable: its entries enter the write cache, their adds (and
        the identical adds waiting on them) are answered."""
        t = self._t
        changed: set[int] = set()
        for tag in tags:
            if tag is None:
                continue
            if type(tag) is _Batch:
                self._batch_synced(tag)
                changed.add(tag.ledger_id)
                continue
            lid, eid, body, on_done = tag
            t.pending.pop((lid, eid), None)
            st = t.ledgers.get(lid)
            if st is not None and lid not in t.deleted:
                t.cached(lid, st, eid, body)
                changed.add(lid)
            for waiter in [on_done, *t.waiting.pop((lid, eid), ())]:
                waiter(None)
        for lid in changed:
            self._on_change(lid)
        if t.cache_bytes > self._cache_limit:
            self._cache_full()

    def _batch_synced(self, tag: _Batch) -> None:
        t = self._t
        lid = tag.ledger_id
        deque(map(t.pending.pop, zip(repeat(lid), tag.entry_ids), repeat(None)), maxlen=0)
        st = t.ledgers.get(lid)
        if st is not None and lid not in t.deleted:
            t.cached_run(lid, st, tag.entry_ids, tag.bodies, tag.lac)
        if t.waiting:
            for eid in tag.entry_ids:
                for waiter in t.waiting.pop((lid, eid), ()):
                    waiter(None)
        tag.on_done(None)

    def on_failed(self, tags: list[Any], exc: BaseException) -> None:
        """A journal batch failed: each add in it (and each waiting on one) gets ``exc``."""
        t = self._t
        for tag in tags:
            if tag is None:
                continue
            if type(tag) is _Batch:
                for eid in tag.entry_ids:
                    t.pending.pop((tag.ledger_id, eid), None)
                    for waiter in t.waiting.pop((tag.ledger_id, eid), ()):
                        waiter(_bk(fresh_copy(exc)))
                tag.on_done(_bk(exc))
                continue
            lid, eid, _body, on_done = tag
            t.pending.pop((lid, eid), None)
            for waiter in [on_done, *t.waiting.pop((lid, eid), ())]:
                waiter(_bk(fresh_copy(exc)))


class DbWrites:
    """The db engine's write part. Given the ledger table, the journal, the store's
    ``on_ledger_change`` and ``full()``: whether both write caches are full (adds are then
    held until :meth:`release`)."""

    def __init__(self, table: DbLedgers, journal: Journal,
                 on_change: Callable[[int], None],
                 full: Callable[[], bool] = lambda: False) -> None:
        self._t = table
        self._journal = journal
        self._on_change = on_change
        self._full = full
        #: adds held while both caches are full: (the add, how to fail it), oldest first
        self.held: deque[tuple[Callable[[], None], Callable[[BKError], None]]] = deque()
        #: adds ever held
        self.held_count = 0

    def _must_hold(self) -> bool:
        """Both caches are full, or adds are held already (adds stay in order)."""
        return bool(self.held) or self._full()

    def _hold(self, call: Callable[[], None], fail: Callable[[BKError], None]) -> None:
        self.held.append((call, fail))
        self.held_count += 1

    def release(self) -> None:
        """The flush ended: run the held adds, in order (an add refused now, e.g. its ledger
        fenced meanwhile, is answered with the refusal)."""
        held, self.held = self.held, deque()
        for call, fail in held:
            try:
                call()
            except BKError as exc:
                fail(exc)

    def fail_held(self, exc: BaseException) -> None:
        """A crash: every held add fails with ``exc``."""
        held, self.held = self.held, deque()
        for _call, fail in held:
            fail(_bk(fresh_copy(exc)))

    def _checked(self, lid: int, key: bytes, recovery: bool, *, create: bool = True,
                 deleted: type[BKError] = LedgerFencedError) -> DbLedger:
        t = self._t
        if lid < 0:
            raise BadRequestError(f"ledger id {lid}: ledger ids are never negative")
        if lid in t.deleted:
            raise deleted(f"ledger {lid} was deleted on this bookie")
        st = t.ledgers.get(lid)
        if st is not None and st.master_key is not None and st.master_key != key:
            raise UnauthorizedError(f"ledger {lid}: master key does not match")
        if len(key) > MAX_MASTER_KEY_SIZE:
            raise BadRequestError(f"ledger {lid}: a master key of {len(key)} bytes (at most "
                                  f"{MAX_MASTER_KEY_SIZE})")
        if st is not None and st.fenced and not recovery:
            raise LedgerFencedError(f"ledger {lid} is fenced")
        if st is None:
            st = t.ledgers[lid] = DbLedger()
        if st.master_key is None:
            st.master_key = key
            self._journal.append_nowait(encode_master_key(lid, key), None)
        return st

    def add(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
            recovery: bool = False) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_entry(ledger_id, entry_id, body, master_key, recovery, ResolveFuture(fut))
        return fut

    def add_entry(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
                  recovery: bool, on_done: AddCallback) -> None:
        """Journal one framed entry; ``on_done(error)`` once (see LedgerStorage)."""
        if self._must_hold():
            self._hold(lambda: self.add_entry(ledger_id, entry_id, body, master_key, recovery,
                                              on_done), on_done)
            return
        t = self._t
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
        pending = t.pending.get(key)
        if pending is not None:
            if pending != body:
                raise EntryExistsError(
                    f"ledger {ledger_id} entry {entry_id} is being written with different bytes")
            t.waiting.setdefault(key, []).append(on_done)
            return
        # (an id past the last durable one is not held: no lookup on the common path)
        same = t.same_as_held(ledger_id, entry_id, body) if entry_id <= st.last else None
        if same is not None:
            if not same:
                raise EntryExistsError(
                    f"ledger {ledger_id} entry {entry_id} exists with different bytes")
            on_done(None)
            return
        self._journal.append_nowait(encode_entry(body), (ledger_id, entry_id, body, on_done))
        t.pending[key] = body
        lac = piggyback_lac(body)
        if lac > st.arrived_lac:
            st.arrived_lac = lac
            self._on_change(ledger_id)

    def add_batch(self, ledger_id: int, entry_ids: Sequence[int], bodies: Sequence[bytes],
                  master_key: bytes, recovery: bool, on_done: BatchCallback) -> None:
        """Entries of one ledger: each checked like a single add, the new ones journaled as
        one append (their records back to back); ``on_done`` once for the lot."""
        if self._must_hold():
            self._hold(lambda: self.add_batch(ledger_id, entry_ids, bodies, master_key,
                                              recovery, on_done),
                       lambda exc: on_done([exc] * len(bodies)))
            return
        t = self._t
        st = self._checked(ledger_id, master_key, recovery)
        if len(entry_ids) != len(bodies) or not bodies:
            raise BadRequestError(f"ledger {ledger_id}: a batch of {len(bodies)} entries "
                                  f"and {len(entry_ids)} ids")
        run = checked_run(ledger_id, entry_ids, bodies)
        if run is not None and run[0][0] > st.last:  # the common batch: C-level passes
            ids, lac = run
            keys = list(zip(repeat(ledger_id), ids))
            if t.pending.keys().isdisjoint(keys):  # (none being written; none held)
                t.pending.update(zip(keys, bodies, strict=True))
                self._journal.append_nowait(encode_run(bodies),
                                            _Batch(ledger_id, ids, list(bodies), on_done, lac),
                                            len(ids))
                if lac > st.arrived_lac:
                    st.arrived_lac = lac
                    self._on_change(ledger_id)
                return
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
            if (eid <= st.last or (ledger_id, eid) in t.pending
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
            t.pending[(ledger_id, eid)] = body
        if new_ids:
            index = {eid: i for i, eid in enumerate(entry_ids)}

            def batch_done(error: BKError | None) -> None:
                for eid in new_ids:
                    settle(index[eid], error)

            lac = max(map(piggyback_lac, new_bodies))
            self._journal.append_nowait(b"".join(map(encode_entry, new_bodies)),
                                       _Batch(ledger_id, new_ids, new_bodies, batch_done, lac),
                                       len(new_ids))
            if lac > st.arrived_lac:
                st.arrived_lac = lac
                self._on_change(ledger_id)
        settle(-1, None)

    def fence(self, ledger_id: int, master_key: bytes) -> Awaitable[None]:
        st = self._checked(ledger_id, master_key, True, deleted=NoSuchLedgerError)
        st.fenced = True
        self._on_change(ledger_id)
        return self._journal.append(encode_fence(ledger_id))

    def write_lac(self, ledger_id: int, lac: int, body: bytes,
                  master_key: bytes) -> Awaitable[None]:
        if lac < -1:
            raise BadRequestError(f"ledger {ledger_id}: explicit LAC {lac} (at least -1)")
        st = self._checked(ledger_id, master_key, True)
        fut = self._journal.append_lazy(encode_explicit_lac(ledger_id, lac, body))
        if lac >= st.explicit_lac:
            st.explicit_lac, st.explicit_lac_body = lac, body
            self._on_change(ledger_id)
        return fut

    def delete_ledger(self, ledger_id: int) -> Awaitable[None]:
        if ledger_id < 0:
            raise BadRequestError(f"ledger id {ledger_id}: ledger ids are never negative")
        self._t.forget(ledger_id)
        fut = self._journal.append(encode_delete(ledger_id))
        self._on_change(ledger_id)
        return fut
