"""The writer's segments: their ledgers (one made ahead), rolling, and retention after them.

Once the segment holds ``roll_bytes`` / ``roll_entries`` or is ``roll_seconds`` old, a roll
stops pushing to it, waits for its entries, closes its ledger, then completes it and adds the
next segment in one compare-and-set; batches sealed meanwhile wait in order and go to the new
segment. Retention runs after each roll (:class:`~pybk.logs.housekeeping.Housekeeper`, the
writer's part that also runs it on loop time).

:class:`RollingMixin` is :class:`pybk.logs.LogWriter`'s (a mixin over
:class:`~pybk.logs.appends.AppendsMixin`: the writer's state is one, set up by
``LogWriter.__init__``). Design notes: docs/internals.md, "pybk/logs/writer.py".
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from pybk.client.writer import LedgerHandle
from pybk.errors import (
    BKError,
    ClientClosedError,
    LedgerFencedError,
    NoSuchLedgerError,
    UnexpectedConditionError,
    fresh_copy,
)
from pybk.logs.appends import AppendsMixin
from pybk.logs.housekeeping import Housekeeper, retrieve
from pybk.logs.meta import COMPLETED, LogMetadata, SegmentInfo

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["RollingMixin"]

#: the writer's logger (its messages kept one name across the writer's modules)
log = logging.getLogger("pybk.logs.writer")


class RollingMixin(AppendsMixin):
    """:class:`pybk.logs.LogWriter`'s segments, rolls and ledger made ahead (the retention
    after a roll is the writer's :class:`~pybk.logs.housekeeping.Housekeeper`'s)."""

    _md: LogMetadata
    _epoch: int
    _seg_started: float
    _next: asyncio.Task[LedgerHandle] | None
    _roll_task: asyncio.Task[None] | None
    _tasks: set[asyncio.Task[None]]
    _housekeeper: Housekeeper

    # -- segments and their ledgers ----------------------------------------------------------

    async def _create_ledger(self) -> LedgerHandle:
        cfg = self._md.config
        return await self._cat.client.create_ledger(
            cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum, cfg.digest_type, b"",
            custom_metadata={"pybk.log": self._cat.key.encode(), **self._cat.ledger_tags},
        )

    async def _start_segment(self, completed: SegmentInfo | None) -> None:
        """Complete ``completed`` (if any) and add the next segment, in one CAS."""
        lh = await self._take_next_ledger()
        now = self._cat.now_ms()

        def transform(md: LogMetadata) -> LogMetadata:
            if completed is not None:
                md = md.replace_segment(completed)
            seg = SegmentInfo(seq=md.next_seq, ledger_id=lh.id, ctime_ms=now, mtime_ms=now)
            return md.with_changes(
                segments=(*md.segments, seg), next_seq=md.next_seq + 1,
                allocated=tuple(x for x in md.allocated if x != lh.id),
            )

        try:
            md = await self._cat.update(transform, epoch=self._epoch)
        except BaseException:
            await _abandon_ledger(self._cat, lh)
            raise
        self._md = md
        self._seg = md.segments[-1]
        self._lh = lh
        self._seg_records = self._seg_entries = self._seg_bytes = self._last_count = 0
        self._seg_started = self._loop.time()

    async def _take_next_ledger(self) -> LedgerHandle:
        task, self._next = self._next, None
        if task is not None:
            try:
                return await task
            except (BKError, OSError) as exc:  # made ahead and failed: make one now
                log.info("log %s: the ledger made ahead failed (%s); making one now",
                         self._cat.name, exc)
        return await self._create_ledger()

    async def _make_ahead(self) -> LedgerHandle:
        lh = await self._create_ledger()
        try:
            self._md = await self._cat.update(
                lambda md: md.with_changes(allocated=(*md.allocated, lh.id)), epoch=self._epoch
            )
        except BaseException:
            await _abandon_ledger(self._cat, lh)
            raise
        return lh

    # -- rolling -----------------------------------------------------------------------------

    def _roll_due(self, fraction: float = 1.0) -> bool:
        cfg = self._md.config
        if cfg.roll_bytes is not None and self._seg_bytes >= cfg.roll_bytes * fraction:
            return True
        if cfg.roll_entries is not None and self._seg_entries >= cfg.roll_entries * fraction:
            return True
        return cfg.roll_seconds is not None and (
            self._loop.time() - self._seg_started >= cfg.roll_seconds * fraction
        )

    def _maybe_roll(self) -> None:
        if self._rolling or self._error is not None:
            return
        if self._roll_due():
            self._begin_roll()
        elif self._next is None and self._roll_due(0.5):
            self._next = self._loop.create_task(self._make_ahead())
            self._next.add_done_callback(retrieve)

    def _begin_roll(self) -> None:
        self._rolling = True
        task = self._loop.create_task(self._roll())
        self._roll_task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _roll(self) -> None:
        """One roll. It owns ``_rolling`` until the next segment is in place; then the
        queued batches go out (which may begin the next roll) and retention runs."""
        try:
            completed = await self._seal_segment()
            await self._start_segment(completed)
        except BaseException as exc:
            self._rolling = False
            self._fail(_as_failure(exc))
            if not isinstance(exc, Exception):
                raise
            return
        self._rolling = False
        self._drain_queue()
        try:
            await self._housekeeper.apply_retention()
        except BaseException as exc:
            self._fail(_as_failure(exc))
            if not isinstance(exc, Exception):
                raise

    def _drain_queue(self) -> None:
        while self._queued and self._lh is not None and not self._rolling:
            self._send(self._queued.popleft())

    async def _seal_segment(self) -> SegmentInfo:
        """Stop writing the current segment: wait for its entries, close its ledger; the
        segment as completed (``last_entry`` -1 when it holds nothing)."""
        lh, seg = self._lh, self._seg
        if lh is None or seg is None:
            raise UnexpectedConditionError(
                f"log {self._cat.name!r}: no segment to complete (a roll without a segment)"
            )
        self._lh = None
        try:
            await lh.close()
        except BKError as exc:
            # e.g. the ledger was recovered and closed elsewhere: say so if the log moved on
            current = await self._cat.read()
            if current.epoch != self._epoch:
                raise LedgerFencedError(
                    f"log {self._cat.name!r}: another writer ({current.writer or 'unnamed'}, "
                    f"epoch {current.epoch}) took the log over from this one"
                ) from exc
            raise
        if self._error is not None:  # an entry failed (fenced: another writer took over)
            raise fresh_copy(self._error)
        if lh.last_add_confirmed < 0:
            return seg.with_changes(state=COMPLETED, mtime_ms=self._cat.now_ms())
        return seg.with_changes(
            state=COMPLETED, last_entry=lh.last_add_confirmed, last_slot=self._last_count - 1,
            records=self._seg_records, bytes=lh.length, max_txid=self._sent_max_txid,
            mtime_ms=self._cat.now_ms(),
        )

    async def roll(self) -> None:
        """Complete the current segment now and start the next one (rolls otherwise happen
        by size, entry count or age). Nothing to do while the segment is empty."""
        self._check_open()
        self._seal()
        await self._wait_roll()
        if not self._rolling and self._error is None and self._seg_entries > 0:
            self._begin_roll()
            await self._wait_roll()
        if self._error is not None:
            raise fresh_copy(self._error)

    async def _wait_roll(self) -> None:
        """Wait for every roll under way (and the retention each runs after it)."""
        while self._tasks:
            await asyncio.wait([asyncio.shield(t) for t in list(self._tasks)])

    async def _release(self) -> None:
        """Give back the ledger made ahead (deleted, and dropped from ``allocated``)."""
        task, self._next = self._next, None
        if task is None:
            return
        await asyncio.wait([task])  # (a creation cut short would leave its ledger behind)
        if task.cancelled() or task.exception() is not None:
            return
        lh = task.result()
        await _abandon_ledger(self._cat, lh)
        if self._error is None:
            self._md = await self._cat.update(
                lambda md: md.with_changes(allocated=tuple(x for x in md.allocated
                                                           if x != lh.id))
                if lh.id in md.allocated else None,
                epoch=self._epoch,
            )


def _as_failure(exc: BaseException) -> BaseException:
    """What the writer's appends fail with when a roll ends in ``exc``: a roll cancelled (the
    writer's task torn down with its loop or process) is a closed client to them, never a
    bare CancelledError in an append's future."""
    if isinstance(exc, Exception):
        return exc
    failure = ClientClosedError(f"the log writer was stopped while rolling ({type(exc).__name__})")
    failure.__cause__ = exc
    return failure


async def _abandon_ledger(cat: LogCatalog, lh: LedgerHandle) -> None:
    """A ledger this writer made and no longer needs (a segment that never made it into the
    metadata, a ledger made ahead): delete it, unless a segment names it after all (a CAS
    whose reply was lost, "outcome unknown", may have been applied). Deleting one still
    listed in ``allocated`` is harmless: whoever clears the list deletes it again."""
    try:
        md = await cat.read()
    except BKError as exc:
        log.warning("log %s: cannot tell whether ledger %d is in use (%s); keeping it",
                    cat.name, lh.id, exc)
        return
    if any(s.ledger_id == lh.id for s in md.segments):
        return
    try:
        await lh.close()
    except NoSuchLedgerError:
        return  # already deleted (by the writer that took the log over)
    except BKError as exc:
        log.info("log %s: unused ledger %d did not close: %s", cat.name, lh.id, exc)
    try:
        await cat.delete_ledger(lh.id)
    except BKError as exc:
        log.warning("log %s: could not delete unused ledger %d: %s", cat.name, lh.id, exc)
