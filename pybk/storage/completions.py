"""The store's journal completions: what happens when a batch of writes is durable (or
failed, or the journal moved to a new segment).

An entry enters the index only here, after the fsync that covers it, and its caller is
answered in the same step (no future, no loop callback per entry); the callbacks of identical
adds that waited for it are answered with it. A tag is a tuple ``(ledger, entry, lac, size,
on_done, state)`` (what :class:`~pybk.storage.writes.StoreWrites` appends) or a
:class:`~pybk.storage.addbatch.BatchTag`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from itertools import accumulate
from typing import Any

from pybk.errors import fresh_copy
from pybk.storage.addbatch import BatchTag, bk_error, forget_pending, notify
from pybk.storage.index import Index
from pybk.storage.segments import SegmentTable
from pybk.storage.writes import AddCallback

__all__ = ["StoreCompletions"]

log = logging.getLogger(__name__)


class StoreCompletions:
    """:class:`pybk.storage.store.LedgerStore`'s journal callbacks. Given the index, the
    segment table, the adds waiting on a pending identical add (shared with
    :class:`~pybk.storage.writes.StoreWrites`, which fills it), the ledgers someone watches
    (None: all) and the store's ``on_ledger_change``."""

    def __init__(self, index: Index, segments: SegmentTable,
                 also_waiting: dict[tuple[int, int], list[AddCallback]],
                 watched: Container[int] | None,
                 on_ledger_change: Callable[[int], None]) -> None:
        self._index = index
        self._segments = segments
        self._also_waiting = also_waiting
        self._watched = watched
        self._on_ledger_change = on_ledger_change

    def adopt(self, index: Index) -> None:
        """Index into ``index`` from now on (start-up's, replacing the empty one)."""
        self._index = index

    def on_synced(self, seg: int, tags: list[Any], offsets: list[int]) -> None:
        """A journal batch is durable in segment ``seg``: index its entries, answer them."""
        # The hot path: once per entry, so the common case (the next entry of a held ledger)
        # is appended to the ledger's EntryIndex columns right here (what EntryIndex.put does
        # for it) rather than through put_entry, and the ledger's state comes with the tag
        # (the tuple pybk.storage.writes appends) rather than from a lookup.
        index = self._index
        watched = self._watched
        live = 0
        last = None
        done: list[Callable[[None], None]] = []
        changed: list[int] = []
        for tag, offset in zip(tags, offsets, strict=False):  # (offsets: one more, the end)
            if tag is None:
                continue
            if type(tag) is BatchTag:
                live += self._index_batch(tag, seg, offset)
                done.append(tag.on_done)
                lid = tag.ledger_id
                if lid != last:
                    last = lid
                    if watched is None or lid in watched:
                        changed.append(lid)
                continue
            lid, eid, lac, size, on_done, st = tag
            if not size:
                continue
            if on_done is not None:
                done.append(on_done)
            if lid != last:
                last = lid
                if watched is None or lid in watched:  # wake long polls once per run
                    changed.append(lid)
            st.pending.pop(eid, None)
            entries = st.entries
            if eid != entries.end or entries.sparse is not None or st.deleted:
                # rare paths (not the next id, re-added/compacted entry, deleted ledger): the
                # general code
                index.put_entry(lid, eid, (seg, offset, size), lac)
                continue
            entries.segs.append(seg)  # EntryIndex.put's append at the end, inlined
            entries.offs.append(offset)
            entries.sizes.append(size)
            entries.end = eid + 1
            live += size
            if lac > st.max_piggyback_lac:
                st.max_piggyback_lac = lac
        if live:
            index.seg_live[seg] = index.seg_live.get(seg, 0) + live
        for lid in changed:
            self._on_ledger_change(lid)
        if self._also_waiting:
            done.extend(self._waiters_of(tags))
        # Answer only once the whole batch is in the index (a reader told "done" finds it).
        for on_done in done:
            try:
                on_done(None)
            except Exception:  # a listener's bug must not break the journal's completion
                log.exception("add callback failed")

    def _index_batch(self, tag: BatchTag, seg: int, start: int) -> int:
        """Put the entries of a synced batch in the index; the live bytes added in ``seg``."""
        st = tag.state
        ids = tag.entry_ids
        forget_pending(st, tag)
        if st.deleted:
            return 0  # deleted while in flight: its bytes are garbage
        if tag.lac > st.max_piggyback_lac:
            st.max_piggyback_lac = tag.lac
        sizes = tag.sizes
        offsets = list(accumulate(sizes, initial=start))
        offsets.pop()
        if tag.ascending and st.entries.append_run(ids, seg, offsets, sizes):
            return sum(sizes)
        put = self._index.put_entry  # (the general path: moves, sparse ids, big gaps)
        lid = tag.ledger_id
        for eid, off, size in zip(ids, offsets, sizes, strict=True):
            put(lid, eid, (seg, off, size), -1)
        return 0

    def _waiters_of(self, tags: list[Any]) -> list[AddCallback]:
        """The callbacks of duplicate adds that waited for entries of this batch."""
        also = self._also_waiting
        out: list[AddCallback] = []
        for tag in tags:
            if tag is None:
                continue
            if type(tag) is BatchTag:
                for eid in tag.entry_ids:
                    out.extend(also.pop((tag.ledger_id, eid), ()))
            elif tag[3]:
                out.extend(also.pop((tag[0], tag[1]), ()))
        return out

    def on_rotate(self, old_seq: int, old_size: int, new_seq: int) -> None:
        """The journal sealed ``old_seq`` (``old_size`` bytes) and opened ``new_seq``."""
        self._segments.rotated(old_seq, old_size, new_seq)

    def on_failed(self, tags: list[Any], exc: BaseException) -> None:
        """A journal batch failed: each write in it is answered with ``exc``."""
        for tag in tags:
            if tag is None:
                continue
            if type(tag) is BatchTag:
                lid, st = tag.ledger_id, tag.state
                forget_pending(st, tag)
                for eid in tag.entry_ids:
                    for waiter in self._also_waiting.pop((lid, eid), ()):
                        notify(waiter, bk_error(fresh_copy(exc)), lid, eid)
                notify(tag.on_done, bk_error(exc), lid, tag.entry_ids[0])
                continue
            lid, eid, _lac, size, on_done, st = tag
            if size:
                st.pending.pop(eid, None)
                for waiter in [on_done, *self._also_waiting.pop((lid, eid), ())]:
                    if waiter is not None:
                        notify(waiter, bk_error(fresh_copy(exc)), lid, eid)
            else:  # a master-key record was lost: journal it again with the next write
                st.master_key = None
