"""The metadata's local files are their owner's alone: a SQLite metadata file holds every
ledger's master key, and anyone who reads it can forge adds and fences."""

from __future__ import annotations

import os
import stat

__all__ = ["private_file"]


def private_file(path: str) -> None:
    """Create the database file readable and writable by its owner only (it holds every
    ledger's master key: anyone who reads it can forge adds and fences); an existing file
    of ours, and its WAL and shared-memory files, lose any access by others. SQLite gives
    the files it creates beside the database the database's own mode."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    for name, create in ((path, True), (path + "-wal", False), (path + "-shm", False)):
        try:
            fd = os.open(name, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0),
                         0o600)
        except OSError:
            continue  # absent, or not ours to open: sqlite3 reports what matters
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid == os.geteuid() and mode & 0o077:
                os.fchmod(fd, mode & ~0o077)
        finally:
            os.close(fd)
