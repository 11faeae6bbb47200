"""Batched adds in the store: the common batch admitted whole, the tag of a batch's one
journal append, and the answer of a batch whose entries fare differently.

:meth:`pybk.storage.writes.StoreWrites.add_batch` admits a clean batch with a few C-level
passes (:func:`admit_run`), else entry by entry into an :class:`Admitted`; either way its new
records go to the journal as one append tagged with a :class:`BatchTag`, and
:class:`BatchParts` answers once when some entries were refused, already held or waiting for
an identical add. Kept apart from :mod:`pybk.storage.writes` (the write paths themselves);
:func:`notify` and :func:`bk_error` are how both answer an add.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from itertools import islice, repeat
from operator import add as _add
from operator import lt as _lt
from typing import TYPE_CHECKING, Any, Final

import crc32c

from pybk.errors import BKError, IOBookieError
from pybk.storage.index import LedgerState
from pybk.storage.records import ENTRY_CRC, ENTRY_TYPE, RECORD_HEADER, RECORD_HEADER_SIZE
from pybk.wire import ENTRY_HEADER_SIZE, AddOutcome

if TYPE_CHECKING:
    from pybk.storage.writes import AddCallback, BatchCallback

__all__ = ["ENTRY_IDS_LAC", "RUN_MIN", "Admitted", "BatchParts", "BatchTag", "admit_run",
           "bk_error", "checked_run", "encode_run", "forget_pending", "notify",
           "unpack_entry_ids_lac"]

log = logging.getLogger(__name__)

#: the ids and piggybacked LAC of a framed entry's header (its length field skipped, not
#: converted), needing the whole header like ENTRY_HEADER
ENTRY_IDS_LAC = struct.Struct(">qqq8x")
assert ENTRY_IDS_LAC.size == ENTRY_HEADER_SIZE
unpack_entry_ids_lac = ENTRY_IDS_LAC.unpack_from
_pack_record_header = RECORD_HEADER.pack
_crc32c = crc32c.crc32c


def admit_run(ledger_id: int, st: LedgerState, entry_ids: Sequence[int],
               bodies: Sequence[bytes]) -> tuple[bytes, list[int], list[int], int] | None:
    """The common batch, admitted with a few C-level passes instead of a Python step per
    entry: ids strictly ascending from the index's dense end on (so none is held), none
    being written, every body's header naming its ledger and id. Returns what to journal
    (the records back to back, exactly what :meth:`~pybk.storage.writes.StoreWrites._admit`
    makes), their ids, record sizes and highest piggybacked LAC (the caller keeps the
    batch's tag in ``LedgerState.runs`` while it is in flight: no dict entry per entry);
    None (and nothing changed) when any of that does not hold: the batch then takes the
    per-entry checks, which refuse or answer each entry alone."""
    entries = st.entries
    n = len(bodies)
    if entries.sparse is not None or len(entry_ids) != n or n < RUN_MIN:
        return None  # (a few entries: the per-entry checks cost less than the passes)
    ids = list(entry_ids)
    first = ids[0]
    if first < entries.end or first < 0 or (
            n > 1 and not all(map(_lt, ids, islice(ids, 1, None)))):
        return None
    if st.pending and not st.pending.keys().isdisjoint(ids):
        return None
    last = ids[-1]
    for other in st.runs:  # batches in flight: (in order) all below, unless resent
        if other.entry_ids[0] <= last and other.entry_ids[-1] >= first:
            return None
    try:
        heads = list(map(unpack_entry_ids_lac, bodies))
    except struct.error:  # a body shorter than the header
        return None
    lids, eids, lacs = zip(*heads, strict=True)
    if lids.count(ledger_id) != n or list(eids) != ids:
        return None
    lens = list(map(len, bodies))
    records: list[bytes] = [b""] * (2 * n)
    records[::2] = map(_pack_record_header, lens, map(_crc32c, bodies, repeat(ENTRY_CRC)),
                       repeat(ENTRY_TYPE))
    records[1::2] = bodies
    return (b"".join(records), ids, list(map(_add, lens, repeat(RECORD_HEADER_SIZE))),
            max(lacs))


#: from this many entries on, a batch may be admitted by :func:`admit_run`
RUN_MIN: Final = 8


def checked_run(ledger_id: int, entry_ids: Sequence[int], bodies: Sequence[bytes],
                ) -> tuple[list[int], int] | None:
    """The engine-neutral part of :func:`admit_run`, for the db engine: (the ids, the
    highest piggybacked LAC) when there are at least :data:`RUN_MIN` ids, strictly ascending
    from 0 on, and every body's header names its ledger and id; else None."""
    n = len(bodies)
    if len(entry_ids) != n or n < RUN_MIN:
        return None
    ids = list(entry_ids)
    if ids[0] < 0 or not all(map(_lt, ids, islice(ids, 1, None))):
        return None
    try:
        heads = list(map(unpack_entry_ids_lac, bodies))
    except struct.error:  # a body shorter than the header
        return None
    lids, eids, lacs = zip(*heads, strict=True)
    if lids.count(ledger_id) != n or list(eids) != ids:
        return None
    return ids, max(lacs)


def encode_run(bodies: Sequence[bytes]) -> bytes:
    """ENTRY records of ``bodies`` back to back (what ``encode_entry`` makes of each), in a
    few C-level passes."""
    records: list[bytes] = [b""] * (2 * len(bodies))
    records[::2] = map(_pack_record_header, map(len, bodies),
                       map(_crc32c, bodies, repeat(ENTRY_CRC)), repeat(ENTRY_TYPE))
    records[1::2] = bodies
    return b"".join(records)


def forget_pending(st: LedgerState, tag: BatchTag) -> None:
    """A batch is no longer in flight (durable, failed, or never sent)."""
    if tag.bodies is not None:
        st.runs.remove(tag)
        return
    pop = st.pending.pop
    for eid in tag.entry_ids:
        pop(eid, None)


def notify(on_done: Callable[[Any], None], error: Any, lid: int, eid: int) -> None:
    """Run one add callback; its bug must not break the journal's batch completion."""
    try:
        on_done(error)
    except Exception:
        log.exception("add callback for ledger %s entry %s failed", lid, eid)


class BatchTag:
    """The journal tag of one :meth:`~pybk.storage.writes.StoreWrites.add_batch`'s records (one
    append)."""

    __slots__ = ("ascending", "bodies", "entry_ids", "lac", "ledger_id", "on_done", "sizes",
                 "state")

    def __init__(self, ledger_id: int, state: LedgerState, entry_ids: list[int],
                 sizes: list[int], lac: int, ascending: bool, on_done: BatchCallback,
                 bodies: Sequence[bytes] | None = None) -> None:
        self.ledger_id = ledger_id
        self.state = state
        self.entry_ids = entry_ids
        self.sizes = sizes  # each record's size, in the append's order
        self.lac = lac  # the highest piggybacked LAC among them
        self.ascending = ascending
        self.on_done = on_done
        #: the bodies, for a batch kept in ``LedgerState.runs`` while in flight (the fast
        #: path); None: its entries are in ``LedgerState.pending`` one by one
        self.bodies = bodies


class Admitted:
    """What admitting one batch gathered: the records to append (and their ids, sizes, the
    batch index of each) and, once an entry is not written by that append (refused, already
    held, or waiting for an identical add in flight), the :class:`BatchParts` that answers."""

    __slots__ = ("ascending", "ids", "lac", "n", "on_done", "parts", "records", "sizes",
                 "where")

    def __init__(self, n: int, on_done: BatchCallback) -> None:
        self.n = n
        self.on_done = on_done
        self.records: list[bytes] = []
        self.ids: list[int] = []
        self.sizes: list[int] = []
        self.where: list[int] = []
        self.lac = -1
        self.ascending = True
        self.parts: BatchParts | None = None

    def _parts(self) -> BatchParts:
        if self.parts is None:
            self.parts = BatchParts(self.n, self.on_done)
        return self.parts

    def refuse(self, i: int, error: BKError) -> None:
        self._parts().results[i] = error

    def held(self, i: int) -> None:
        self._parts()

    def waiting(self, i: int) -> AddCallback:
        return self._parts().part([i])

    def on_written(self) -> BatchCallback:
        """The callback of the journal append of :attr:`records`."""
        if self.parts is None:
            return self.on_done  # the common case: the append answers for the whole batch
        settle = self.parts.part(self.where)

        def on_written(outcome: AddOutcome) -> None:
            settle(outcome if isinstance(outcome, BKError) else None)

        return on_written


class BatchParts:
    """Collects the outcome of each part of a batch and answers ``on_done`` once, when the
    last part is in."""

    __slots__ = ("left", "on_done", "results")

    def __init__(self, n: int, on_done: BatchCallback) -> None:
        self.results: list[BKError | None] = [None] * n
        self.on_done: BatchCallback | None = on_done
        self.left = 1  # until ready(): parts may settle while the batch is being admitted

    def part(self, indices: list[int]) -> AddCallback:
        self.left += 1

        def settle(error: BaseException | None) -> None:
            if error is not None:
                err = bk_error(error)
                for i in indices:
                    self.results[i] = err
            self._one_done()

        return settle

    def ready(self) -> None:
        self._one_done()

    def abandon(self) -> None:
        """The batch was refused as a whole (raised): its parts answer nobody."""
        self.on_done = None

    def _one_done(self) -> None:
        self.left -= 1
        if self.left or self.on_done is None:
            return
        results = self.results
        outcome: AddOutcome = None if all(r is None for r in results) else results
        notify(self.on_done, outcome, -1, -1)


def bk_error(exc: BaseException) -> BKError:
    """The error an add reports for ``exc`` (what the journal failed with is a BKError; any
    other exception is a bug, reported as an I/O error of this bookie)."""
    if isinstance(exc, BKError):
        return exc
    return IOBookieError(f"unexpected {type(exc).__name__}: {exc}")
