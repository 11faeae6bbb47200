"""The FileSystem seam: every byte pybk's storage writes or reads goes through here.

Two implementations (in this module):

* ``OsFileSystem``: real files. Blocking ``fsync``/``fdatasync`` runs off the event loop (a
  dedicated thread), with one loop wake-up per sync, never one per record. Creating or
  renaming a file is followed by a directory fsync when the caller asks for it
  (``fsync_dir``).
* ``MemFileSystem``: for tests and the simulator. It keeps *synced* and *unsynced* bytes apart
  and models what a power cut does: ``crash()`` drops unsynced bytes (or keeps a torn prefix
  of the last write), unsynced file creations/renames/deletions not covered by a directory
  fsync can be undone, the next fsync can fail with EIO, writes can hit ENOSPC, and a bit can
  be flipped at a given offset. A fault hook lets tests stop at every write/fsync/rename/
  dir-fsync boundary (crash-point enumeration).

Paths are plain strings; storage code joins them with ``posixpath.join``. Storage code never
calls ``open``/``os.*`` directly.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class FileHandle(abc.ABC):
    """An open file written sequentially: at its end (:meth:`FileSystem.open_append`) or in
    place from an offset on (:meth:`FileSystem.open_rewrite`, for preallocated files)."""

    path: str

    @abc.abstractmethod
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at :meth:`size` (to the OS cache: not durable until :meth:`sync`).
        Raises ``OSError`` (e.g. ENOSPC); a failed write may have written a prefix."""

    @abc.abstractmethod
    async def sync(self) -> None:
        """Make every byte written so far durable (fdatasync). Raises ``OSError`` (EIO).
        After a failure the file's unsynced state is unknown: callers must treat it as fatal."""

    def start_sync(self) -> Awaitable[None]:
        """Begin a sync *now* and return what to await for its outcome (that of
        :meth:`sync`). Why: the journal starts one batch's sync and then completes the batch
        before it (index updates, callbacks) while the disk works; a plain ``sync()``
        coroutine would not begin before its first await. The default wraps :meth:`sync` in
        a task, which begins at the loop's next step; real files begin at once."""
        return asyncio.ensure_future(self.sync())

    def sync_inline(self) -> bool:
        """Sync *now*, blocking the caller, if that is cheap here; else do nothing.

        Returns True after the same work as :meth:`sync` (same effects, same ``OSError`` on
        failure, same fatal contract), or False without touching anything when this file
        system cannot or should not sync on the caller's thread (callers then ``await
        sync()``). Why: handing a sync to a thread and back costs ~80 us on a VM whose idle
        vCPU must be woken (docs/performance.md), about half a lone small fdatasync; for a
        batch of one or two records the caller is better off blocking for the sync itself.
        The default declines."""
        return False

    def sync_now(self) -> None:
        """Make every byte written so far durable, blocking the caller: for work handed to
        :meth:`FileSystem.offload` (it runs off the event loop, where nothing may be awaited).
        Same effects and ``OSError`` as :meth:`sync`."""
        raise NotImplementedError(f"{type(self).__name__} cannot sync outside the event loop")

    def allocate(self, size: int) -> None:
        """Make the file at least ``size`` bytes long, the new bytes reading as zeros (not
        durable until :meth:`sync`), reserving its blocks without writing them where the file
        system can (``posix_fallocate``). Raises ``OSError`` (ENOSPC). Why: a segment
        preallocated this way costs no data writes; writes into it still convert the reserved
        blocks (a metadata commit per sync), so it saves less per sync than zeros written out
        (see ``pybk.storage.journal``). The default, right for an append handle only (the
        journal allocates through one), appends the zeros."""
        zeros = memoryview(bytes(1 << 20))
        while self.size() < size:
            self.write(zeros[: size - self.size()])

    @abc.abstractmethod
    def size(self) -> int:
        """The offset the next write goes to: for an append handle the file's size (synced
        or not), for a rewrite handle its start offset plus the bytes written since."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the handle (does not sync)."""


class FileSystem(abc.ABC):
    """The operations pybk's storage needs, and nothing more."""

    @abc.abstractmethod
    def open_append(self, path: str, *, bulk: bool = False) -> FileHandle:
        """Open ``path`` for appending, creating it if missing.

        ``bulk``: this file's syncs are big and off the write path (index checkpoints,
        segments being preallocated). A file system that serves the journal's syncs in order
        on one lane (the sync helper process) runs these on another, so a 60 ms flush of a
        new segment's zeros never queues the journal's 0.1 ms syncs behind it."""

    @abc.abstractmethod
    def open_rewrite(self, path: str, offset: int) -> FileHandle:
        """Open the existing file ``path`` to write it in place from ``offset`` on: writes
        replace its bytes there (a write past the end extends it) and the file keeps its
        length. Why: a journal segment preallocated with zeros and synced is then written
        without changing the file's size or allocating blocks, so each ``fdatasync`` flushes
        the data alone, with no file system journal commit (docs/performance.md). Raises
        ``FileNotFoundError``; ``ValueError`` if ``offset`` is outside the file."""

    @abc.abstractmethod
    def pread(self, path: str, offset: int, size: int) -> bytes:
        """Read up to ``size`` bytes at ``offset`` (short at end of file). Raises ``OSError``
        (EIO for a latent read error) or ``FileNotFoundError``."""

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes:
        """The whole content of a (small) file."""

    @abc.abstractmethod
    def file_size(self, path: str) -> int:
        """Current size of ``path`` (including unsynced bytes)."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...

    @abc.abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names in a directory, sorted."""

    @abc.abstractmethod
    def makedirs(self, path: str) -> None:
        """Create a directory and its parents if missing."""

    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src`` (durable only after ``fsync_dir``)."""

    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Remove a file (durable only after ``fsync_dir``). Missing file: FileNotFoundError."""

    @abc.abstractmethod
    def truncate(self, path: str, size: int) -> None:
        """Cut a file to ``size`` bytes (used to drop a torn journal tail)."""

    @abc.abstractmethod
    async def fsync_dir(self, path: str) -> None:
        """Make creations, renames and deletions in directory ``path`` durable."""

    @abc.abstractmethod
    def disk_usage(self, path: str) -> tuple[int, int]:
        """(free_bytes, total_bytes) of the file system holding ``path``."""

    async def write_file_atomic(self, path: str, data: bytes) -> None:
        """Write a small file durably and atomically: temp file, sync, rename, dir fsync."""
        import posixpath

        tmp = path + ".tmp"
        if self.exists(tmp):
            self.delete(tmp)
        fh = self.open_append(tmp, bulk=True)
        try:
            fh.write(data)
            await fh.sync()
        finally:
            fh.close()
        self.rename(tmp, path)
        await self.fsync_dir(posixpath.dirname(path) or ".")

    async def offload(self, work: Callable[[], T]) -> T:
        """Run ``work`` (blocking file work: writes, :meth:`FileHandle.sync_now`) off the
        event loop and return its result (or raise its exception). Why: the db engine's flush
        of its write cache writes and syncs megabytes while adds go on. ``work`` must touch
        only files nobody else writes meanwhile. The default runs it at once, on the caller's
        thread."""
        return work()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (threads, cached descriptors)."""


class SimulatedCrash(Exception):
    """Raised by a test's ``MemFileSystem.fault_hook`` to stop a workload at a chosen boundary."""


__all__ = ["FileHandle", "FileSystem", "SimulatedCrash"]
