"""SQLite connections are never used, nor closed, in a process forked from the one that
opened them.

SQLite's rule (sqlite.org, "How To Corrupt An SQLite Database File", 2.6): a connection
carried across ``fork()`` must not be used in the child. Closing it is a use: the child's
garbage collector freeing a store it inherited (a Spark worker forked from a process that
had a client, a ``multiprocessing`` child) would run SQLite's close on the parent's
connection. After a fork, every store of the parent is therefore marked closed in the child
(its worker thread did not survive the fork either), and its connection is kept referenced
here, so it is never freed there. The child opens a store of its own to use the database.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Protocol

__all__ = ["inherited", "track"]


class _Forkable(Protocol):
    def forked(self) -> Any: ...


_STORES: weakref.WeakSet[Any] = weakref.WeakSet()
#: connections inherited from the parent: held, never closed, in this (child) process
_INHERITED: list[Any] = []


def track(store: _Forkable) -> None:
    """Have ``store.forked()`` called in a child forked after this call."""
    _STORES.add(store)


def inherited() -> int:
    """How many connections this process inherited from its parent and holds unclosed."""
    return len(_INHERITED)


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        conn = store.forked()
        if conn is not None:
            _INHERITED.append(conn)


os.register_at_fork(after_in_child=_after_fork_in_child)
