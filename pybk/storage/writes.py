"""The store's write side: adds (one entry, or a batch), fences, explicit LACs, deletions.
The journal callbacks that complete them are :mod:`pybk.storage.completions`'.

An entry enters the index only after the fsync that covers it, so the index never promises
what the disk may not have. Ledger metadata (master key, fence, explicit LAC, deletion) takes effect
in memory at once (a fence must stop later adds immediately) and its caller is answered after
the covering fsync.

Every write is one journal append whose *tag* comes back through ``on_synced`` (durable, with
where it starts in the segment) or ``on_failed``: a tuple ``(ledger, entry, lac, size,
on_done, state)`` for one entry or a metadata record (size 0), a
:class:`~pybk.storage.addbatch.BatchTag` for the entries of one :meth:`StoreWrites.add_batch`
(one append of their records, one index update, one answer for the lot).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence

import crc32c

from pybk.errors import (
    BadRequestError,
    BKError,
    EntryExistsError,
    LedgerFencedError,
    NoSuchLedgerError,
    UnauthorizedError,
)
from pybk.storage.addbatch import (
    Admitted,
    BatchTag,
    admit_run,
    forget_pending,
    notify,
    unpack_entry_ids_lac,
)
from pybk.storage.config import MAX_MASTER_KEY_SIZE
from pybk.storage.index import Index, LedgerState
from pybk.storage.journal import Journal
from pybk.storage.reads import Held
from pybk.storage.records import (
    ENTRY_CRC,
    ENTRY_TYPE,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    encode_delete,
    encode_entry,
    encode_explicit_lac,
    encode_fence,
    encode_master_key,
)
from pybk.wire import ENTRY_HEADER_SIZE, AddOutcome

__all__ = ["AddCallback", "BatchCallback", "ResolveFuture", "StoreWrites"]


class StoreWrites:
    """:class:`pybk.storage.store.LedgerStore`'s write part. Given the index, the journal, the
    read part's :meth:`~pybk.storage.reads.StoreReads.compare_held` (an add of an entry
    already held reads it back to compare), the adds waiting on a pending identical add
    (shared with :class:`~pybk.storage.completions.StoreCompletions`, which answers them) and
    the store's ``on_ledger_change``."""

    def __init__(self, index: Index, journal: Journal,
                 compare_held: Callable[[int, LedgerState, int, bytes], Held],
                 also_waiting: dict[tuple[int, int], list[AddCallback]],
                 on_ledger_change: Callable[[int], None]) -> None:
        self._journal = journal
        self._append_nowait = journal.append_nowait  # (the add path's: bound once)
        self._compare_held = compare_held
        self._also_waiting = also_waiting
        self._on_ledger_change = on_ledger_change
        self._fence_futs: dict[int, asyncio.Future[None]] = {}
        self.adopt(index)

    def adopt(self, index: Index) -> None:
        """Write into ``index`` from now on (start-up's, replacing the empty one)."""
        self._index = index
        self._ledgers = index.ledgers  # (the add path's lookup: bound once)

    def _check_key(self, lid: int, st: LedgerState | None, key: bytes) -> None:
        """A write's ledger id and key: a negative id or a key too long to record is a bad
        request, a key that differs from the recorded one is unauthorized."""
        if st is not None and st.master_key is not None:
            if st.master_key != key:
                raise UnauthorizedError(f"ledger {lid}: master key does not match")
            return
        if lid < 0:
            raise BadRequestError(f"ledger id {lid}: ledger ids are never negative")
        if len(key) > MAX_MASTER_KEY_SIZE:
            raise BadRequestError(f"ledger {lid}: a master key of {len(key)} bytes (at most "
                                  f"{MAX_MASTER_KEY_SIZE})")

    def _key_record(self, lid: int, st: LedgerState, key: bytes) -> bytes:
        """The MASTER_KEY record to journal with this write, if the ledger has none yet."""
        if st.master_key is not None:
            return b""
        st.master_key = key
        return encode_master_key(lid, key)

    def add(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
            recovery: bool = False) -> asyncio.Future[None]:
        """Store one framed entry; the future resolves once it is durable (and indexed).

        Raises at once like :meth:`add_entry`. The awaitable form, for callers off the hot
        path; it costs one future per add."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.add_entry(ledger_id, entry_id, body, master_key, recovery, ResolveFuture(fut))
        return fut

    def add_entry(self, ledger_id: int, entry_id: int, body: bytes, master_key: bytes,
                  recovery: bool, on_done: AddCallback) -> None:
        """Store one framed entry; ``on_done(error)`` tells the outcome. The hot path.

        Raises at once (and then never calls ``on_done``): LedgerFencedError (fenced and not
        a recovery add, or deleted), UnauthorizedError, EntryExistsError (different bytes),
        BadRequestError (the body's embedded ids disagree with the request),
        JournalFailedError (the journal takes no more writes).

        Otherwise ``on_done`` is called exactly once: ``None`` once the entry is durable *and*
        in the index, else the error. It runs synchronously inside the journal's batch
        completion (no future, no loop callback per entry), so it must be quick and must not
        raise; it may already have run when ``add_entry`` returns."""
        try:
            blid, beid, lac = unpack_entry_ids_lac(body)
        except struct.error:  # shorter than the header (the length test, paid only here)
            raise BadRequestError(
                f"ledger {ledger_id} entry {entry_id}: entry of {len(body)} bytes is shorter "
                f"than the {ENTRY_HEADER_SIZE}-byte header") from None
        if entry_id < 0 or ledger_id < 0:
            raise BadRequestError(f"add of ({ledger_id}, {entry_id}): ledger and entry ids are "
                                  "never negative")
        if blid != ledger_id or beid != entry_id:
            raise BadRequestError(
                f"add of ({ledger_id}, {entry_id}) carries an entry framed as ({blid}, {beid})")
        st = self._ledgers.get(ledger_id)
        # The common case in one test: a held, unfenced ledger whose key matches. Anything
        # else (new or deleted ledger, no key yet, fenced, wrong key) takes the general checks.
        if st is None or st.fenced or st.master_key != master_key:
            st = self._add_checks(ledger_id, st, master_key, recovery)
        pending = st.pending_body(entry_id) if st.runs else st.pending.get(entry_id)
        if pending is not None:
            if pending != body:
                raise EntryExistsError(
                    f"ledger {ledger_id} entry {entry_id} is being written with different bytes")
            # identical: answered with the original, after the fsync that covers it
            self._also_waiting.setdefault((ledger_id, entry_id), []).append(on_done)
            return
        entries = st.entries
        # (an id from the dense run's end on is not held unless sparse ids exist: one test)
        if (entry_id < entries.end or entries.sparse is not None) and entry_id in entries:
            self._add_existing(st, ledger_id, entry_id, body, lac, on_done)
            return
        append_nowait = self._append_nowait
        if st.master_key is None:
            append_nowait(self._key_record(ledger_id, st, master_key),
                          (ledger_id, -1, -1, 0, None, st))
        rec = encode_entry(body)
        append_nowait(rec, (ledger_id, entry_id, lac, len(rec), on_done, st))
        st.pending[entry_id] = body
        if lac > st.arrived_lac:
            self._lac_arrived(ledger_id, st, lac)

    def _lac_arrived(self, ledger_id: int, st: LedgerState, lac: int) -> None:
        """An add brought a LAC past what this bookie knew: the writer confirmed it, so
        long polls are answered now, not after this add's own fsync."""
        st.arrived_lac = lac
        self._on_ledger_change(ledger_id)

    def add_batch(self, ledger_id: int, entry_ids: Sequence[int], bodies: Sequence[bytes],
                  master_key: bytes, recovery: bool, on_done: BatchCallback) -> None:
        """Store the framed entries ``bodies`` (entries ``entry_ids``) of one ledger:
        ``on_done(outcome)`` tells the outcome once, for the lot (see
        :data:`pybk.wire.AddOutcome`: None once every entry is durable *and* in the
        index, else one error for all or one outcome per entry).

        The ledger's checks (deleted, key, fenced) run once and raise at once like
        :meth:`add_entry`'s (then ``on_done`` is never called). Each entry is then checked
        like a single add (its body's ids, a duplicate being written, an entry already
        held); the new ones go to the journal as *one* append (their records back to back:
        the segment format is unchanged) whose completion puts them all in the index and
        answers once. A refused entry fails alone; the others are stored."""
        if ledger_id < 0:
            raise BadRequestError(f"ledger id {ledger_id}: ledger ids are never negative")
        st = self._ledgers.get(ledger_id)
        if st is None or st.fenced or st.master_key != master_key:
            st = self._add_checks(ledger_id, st, master_key, recovery)
        if len(entry_ids) != len(bodies) or not bodies:
            raise BadRequestError(f"ledger {ledger_id}: a batch of {len(bodies)} entries "
                                  f"with {len(entry_ids)} ids")
        run = admit_run(ledger_id, st, entry_ids, bodies)
        if run is not None:  # the common batch, admitted in C-level passes
            data, ids, sizes, lac = run
            tag = BatchTag(ledger_id, st, ids, sizes, lac, True, on_done, bodies)
            st.runs.append(tag)  # (in flight: a second add of one of them finds it)
            try:
                if st.master_key is None:
                    self._journal.append_nowait(self._key_record(ledger_id, st, master_key),
                                               (ledger_id, -1, -1, 0, None, st))
                self._journal.append_nowait(data, tag, len(ids))
            except BaseException:  # nothing of this batch is on its way: forget it
                forget_pending(st, tag)
                raise
            if lac > st.arrived_lac:
                self._lac_arrived(ledger_id, st, lac)
            return
        batch = Admitted(len(bodies), on_done)
        try:
            self._admit(batch, ledger_id, st, entry_ids, bodies)
            if batch.records:
                if st.master_key is None:
                    self._journal.append_nowait(self._key_record(ledger_id, st, master_key),
                                               (ledger_id, -1, -1, 0, None, st))
                self._journal.append_nowait(
                    b"".join(batch.records),
                    BatchTag(ledger_id, st, batch.ids, batch.sizes, batch.lac,
                              batch.ascending, batch.on_written()), len(batch.ids))
        except BaseException:
            for eid in batch.ids:  # nothing of this batch is on its way: forget it
                st.pending.pop(eid, None)
            if batch.parts is not None:
                batch.parts.abandon()  # the caller is told by our raising, not by parts
            raise
        if batch.parts is not None:
            batch.parts.ready()
        if batch.lac > st.arrived_lac:
            self._lac_arrived(ledger_id, st, batch.lac)

    def _admit(self, batch: Admitted, ledger_id: int, st: LedgerState,
               entry_ids: Sequence[int], bodies: Sequence[bytes]) -> None:
        """Check each entry of a batch like a single add; gather the records to write. The
        entries refused for one reason share one error (named after the first of them): a
        batch of 65,536 refusals costs one error object, not 65,536."""
        shared: dict[str, BKError] = {}
        pending = st.pending
        entries = st.entries
        end = entries.end
        sparse = entries.sparse is not None
        records, ids, sizes = batch.records, batch.ids, batch.sizes
        where = batch.where
        max_lac = prev = -1
        for i, body in enumerate(bodies):
            eid = entry_ids[i]
            try:
                blid, beid, lac = unpack_entry_ids_lac(body)
            except struct.error:
                batch.refuse(i, shared.get("short") or shared.setdefault(
                    "short", BadRequestError(f"add of ({ledger_id}, {eid}): entry of "
                                             f"{len(body)} bytes is shorter than the "
                                             f"{ENTRY_HEADER_SIZE}-byte header")))
                continue
            if blid != ledger_id or beid != eid or eid < 0:
                batch.refuse(i, shared.get("framed") or shared.setdefault(
                    "framed", BadRequestError(f"add of ({ledger_id}, {eid}) carries an entry "
                                              f"framed as ({blid}, {beid})")))
                continue
            waiting = st.pending_body(eid) if st.runs else pending.get(eid)
            if waiting is not None:
                if waiting != body:
                    batch.refuse(i, shared.get("writing") or shared.setdefault(
                        "writing", EntryExistsError(f"ledger {ledger_id} entry {eid} is being "
                                                    "written with different bytes")))
                else:  # identical: answered with the original, after the fsync that covers it
                    self._also_waiting.setdefault((ledger_id, eid), []).append(
                        batch.waiting(i))
                continue
            if (eid < end or sparse) and eid in entries:
                held = self._compare_held(ledger_id, st, eid, body)
                if held is not Held.DAMAGED:
                    if held is Held.DIFFERENT:
                        batch.refuse(i, shared.get("exists") or shared.setdefault(
                            "exists", EntryExistsError(f"ledger {ledger_id} entry {eid} "
                                                       "exists with different bytes")))
                    else:
                        batch.held(i)  # identical: a durable no-op
                    continue
            if eid <= prev:
                batch.ascending = False
            prev = eid
            # encode_entry's record, as two parts of the one join that makes the append
            size = len(body)
            records.append(_pack_record_header(size, _crc32c(body, ENTRY_CRC), ENTRY_TYPE))
            records.append(body)
            ids.append(eid)
            where.append(i)
            sizes.append(RECORD_HEADER_SIZE + size)
            if lac > max_lac:
                max_lac = lac
            pending[eid] = body
        batch.lac = max_lac

    def _add_checks(self, ledger_id: int, st: LedgerState | None, master_key: bytes,
                    recovery: bool) -> LedgerState:
        """The refusals of :meth:`add_entry` (deleted, wrong key, fenced), in their order; the
        ledger's state, created if unknown."""
        if st is not None:
            self._check_key(ledger_id, st, master_key)
            if st.fenced and not recovery:
                raise LedgerFencedError(f"ledger {ledger_id} is fenced")
            return st
        if self._index.is_deleted(ledger_id):
            raise LedgerFencedError(f"ledger {ledger_id} was deleted on this bookie")
        self._check_key(ledger_id, None, master_key)
        return self._index.ledger(ledger_id)

    def _add_existing(self, st: LedgerState, ledger_id: int, entry_id: int, body: bytes,
                      lac: int, on_done: AddCallback) -> None:
        """An add of an entry the index already holds: identical bytes are a durable no-op,
        different bytes an error; a damaged local copy is replaced (repair)."""
        held = self._compare_held(ledger_id, st, entry_id, body)
        if held is Held.DAMAGED:  # the local copy is damaged: store the new copy (repair)
            rec = encode_entry(body)
            self._journal.append_nowait(rec, (ledger_id, entry_id, lac, len(rec), on_done, st))
            st.pending[entry_id] = body
            return
        if held is Held.DIFFERENT:
            raise EntryExistsError(
                f"ledger {ledger_id} entry {entry_id} exists with different bytes")
        notify(on_done, None, ledger_id, entry_id)

    def fence(self, ledger_id: int, master_key: bytes) -> Awaitable[None]:
        """Fence durably (creating the ledger, fenced, if unknown). Takes effect at once; the
        returned awaitable completes once the fence is synced."""
        if self._index.is_deleted(ledger_id):
            raise NoSuchLedgerError(f"ledger {ledger_id} was deleted on this bookie")
        st = self._index.get(ledger_id)
        self._check_key(ledger_id, st, master_key)
        if st is None:
            st = self._index.ledger(ledger_id)
        prior = self._fence_futs.get(ledger_id)
        if st.fenced:
            if prior is None:  # the fence is durable
                done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                return done
            if not prior.done():
                return prior  # answer when the pending fence record is synced
            # the earlier fence record was never written (e.g. ENOSPC): journal it again
        key_rec = self._key_record(ledger_id, st, master_key)
        st.fenced = True
        if key_rec:
            self._journal.append(key_rec, (ledger_id, -1, -1, 0, None, st))
        fut = self._journal.append(encode_fence(ledger_id))
        self._fence_futs[ledger_id] = fut
        fut.add_done_callback(lambda _f: self._fence_settled(ledger_id, fut))
        self._on_ledger_change(ledger_id)
        return fut

    def _fence_settled(self, ledger_id: int, fut: asyncio.Future[None]) -> None:
        """Forget a fence once durable; keep a failed one so the next fence writes it again."""
        if self._fence_futs.get(ledger_id) is fut and not fut.cancelled() and (
            fut.exception() is None
        ):
            del self._fence_futs[ledger_id]

    def write_lac(self, ledger_id: int, lac: int, body: bytes,
                  master_key: bytes) -> Awaitable[None]:
        """Record an explicit LAC (and its digested body) durably; the awaitable completes
        once it is synced. Its record makes no journal batch of its own: it rides the next
        one (``journal_lazy_wait`` at most), so it never holds the next entry behind a sync."""
        if lac < -1:
            raise BadRequestError(f"ledger {ledger_id}: explicit LAC {lac} (at least -1)")
        if self._index.is_deleted(ledger_id):
            raise LedgerFencedError(f"ledger {ledger_id} was deleted on this bookie")
        st = self._index.get(ledger_id)
        self._check_key(ledger_id, st, master_key)
        if st is None:
            st = self._index.ledger(ledger_id)
        key_rec = self._key_record(ledger_id, st, master_key)
        if key_rec:
            self._journal.append(key_rec, (ledger_id, -1, -1, 0, None, st))
        fut = self._journal.append_lazy(encode_explicit_lac(ledger_id, lac, body))
        if lac >= st.explicit_lac:
            st.explicit_lac, st.explicit_lac_body = lac, body
            self._on_ledger_change(ledger_id)
        return fut

    def delete_ledger(self, ledger_id: int) -> Awaitable[None]:
        """Journal a tombstone; the ledger's bytes become garbage; later adds are rejected.
        Deleting a ledger this bookie never held records the deletion all the same."""
        if ledger_id < 0:
            raise BadRequestError(f"ledger id {ledger_id}: ledger ids are never negative")
        self._index.delete_ledger(ledger_id)
        fut = self._journal.append(encode_delete(ledger_id))
        self._on_ledger_change(ledger_id)
        return fut


#: ``on_done(error)`` of :meth:`StoreWrites.add_entry`: None once durable, else the error (a
#: BKError: what refused the add or what the journal failed with)
AddCallback = Callable[[BKError | None], None]
#: The journal tag of a record the store writes: (ledger id, entry id, piggybacked LAC,
#: record size, add callback, the ledger's state). A MASTER_KEY record's has entry id -1 and
#: size 0 (it is not an entry). The state is the ledger's one LedgerState object, which
#: ``Index`` keeps for the ledger's whole life (a deletion marks it, never replaces it; only
#: ``open`` replaces the index, before any write), so batch completion needs no lookup.
_Tag = tuple[int, int, int, int, "AddCallback | None", LedgerState]
_pack_record_header = RECORD_HEADER.pack
_crc32c = crc32c.crc32c


class ResolveFuture:
    """An :data:`AddCallback` that resolves a future (the awaitable forms of the add paths)."""

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut

    def __call__(self, error: BaseException | None) -> None:
        fut = self.fut
        if fut.done():
            return
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)
            fut.exception()  # the caller may never look; do not warn


#: ``on_done(outcome)`` of :meth:`StoreWrites.add_batch` (an AddOutcome for the whole batch)
BatchCallback = Callable[[AddOutcome], None]
