"""Opening a metadata store from its URI (see :mod:`pybk.metadata` for the forms)."""

from __future__ import annotations

from typing import Any

from pybk.metadata.base import MetadataStore
from pybk.metadata.memory_state import MemoryState
from pybk.metadata.registry import parse_uri, scheme_of

__all__ = ["MemoryDirectory", "open_store", "session_options"]


class MemoryDirectory:
    """The shared data behind ``memory://NAME`` stores: every :func:`open_store` of a name
    through one directory is a new session on the same data (like clients of one ZooKeeper).

    An explicit object, not a process-wide table: whoever wants named in-memory stores makes
    a directory and hands it to every ``open_store`` that must share them."""

    def __init__(self) -> None:
        self._states: dict[str, MemoryState] = {}

    def state(self, name: str) -> MemoryState:
        return self._states.setdefault(name, MemoryState())

    def forget(self, name: str) -> None:
        """Drop the data behind ``memory://name``."""
        self._states.pop(name, None)


def session_options(uri: str, timeout: float | None) -> dict[str, Any]:
    """The :func:`open_store` options that make a registration (and a lock) vanish about
    ``timeout`` seconds after its process dies: the SQLite lease (renewed every fifth of it)
    or the ZooKeeper session timeout. ``{}`` for None and for memory stores."""
    if timeout is None:
        return {}
    scheme = scheme_of(uri)
    if not timeout > 0:
        raise ValueError(f"session timeout must be > 0, got {timeout!r}")
    return scheme.session_options(timeout)


def open_store(uri: str, *, memory: MemoryDirectory | None = None,
               **options: Any) -> MetadataStore:
    """Open the metadata store named by ``uri`` (its scheme's backend, :mod:`.registry`);
    ``options`` go to the backend's constructor (e.g. ``ttl=``/``heartbeat_interval=`` for
    SQLite, ``session_timeout=`` for ZooKeeper). ``memory://NAME`` needs ``memory=``, the
    :class:`MemoryDirectory` its sessions share.

    Raises ValueError naming the URI when it is malformed or its scheme unknown.
    """
    scheme, rest = parse_uri(uri)
    return scheme.open(rest, options, {"memory": memory})
