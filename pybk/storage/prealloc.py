"""The journal's preallocated segments: each made ahead of use, then renamed into place.

A journal with ``preallocate`` writes its segments in place into files made beforehand
(header, then zeros or reserved blocks up to the segment's length, synced) under a temporary
name, so a batch's fdatasync flushes the data alone. The next segment's file is made in the
background once the active one is half full; a failure only means that segment is created
the plain way. Kept apart from :mod:`pybk.storage.journal`, whose group commit does not
depend on how a segment's file came to be.

Design notes: docs/internals.md, "pybk/storage/journal.py".
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable

from pybk.runtime.eventloop import gather
from pybk.storage.fs import FileHandle, FileSystem
from pybk.storage.records import SEGMENT_HEADER_SIZE, encode_segment_header

__all__ = ["PREP_CHUNK", "PREP_SUFFIX", "SegmentPreparer", "drop_partial", "rotation_can_wait"]

#: a segment file being made ahead of use (preallocated), not yet renamed into place
PREP_SUFFIX = ".prep"
#: bytes of zeros written per step when making a preallocated segment
PREP_CHUNK = 1 << 20

log = logging.getLogger(__name__)


class SegmentPreparer:
    """Makes a journal's segment files ahead of use (at most one in the background, always
    the next one) and hands each over renamed into place, open to be written in place.

    ``segment_path(seq)`` and ``size_of(seq)`` are the journal's (where a segment lives, how
    long it is); ``stats`` is the journal's counters dict, whose ``preallocated``,
    ``zero_filled``, ``allocated`` and ``prealloc_failures`` this counts."""

    def __init__(self, fs: FileSystem, directory: str, instance_id: str, *,
                 segment_path: Callable[[int], str], size_of: Callable[[int], int],
                 zero_fill_below: float, stats: dict[str, int]) -> None:
        self.fs = fs
        self.directory = directory
        self.instance_id = instance_id
        self._segment_path = segment_path
        self._size_of = size_of
        #: bytes/s of journal writes from which the next segment is only reserved, not
        #: zero-filled (the zeros would compete with the data for the disk)
        self.zero_fill_below = zero_fill_below
        self._stats = stats
        #: the background task making the next segment's file, and its sequence number
        self.task: asyncio.Task[bool] | None = None
        self.seq = -1

    def prep_path(self, seq: int) -> str:
        return self._segment_path(seq) + PREP_SUFFIX

    def start(self, seq: int, written: int, elapsed: float) -> None:
        """Start making segment ``seq``'s file in the background (the journal calls it once
        the active segment is half full, not at once: a short-lived bookie should not pay
        for a segment it never uses); zero-filled unless the active segment's ``written``
        bytes in ``elapsed`` seconds of loop time come to ``zero_fill_below`` bytes/s or
        more."""
        zero_fill = written < self.zero_fill_below * elapsed
        self.seq = seq
        self.task = asyncio.get_running_loop().create_task(
            self._prepare_ahead(seq, zero_fill), name="pybk-journal-prealloc")

    async def open_prepared(self, seq: int) -> FileHandle | None:
        """Segment ``seq`` renamed into place from its prepared file (made now if no
        background task was making it), open to be written in place; None when it could not
        be made (the caller then creates a plain segment)."""
        task, self.task = self.task, None
        if task is not None and self.seq == seq:
            ready = await task
        else:
            if task is not None:
                task.cancel()
            try:
                await self._prepare(seq)
                ready = True
            except OSError as exc:
                ready = self._failed(seq, exc)
        if not ready:
            return None
        path = self._segment_path(seq)
        self.fs.rename(self.prep_path(seq), path)
        await self.fs.fsync_dir(self.directory)
        self._stats["preallocated"] += 1
        return self.fs.open_rewrite(path, SEGMENT_HEADER_SIZE)

    async def _prepare(self, seq: int, zero_fill: bool = True) -> None:
        """Make segment ``seq``'s file under its temporary name: its header, then its blocks
        up to its length, zeros written out (``zero_fill``) or only reserved
        (``FileHandle.allocate``); synced.

        Zeros go out a chunk (a MiB) at a time and each chunk is synced before the next is
        written: the journal's own syncs share the disk, and one that queues behind the
        flush of a whole segment of zeros waits for all of it (measured, a lone writer with
        16 MiB segments: longest add 18 ms, 4 ms paced; 256 writers x 100 B: +5% entries/s)."""
        path = self.prep_path(seq)
        size = self._size_of(seq)
        if self.fs.exists(path):
            self.fs.delete(path)
        fh = self.fs.open_append(path, bulk=True)
        try:
            fh.write(encode_segment_header(seq, self.instance_id))
            if zero_fill:
                zeros = memoryview(bytes(min(PREP_CHUNK, size)))
                while fh.size() < size:
                    fh.write(zeros[: size - fh.size()])
                    if fh.size() < size:
                        await fh.sync()  # (the last chunk: synced below)
            else:
                fh.allocate(size)
            await fh.sync()
        finally:
            fh.close()
        self._stats["zero_filled" if zero_fill else "allocated"] += 1

    async def _prepare_ahead(self, seq: int, zero_fill: bool) -> bool:
        """The background form of :meth:`_prepare`: True once the file is ready; never raises
        (a failure only means the next segment is created the plain way)."""
        try:
            await self._prepare(seq, zero_fill)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an OSError, or a test's injected crash
            return self._failed(seq, exc)
        return True

    def _failed(self, seq: int, exc: BaseException) -> bool:
        self._stats["prealloc_failures"] += 1
        # a full disk is reported by the bookie turning read-only; anything else is news
        level = (logging.INFO if isinstance(exc, OSError) and exc.errno == errno.ENOSPC
                 else logging.WARNING)
        log.log(level, "journal %s: preallocating segment %d failed (%s); it will be created "
                "without preallocation", self.directory, seq, exc)
        drop_partial(self.fs, self.prep_path(seq))
        return False

    def stop(self) -> None:
        """Cancel the background task, if any (a failed or abandoned journal)."""
        if self.task is not None:
            self.task.cancel()
            self.task = None

    async def close(self) -> None:
        """Cancel the background task and wait until it has ended."""
        task = self.task
        self.stop()
        if task is not None:
            await gather(task, return_exceptions=True)


def drop_partial(fs: FileSystem, path: str) -> bool:
    """Remove a file whose creation failed (a segment, a prepared one); False if even that
    fails (it is then removed at the next start at the latest)."""
    try:
        if fs.exists(path):
            fs.delete(path)
    except OSError:
        return False
    return True


def rotation_can_wait(exc: OSError) -> bool:
    """Can a failed rotation wait (the active segment taking the writes)? Yes for a full disk
    and for no descriptor left (both pass): a flood of connections must not end a bookie."""
    return exc.errno in (errno.ENOSPC, errno.EMFILE, errno.ENFILE)
