"""Real files behind the FileSystem seam.

Blocking syncs (``fdatasync`` of a file, ``fsync`` of a directory) run on one dedicated thread
per ``OsFileSystem`` (bulk syncs, see ``FileSystem.open_append``, on a second one), so the
event loop keeps serving while the disk works, and each sync costs exactly one loop wake-up
(the executor future), never one per record. Several bookies in one
process each get their own ``OsFileSystem`` and so sync in parallel (syncs on different files
overlap on the device; see docs/performance.md).

With ``sync_process=True`` the data syncs go to a helper process instead
(:mod:`pybk.storage.syncer`): a sync thread must win the GIL from a busy loop before its
``fdatasync`` starts and again to report back, a process does not, so the journal can
complete one batch while the next one syncs. A bookie uses it for its own file system unless
its config says ``journal_sync_process=False``; directory fsyncs (rare) stay on the thread.

``sync_inline`` is the exception the journal asks for when a batch is tiny: a lone
``fdatasync`` run on the caller's thread saves the two thread hand-offs (~80 us on this kind of
VM) at the price of blocking the loop for one small sync (~0.15-0.3 ms).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
import shutil
from collections.abc import Callable
from typing import Any, TypeVar

from pybk.storage.fs import FileHandle, FileSystem
from pybk.storage.syncer import SyncProcess, start_sync_process
from pybk.storage.syncthread import SyncThread

#: a bookie's files and directories are its owner's alone: entries, and master keys in
#: journal records and checkpoints, are not for other local users (docs/operations.md)
FILE_MODE = 0o600
DIR_MODE = 0o700

T = TypeVar("T")

__all__ = [
    "OsFileSystem",
]


class _OsFileHandle(FileHandle):
    def __init__(self, fs: OsFileSystem, path: str, offset: int | None = None,
                 bulk: bool = False) -> None:
        """An append handle (``offset`` None) or a rewrite handle writing from ``offset``;
        ``bulk``: syncs on the bulk thread (see ``FileSystem.open_append``)."""
        self.path = path
        self._fs = fs
        self._bulk = bulk
        if offset is None:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                               FILE_MODE)
            self._size = os.fstat(self._fd).st_size
        else:
            self._fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            length = os.fstat(self._fd).st_size
            if not 0 <= offset <= length:
                os.close(self._fd)
                raise ValueError(f"{path}: offset {offset} outside the file ({length} bytes)")
            self._size = offset
        self._in_place = offset is not None
        self._sync_key = 0  # this file's key in the sync process, 0 until registered

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            if self._in_place:
                written = os.pwrite(self._fd, view, self._size)
            else:
                written = os.write(self._fd, view)
            if written <= 0:  # pragma: no cover - the kernel reports errors as OSError
                raise OSError(errno.EIO, f"short write to {self.path}")
            self._size += written
            view = view[written:]

    async def sync(self) -> None:
        await self.start_sync()

    def start_sync(self) -> asyncio.Future[None]:
        if self._bulk:
            return asyncio.get_running_loop().run_in_executor(
                self._fs._bulk_executor(), os.fdatasync, self._fd)
        syncer = self._fs.sync_process
        if syncer is not None:
            if not self._sync_key:
                self._sync_key = syncer.register(self._fd)
            return syncer.sync(self._sync_key, self.path)
        return self._fs._on_sync_thread(os.fdatasync, self._fd)

    def sync_now(self) -> None:
        os.fdatasync(self._fd)

    def sync_inline(self) -> bool:
        if not self._fs.inline_syncs or self._bulk:
            return False
        os.fdatasync(self._fd)
        return True

    def allocate(self, size: int) -> None:
        if size > self._size:
            os.posix_fallocate(self._fd, 0, size)
            if not self._in_place:  # an append handle's next write goes to the new end
                self._size = size

    def size(self) -> int:
        return self._size

    def close(self) -> None:
        if self._sync_key and self._fs.sync_process is not None:
            self._fs.sync_process.unregister(self._sync_key)
            self._sync_key = 0
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _call(work: Callable[[], T]) -> T:
    return work()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OsFileSystem(FileSystem):
    """The operating system's files. Reads use cached read-only descriptors and ``pread``."""

    def __init__(self, sync_executor: concurrent.futures.Executor | None = None, *,
                 inline_syncs: bool = True, sync_process: bool = False) -> None:
        #: allow ``FileHandle.sync_inline`` (a caller's small syncs on its own thread)
        self.inline_syncs = inline_syncs
        #: the helper process running data syncs (``sync_process=True``), else None: syncs
        #: run on the thread (also when the helper cannot be started, which is logged)
        self.sync_process: SyncProcess | None = (
            start_sync_process() if sync_process else None)
        #: syncs run on this executor when one is given, else on this file system's own
        #: sync thread (:class:`SyncThread`: a lighter hand-off than an executor's)
        self._executor = sync_executor
        self._sync_thread = SyncThread("pybk-fsync") if sync_executor is None else None
        self._read_fds: dict[str, int] = {}
        self._bulk_pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: the thread :meth:`offload` runs work on (a flush of the db engine's write cache)
        self._flush_thread = SyncThread("pybk-flush")

    def _bulk_executor(self) -> concurrent.futures.Executor:
        """The thread for bulk syncs, started on first use."""
        if self._bulk_pool is None:
            self._bulk_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="pybk-fsync-bulk")
        return self._bulk_pool

    # -- reads ---------------------------------------------------------------------------------

    def _read_fd(self, path: str) -> int:
        fd = self._read_fds.get(path)
        if fd is None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._read_fds[path] = fd
        return fd

    def _forget(self, path: str) -> None:
        fd = self._read_fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def pread(self, path: str, offset: int, size: int) -> bytes:
        return os.pread(self._read_fd(path), size, offset)

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def disk_usage(self, path: str) -> tuple[int, int]:
        usage = shutil.disk_usage(path)
        return usage.free, usage.total

    # -- changes -------------------------------------------------------------------------------

    def open_append(self, path: str, *, bulk: bool = False) -> FileHandle:
        return _OsFileHandle(self, path, bulk=bulk)

    def open_rewrite(self, path: str, offset: int) -> FileHandle:
        return _OsFileHandle(self, path, offset)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, mode=DIR_MODE, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        self._forget(src)
        self._forget(dst)
        os.replace(src, dst)

    def delete(self, path: str) -> None:
        self._forget(path)
        os.unlink(path)

    def truncate(self, path: str, size: int) -> None:
        self._forget(path)
        os.truncate(path, size)

    async def fsync_dir(self, path: str) -> None:
        await self._on_sync_thread(_fsync_dir, path)

    async def offload(self, work: Callable[[], T]) -> T:
        """``work`` on this file system's flush thread (one job at a time, in order)."""
        result: T = await self._flush_thread.run(_call, work)
        return result

    def _on_sync_thread(self, call: Callable[[Any], object], arg: Any) -> asyncio.Future[Any]:
        """``call(arg)`` on the sync thread (or the given executor): syncs of data and of
        directories in the order they were asked for, as one worker thread runs them."""
        if self._sync_thread is not None:
            return self._sync_thread.run(call, arg)
        return asyncio.get_running_loop().run_in_executor(self._executor, call, arg)

    def close(self) -> None:
        for path in list(self._read_fds):
            self._forget(path)
        if self.sync_process is not None:
            self.sync_process.close()
            self.sync_process = None
        if self._sync_thread is not None:
            self._sync_thread.close()
        self._flush_thread.close()
        if self._bulk_pool is not None:
            self._bulk_pool.shutdown(wait=True)
            self._bulk_pool = None
