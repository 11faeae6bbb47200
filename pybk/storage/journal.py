"""The journal's write side: segment files, serial group commit, rotation.

Group commit is *serial*: write -> fdatasync -> write -> fdatasync. Appends made while a sync is
in flight accumulate in a buffer; when the sync returns, the whole buffer goes out as one batch
(one ``write``) and one sync. So at any moment only the last batch of the active segment can
be unsynced, which is what lets replay tell a torn tail from corruption.

An idle journal never delays a lone append: the writer task wakes on the next loop iteration
and, if nothing else arrived during that iteration, writes at once. While appends keep arriving
every iteration it keeps gathering, up to ``max_wait`` seconds (loop time) or the batch limits.

Design notes: docs/internals.md, "pybk/storage/journal.py".
"""

from __future__ import annotations

import asyncio
import errno
import posixpath
from collections.abc import Callable
from itertools import accumulate
from typing import Any

from pybk.errors import IOBookieError, JournalFailedError, ReadOnlyBookieError, fresh_copy
from pybk.runtime.eventloop import yield_now
from pybk.stats import BookieStats
from pybk.storage.fs import FileHandle, FileSystem
from pybk.storage.index import Position
from pybk.storage.journalbatch import JournalBatch, fail_futures, not_open
from pybk.storage.journallazy import LazyRecords
from pybk.storage.prealloc import PREP_SUFFIX, SegmentPreparer, drop_partial, rotation_can_wait
from pybk.storage.records import (
    BATCH_HEADER_SIZE,
    SEGMENT_HEADER_SIZE,
    encode_batch,
    encode_segment_header,
)
from pybk.storage.segments import SEGMENT_SUFFIX, parse_segment_name, segment_name

__all__ = ["SEGMENT_SUFFIX", "FailedCallback", "Journal", "SyncedCallback",
           "parse_segment_name", "segment_name"]

#: ``on_synced(segment_seq, tags, offsets)`` once a batch is durable: ``tags[i]`` is the tag
#: of the batch's i-th item (None: appended without one), ``offsets[i]`` where that item
#: starts in the segment (``offsets`` has one more element: where the batch ends). Two flat
#: lists rather than a pair per item: the hot path, no object per record.
SyncedCallback = Callable[[int, list[Any], list[int]], None]
FailedCallback = Callable[[list[Any], BaseException], None]

