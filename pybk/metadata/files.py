"""The metadata's local files are their owner's alone: a SQLite metadata file holds every
ledger's master key, and anyone who reads it can forge adds and fences."""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["private_file"]


def private_file(path: str) -> None:
    """Create the database file readable and writable by its owner only (it holds every
    ledger's master key: anyone who reads it can forge adds and fences); an existing file
    of ours, and its WAL and shared-memory files, lose any access by others. SQLite gives
    the files it creates beside the database the database's own mode.

    An existing file is changed by its path, never opened: closing any descriptor of a
    database file drops every POSIX lock this process holds on it, so another connection
    of this process (another thread's store) would lose its locks and other processes
    could write under it (sqlite.org, "How To Corrupt", 2.2)."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:  # a new file: nobody can hold a lock on a file that did not exist
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except OSError:
        pass  # there already (or not ours to make: sqlite3 reports what matters)
    for name in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(OSError):  # absent, or not ours
            st = os.stat(name)
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid == os.geteuid() and mode & 0o077:
                os.chmod(name, mode & ~0o077)
