"""An exclusive lock on a directory for the life of a process: ``flock`` on ``<dir>/LOCK``.

Used where two processes on one directory would corrupt it (a bookie's data directory, an
embedded WAL). The kernel releases an ``flock`` when its holder's process ends, however it
ends, so a crashed owner never leaves a stale lock and nothing has to be cleaned up; the file
holds the owner's pid so the refusal can name it. Advisory: it binds pybk processes, which all
take it before touching the directory.
"""

from __future__ import annotations

import fcntl
import os
import pathlib

from pybk.errors import LockedError

__all__ = ["LOCK_FILE", "DirectoryLock", "holder_of"]

#: file under a locked directory that holds its lock (and its holder's pid)
LOCK_FILE = "LOCK"


class DirectoryLock:
    """An exclusive ``flock`` on ``<path>/LOCK`` holding the owner's pid. ``what`` names the
    directory in the refusal ("bookie data directory", "WAL directory")."""

    def __init__(self, path: str | os.PathLike[str], what: str = "directory") -> None:
        self.file = pathlib.Path(path) / LOCK_FILE
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock now or raise LockedError naming the holder's pid (also its
        ``pid``: None when the file does not say)."""
        fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise LockedError(
                f"{self.what} {self.file.parent} is in use by process {holder} "
                f"(it holds {self.file}); only one process may use it at a time",
                pid=int(holder) if holder.isdigit() else None,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock


def holder_of(path: str | os.PathLike[str]) -> str | None:
    """The pid (as written) of the process holding ``path``'s lock, or None when nobody
    holds it (checked by trying to take it for an instant)."""
    file = pathlib.Path(path) / LOCK_FILE
    try:
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(fd)
        return None
    finally:
        os.close(fd)  # (releases the shared lock if we took it)


def _read_pid(fd: int) -> str:
    return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