class Journal:
    """Appends records to the active segment with serial group commit. See module docstring."""

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        instance_id: str,
        *,
        on_synced: SyncedCallback,
        on_failed: FailedCallback,
        on_fatal: Callable[[BaseException], None],
        on_write_error: Callable[[OSError], None],
        on_rotate: Callable[[int, int, int], None] | None = None,
        max_wait: float = 0.001,
        max_batch_bytes: int = 4 << 20,
        max_batch_count: int = 8192,
        segment_size: int = 64 << 20, initial_segment_size: int | None = None,
        inline_sync_max: int = 0,
        overlap_syncs: bool = False,
        overlap_split_min: int = 100,
        preallocate: bool = False,
        zero_fill_below: float = 96e6,
        ack_before_fsync: bool = False,
        inline_sync_skips_fsync: bool = False,
        overlap_ack_before_sync: bool = False,
        lazy_wait: float = 0.005,
        stats: BookieStats | None = None,
    ) -> None:
        self.fs = fs
        #: batch sizes and fsync latency, recorded once per batch (None: not recorded)
        self._stats = stats
        #: mutation switches (broken builds for checker tests; named in pybk.storage.store):
        #: ACK_BEFORE_FSYNC answers every batch before its sync, INLINE_SYNC_SKIPS_FSYNC
        #: answers a batch due for an inline sync without syncing it, OVERLAP_ACK_BEFORE_SYNC
        #: answers an overlapped batch as soon as its sync has started
        self._ack_before_fsync = ack_before_fsync
        self._inline_skips_fsync = inline_sync_skips_fsync
        self._overlap_acks_early = overlap_ack_before_sync
        self.directory = directory
        self.instance_id = instance_id
        self.max_wait = max_wait
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_count = max_batch_count
        self.segment_size = segment_size
        self.initial_segment_size, self._first_seq = min(  # (see size_of)
            segment_size, initial_segment_size or segment_size), 0
        self._on_synced = on_synced
        self._on_failed = on_failed
        self._on_fatal = on_fatal
        self._on_write_error = on_write_error
        self._on_rotate = on_rotate
        self._data: list[bytes] = []
        self._tags: list[Any] = []
        self._futs: list[asyncio.Future[None] | None] = []
        #: each buffered record's weight (the entries it holds: a batched add's record holds
        #: all of its batch's) and their sum, for the overlapped journal's thresholds
        self._weights: list[int] = []
        #: records held for the next batch (:meth:`append_lazy`), at most ``lazy_wait`` s
        self.lazy = LazyRecords(lazy_wait, self._release_lazy)
        self._entries = 0
        self._bytes = 0
        self._fh: FileHandle | None = None
        self._seq = -1
        self._batch_seq = 0
        self._position = Position(0, 0, 0)
        self._task: asyncio.Task[None] | None = None
        #: the batch being written or synced
        self._inflight: JournalBatch | None = None
        #: overlapped journal: the last batch, synced and not completed yet
        self._done: JournalBatch | None = None
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._closing = False
        #: The fatal error once the journal has failed (fsync error or crash); None while healthy.
        self.failed: BaseException | None = None
        self.inline_sync_max = inline_sync_max
        #: complete each batch while the next one syncs (see the module docstring)
        self.overlap_syncs = overlap_syncs
        #: overlapped journal: a buffer of at least twice this many entries, with nothing to
        #: complete meanwhile, is written in two halves; a synced batch of fewer entries is
        #: completed before the next batch is written (its cohort merges with the other)
        self.overlap_split_min = max(1, overlap_split_min)
        self._new_future: Callable[[], asyncio.Future[None]] = not_open
        self.preallocate = preallocate
        #: the active segment is a preallocated one written in place (its file is
        #: ``segment_size`` long, or longer once a batch crossed that), not appended to
        self._in_place = False
        self._opened_at = 0.0  # loop time the active segment was opened
        self.stats = {"batches": 0, "records": 0, "bytes": 0, "rotations": 0, "write_errors": 0,
                      "inline_syncs": 0, "overlapped": 0, "splits": 0, "preallocated": 0,
                      "zero_filled": 0, "allocated": 0, "prealloc_failures": 0, "lazy": 0}
        #: makes preallocated segments ahead of use (``preallocate``)
        self.preparer = SegmentPreparer(fs, directory, instance_id,
                                        segment_path=self.segment_path, size_of=self.size_of,
                                        zero_fill_below=zero_fill_below, stats=self.stats)

    # -- life cycle ---------------------------------------------------------------------------

    @property
    def position(self) -> Position:
        """The end of the last synced batch: everything before it is durable."""
        return self._position

    @property
    def segment_seq(self) -> int:
        return self._seq

    def segment_path(self, seq: int) -> str:
        return posixpath.join(self.directory, segment_name(seq))

    def size_of(self, seq: int) -> int:
        """Segment ``seq``'s length: grows with use (``initial_segment_size``, doubled per
        segment since the journal opened, up to ``segment_size``): a small bookie takes little
        disk."""
        grown = self.initial_segment_size << min(max(0, seq - self._first_seq), 48)
        return min(self.segment_size, grown)

    async def open(self, seq: int) -> None:
        """Start a fresh active segment ``seq`` and the writer task."""
        self._first_seq = seq
        for name in self.fs.listdir(self.directory):
            if name.endswith(SEGMENT_SUFFIX + PREP_SUFFIX):  # made before a stop or a crash:
                self.fs.delete(posixpath.join(self.directory, name))  # its sync is unknown
        await self._new_segment(seq)  # (its directory fsync makes the deletions durable)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        loop = asyncio.get_running_loop()
        self._new_future = loop.create_future
        self._task = loop.create_task(self._run(), name="pybk-journal")

    async def _new_segment(self, seq: int) -> None:
        path = self.segment_path(seq)
        fh = await self.preparer.open_prepared(seq) if self.preallocate else None
        in_place = fh is not None
        if fh is None:
            fh = self.fs.open_append(path)
            try:
                fh.write(encode_segment_header(seq, self.instance_id))
                await fh.sync()
                await self.fs.fsync_dir(self.directory)
            except BaseException:
                fh.close()
                raise
        if self._fh is not None:
            self._fh.close()
        self._fh = fh
        self._in_place = in_place
        self._seq = seq
        self._batch_seq = 0
        self._position = Position(seq, SEGMENT_HEADER_SIZE, 0)
        self._opened_at = asyncio.get_running_loop().time()

    async def close(self) -> None:
        """Write and sync everything appended so far, then stop and close the segment."""
        if self.lazy.data:
            self._release_lazy()
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None
        await self.preparer.close()
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def abandon(self, exc: BaseException) -> None:
        """Crash: stop at once, no sync; every pending append fails with ``exc``."""
        if self.failed is None:
            self.failed = exc
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.preparer.stop()
        self._fail_inflight(exc)
        self._fail_buffer(exc)
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # -- appends ------------------------------------------------------------------------------

    def append(self, data: bytes, tag: Any = None) -> asyncio.Future[None]:
        """Queue framed record bytes; the future resolves once they are durable.

        ``tag`` (if not None) is handed back through ``on_synced`` with the item's end offset,
        or through ``on_failed`` if the batch could not be written."""
        if self.failed is not None or self._closing or self._task is None:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fail_futures([fut], self._refusal())
            return fut
        self.append_nowait(data, tag)
        fut = self._new_future()
        self._futs[-1] = fut
        return fut

    def append_lazy(self, data: bytes) -> asyncio.Future[None]:
        """:meth:`append`, held for the next batch (:mod:`pybk.storage.journallazy`)."""
        if self._data or self.failed is not None or self._closing or self._task is None:
            return self.append(data)
        fut = self._new_future()
        self.stats["lazy"] += 1
        self.lazy.hold(asyncio.get_running_loop(), data, fut)
        return fut

    def _release_lazy(self) -> None:
        """Put the held records in the buffer, ahead of anything appended after them."""
        data, futs = self.lazy.take()
        for d, fut in zip(data, futs, strict=True):
            self.append_nowait(d, None)
            self._futs[-1] = fut

    def append_nowait(self, data: bytes, tag: Any, weight: int = 1) -> None:
        """Queue framed record bytes whose outcome comes only through the tag (``on_synced``
        or ``on_failed``): the hot path, no future per record. ``weight``: the entries the
        bytes hold (a batched add's records go as one item), what the overlapped journal's
        thresholds count. Raises JournalFailedError at once when the journal takes no more
        writes (then the tag is never handed back)."""
        if self.failed is not None or self._closing or self._task is None:
            raise self._refusal()
        if self.lazy.data:  # (held records go first)
            self._release_lazy()
        if not self._data:
            assert self._wake is not None and self._idle is not None
            self._wake.set()
            self._idle.clear()
        self._data.append(data)
        self._tags.append(tag)
        self._futs.append(None)
        self._weights.append(weight)
        self._entries += weight
        self._bytes += len(data)

    @property
    def backlog(self) -> tuple[int, int]:
        """Records and bytes waiting for the next batch (a queue depth for operators)."""
        return len(self._data), self._bytes

    def _refusal(self) -> BaseException:
        return fresh_copy(self.failed or JournalFailedError("journal is closed"))

    async def drain(self) -> None:
        """Wait until everything appended so far has been written and synced (or failed)."""
        if self.lazy.data:
            self._release_lazy()
        if self._idle is not None and self._task is not None:
            await self._idle.wait()

    # -- the writer task ------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or an injected fault: never leave a waiter hanging
            err = JournalFailedError(f"journal writer stopped: {type(exc).__name__}: {exc}")
            self.failed = err
            self.preparer.stop()
            self._fail_inflight(err)
            self._fail_buffer(err)
            self._on_fatal(err)

    async def _loop(self) -> None:
        assert self._wake is not None and self._idle is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._data and self._done is not None:
                self._complete_done()  # its callbacks may buffer the next writes
                continue
            if not self._data:
                self._idle.set()
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                if not self._data:
                    continue
                # Woken from idle: gather while more appends keep arriving, up to max_wait.
                # The first append woke us; a lone append is written at once. ``rounds`` bounds
                # the gathering under a virtual clock that does not advance on sleep(0).
                start = loop.time()
                seen = 1
                rounds = 0
                while (
                    len(self._data) > seen
                    and self.max_wait > 0
                    and len(self._data) < self.max_batch_count
                    and self._bytes < self.max_batch_bytes
                    and loop.time() - start < self.max_wait
                    and rounds < 1000
                ):
                    seen = len(self._data)
                    rounds += 1
                    await yield_now
            await self._write_batch()
            if self.failed is not None:
                self._idle.set()
                return
            fh = self._fh
            size = self.size_of(self._seq)
            if (self.preallocate and self.preparer.seq <= self._seq and fh is not None
                    and fh.size() >= size // 2):  # (half full: see SegmentPreparer.start)
                elapsed = loop.time() - self._opened_at
                self.preparer.start(self._seq + 1, fh.size() - SEGMENT_HEADER_SIZE, elapsed)
            if fh is not None and fh.size() >= size:
                self._complete_done()  # answer it now, not after the new segment's syncs
                old_seq, old_size = self._seq, fh.size()
                try:
                    await self._new_segment(old_seq + 1)
                except OSError as exc:
                    if (rotation_can_wait(exc)
                            and drop_partial(self.fs, self.segment_path(old_seq + 1))):
                        # no room (or no descriptor) for a new segment: keep appending to
                        # this one (rotation is retried after the next batch); the owner
                        # turns read-only (ENOSPC) or frees descriptors (EMFILE, ENFILE)
                        self._on_write_error(exc)
                        continue
                    self._fatal(exc, f"creating segment {old_seq + 1}")
                    return
                self.stats["rotations"] += 1
                if self._on_rotate is not None:
                    self._on_rotate(old_seq, old_size, old_seq + 1)

    def _take(self, count: int = 0,
              ) -> tuple[list[bytes], list[Any], list[asyncio.Future[None] | None], int]:
        n = count or len(self._data)
        if n > self.max_batch_count or self._bytes > self.max_batch_bytes:
            candidates = self._data[:n]
            n = 0
            size = 0
            for d in candidates:
                if n and (n >= self.max_batch_count or size + len(d) > self.max_batch_bytes):
                    break
                size += len(d)
                n += 1
        data, tags, futs = self._data[:n], self._tags[:n], self._futs[:n]
        if n == len(self._data):
            entries = self._entries
            self._data, self._tags, self._futs, self._weights = [], [], [], []
            self._bytes = self._entries = 0
        else:
            entries = sum(self._weights[:n])
            del self._data[:n], self._tags[:n], self._futs[:n], self._weights[:n]
            self._bytes -= sum(len(d) for d in data)
            self._entries -= entries
        return data, tags, futs, entries

    async def _write_batch(self) -> None:
        """Write one batch and sync it. Serial: called only once the previous batch is synced,
        so only the newest batch of the active segment is ever unsynced.

        Overlapped (``overlap_syncs``): the previous batch, synced but not yet completed, is
        completed while this one syncs; this batch is then left for the next call (or the
        loop, when nothing else is buffered) to complete."""
        fh = self._fh
        assert fh is not None
        done = self._done
        if done is not None and done.entries < self.overlap_split_min:
            # too small to hide a sync behind: answer it first, so the records its answers
            # bring join this batch (two small cohorts merge back into one)
            self._complete_done()
            done = None
        split = (self.overlap_syncs and done is None and len(self._data) >= 2
                 and self._entries >= 2 * self.overlap_split_min)
        batch = self._write(fh, self._half() if split else 0)
        if batch is None:
            return
        stats = self._stats
        sync_started = asyncio.get_running_loop().time() if stats is not None else 0.0
        acked_early = self._ack_before_fsync
        if acked_early:  # deliberately broken build: acknowledge before the data is durable
            self._complete_done()
            done = None
            self._complete(batch)
        try:
            if done is not None or split:
                # overlap: the disk syncs this batch while the loop completes the last one
                # (or, after a split, while the rest of the buffer waits for the next round)
                syncing = fh.start_sync()
                if done is not None:
                    self._done = None
                    self.stats["overlapped"] += 1
                    self._complete(done)
                else:
                    self.stats["splits"] += 1
                if self._overlap_acks_early:  # broken build: answered while still syncing
                    self._complete(batch)
                await syncing
            elif self._sync_inline(batch.records) and (
                    self._inline_skips_fsync or fh.sync_inline()):  # (broken build: no sync)
                self.stats["inline_syncs"] += 1
            else:
                await fh.sync()
        except OSError as exc:
            self._fatal(exc, f"fsync of {fh.path}")
            return
        except asyncio.CancelledError:
            raise
        self._inflight = None
        self.stats["batches"] += 1
        self.stats["records"] += batch.records
        self.stats["bytes"] += batch.bytes
        if stats is not None:
            stats.journal_batch(batch.records, batch.bytes,
                                asyncio.get_running_loop().time() - sync_started)
        if batch.completed:
            return
        if self.overlap_syncs:
            self._done = batch  # completed by the next batch's sync or by the loop
        else:
            self._complete(batch)

    def _half(self) -> int:
        """How many buffered records hold about half the buffered entries (at least one,
        never all): the first half of a split."""
        half = self._entries // 2
        held = n = 0
        for weight in self._weights:
            held += weight
            n += 1
            if held >= half:
                break
        return min(n, len(self._weights) - 1)

    def _write(self, fh: FileHandle, count: int) -> JournalBatch | None:
        """Write the first ``count`` buffered records (0: all the limits allow) as one batch;
        None if the write failed (then the batch is answered with the error)."""
        data, tags, futs, entries = self._take(count)
        before = fh.size()
        payload = b"".join(data)
        end = before + BATCH_HEADER_SIZE + len(payload)
        # each record's start offset: the running sizes after the batch header
        offsets = list(accumulate(map(len, data), initial=before + BATCH_HEADER_SIZE))
        batch = JournalBatch(tags, offsets, futs, end - before, entries)
        self._inflight = batch
        try:
            fh.write(encode_batch(self._batch_seq, payload))
        except OSError as exc:
            self._write_failed(exc, before, batch)
            return None
        self._batch_seq += 1
        batch.position = Position(self._seq, end, self._batch_seq)
        return batch

    def _sync_inline(self, records: int) -> bool:
        """Sync this batch on the loop's thread? Only a batch of at most ``inline_sync_max``
        records (0: never): for such a batch the thread hop costs about half the sync."""
        return records <= self.inline_sync_max

    def _complete(self, batch: JournalBatch) -> None:
        # Index update and position move happen together, synchronously: any observer sees
        # an index that reflects exactly the batches up to ``position`` (checkpoints rely on it).
        batch.completed = True
        assert batch.position is not None
        self._position = batch.position
        if batch.tags:
            self._on_synced(batch.position.seg, batch.tags, batch.offsets)
        for fut in filter(None, batch.futs):  # (None: an append without a future)
            if not fut.done():
                fut.set_result(None)

    def _complete_done(self) -> None:
        """Complete the synced batch an overlapped journal left for later, if any."""
        done, self._done = self._done, None
        if done is not None:
            self._complete(done)

    def _write_failed(self, exc: OSError, before: int, batch: JournalBatch) -> None:
        """A write failed (ENOSPC, EIO): drop whatever prefix reached the file so no garbage
        sits between batches, fail this batch, and keep going (or die if we cannot)."""
        self.stats["write_errors"] += 1
        assert self._fh is not None
        path = self._fh.path
        # the file's length if nothing of the batch reached it
        length = max(before, self.size_of(self._seq)) if self._in_place else before
        try:
            if self._fh.size() != before or self.fs.file_size(path) != length:
                # (a segment written in place loses the rest of its preallocation)
                self._fh.close()
                self.fs.truncate(path, before)
                self._in_place = False
                self._fh = self.fs.open_append(path)
        except OSError as exc2:
            self._fatal(exc2, f"truncating {path} after a failed write ({exc})")
            return
        self._inflight = None
        if exc.errno == errno.ENOSPC:
            err: Exception = ReadOnlyBookieError(f"journal write failed, disk full (ENOSPC): {exc}")
        else:
            err = IOBookieError(f"journal write to {path} failed: {exc}")
        self._on_failed(batch.tags, err)
        fail_futures(batch.futs, err)
        self._on_write_error(exc)

    def _fatal(self, exc: OSError, what: str) -> None:
        """The journal is dead: the batch in flight (and an overlapped journal's synced,
        unanswered one), the buffer and every later append fail with JournalFailedError."""
        err = JournalFailedError(f"journal failed: {what}: {exc}; no write covered by it "
                                 "is acknowledged and the journal accepts no more writes")
        self.failed = err
        self.preparer.stop()
        self._fail_inflight(err)
        self._fail_buffer(err)
        self._on_fatal(err)

    def _fail_inflight(self, exc: BaseException) -> None:
        """Fail the batches not answered yet: the one being written or synced and (overlapped
        journal) the synced one not completed yet (a crash before its answers went out)."""
        batches = [b for b in (self._done, self._inflight) if b is not None and not b.completed]
        self._done = self._inflight = None
        for batch in batches:
            batch.completed = True
            pending = [t for t, f in zip(batch.tags, batch.futs, strict=True)
                       if f is None or not f.done()]
            if pending:
                self._on_failed(pending, exc)
            fail_futures(batch.futs, exc)

    def _fail_buffer(self, exc: BaseException) -> None:
        tags, futs = self._tags, self._futs
        self._data, self._tags, self._futs, self._bytes = [], [], [], 0
        self._weights, self._entries = [], 0
        if tags:
            self._on_failed(tags, exc)
        fail_futures([*futs, *self.lazy.take()[1]], exc)
        if self._idle is not None:
            self._idle.set()

    def _check(self) -> None:
        """Assert internal invariants (stateful tests)."""
        assert len(self._data) == len(self._tags) == len(self._futs) == len(self._weights)
        assert self._bytes == sum(len(d) for d in self._data)
        assert self._entries == sum(self._weights)
        self.lazy._check(self._data)
        if self._done is not None:  # a synced batch awaiting its answers: overlapped only
            assert self.overlap_syncs and not self._done.completed
        if self._fh is not None and self.failed is None:
            assert self._position.seg == self._seq
            assert self._position.offset <= self._fh.size()
            if self._in_place:  # a preallocated segment written in place
                assert self.preallocate
                want = max(self.size_of(self._seq), self._fh.size())
                assert self.fs.file_size(self._fh.path) == want
        if self.preparer.task is not None:  # only ever the next segment is made ahead
            assert self.preallocate and self.preparer.seq == self._seq + 1
