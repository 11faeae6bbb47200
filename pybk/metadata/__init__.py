"""Metadata stores: the interface (``base``) and its backends, chosen by URI (:func:`open_store`).

=======================================  ====================================================
``memory://name``                         in this process; every ``open_store`` of the same
                                          name is a new session on the same shared data
``memory://``                             a fresh private store (nothing else can reach it)
``sqlite:///abs/path.db``                 a SQLite file, shared safely by processes on one host
``zk://host:port[,host:port]/root``       a ZooKeeper ensemble, everything under ``/root``
=======================================  ====================================================
"""

from __future__ import annotations

from typing import Any

from pybk.metadata.base import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    BookieRegistration,
    LedgerMetadata,
    MetadataStore,
    Watch,
)
from pybk.metadata.memory import MemoryMetadataStore, _State

_NAMED_MEMORY: dict[str, _State] = {}


def open_store(uri: str, **options: Any) -> MetadataStore:
    """Open the metadata store named by ``uri``; ``options`` go to the backend's constructor
    (e.g. ``ttl=``/``heartbeat_interval=`` for SQLite, ``session_timeout=`` for ZooKeeper).

    Raises ValueError naming the URI when it is not one of the forms above.
    """
    if not isinstance(uri, str):
        raise TypeError(f"metadata URI must be a str, got {type(uri).__name__}")
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ValueError(f"bad metadata URI {uri!r}: expected memory://, sqlite:/// or zk://")
    if scheme == "memory":
        if "/" in rest:
            raise ValueError(f"bad metadata URI {uri!r}: memory://NAME takes no path")
        if not rest:
            return MemoryMetadataStore(**options)
        state = _NAMED_MEMORY.setdefault(rest, _State())
        return MemoryMetadataStore(_state=state, **options)
    if scheme == "sqlite":
        if not rest.startswith("/") or rest == "/" or rest.endswith("/"):
            raise ValueError(
                f"bad metadata URI {uri!r}: expected sqlite:///absolute/path/to/file.db"
            )
        from pybk.metadata.sqlite import SqliteMetadataStore

        return SqliteMetadataStore(rest, **options)
    if scheme == "zk":
        hosts, slash, root = rest.partition("/")
        if not hosts or not slash or not root.strip("/"):
            raise ValueError(
                f"bad metadata URI {uri!r}: expected zk://host:port[,host:port]/root"
            )
        for hp in hosts.split(","):
            host, colon, port = hp.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"bad metadata URI {uri!r}: bad host:port {hp!r}")
        from pybk.metadata.zookeeper import ZooKeeperMetadataStore

        return ZooKeeperMetadataStore(hosts, "/" + root.strip("/"), **options)
    raise ValueError(f"bad metadata URI {uri!r}: unknown scheme {scheme!r}")


def forget_memory_store(name: str) -> None:
    """Drop the shared data behind ``memory://name`` (tests that reuse names)."""
    _NAMED_MEMORY.pop(name, None)


__all__ = [
    "CLOSED",
    "IN_RECOVERY",
    "OPEN",
    "BookieRegistration",
    "LedgerMetadata",
    "MemoryMetadataStore",
    "MetadataStore",
    "Watch",
    "forget_memory_store",
    "open_store",
]
