"""Opening a metadata store from its URI (see :mod:`pybk.metadata` for the forms)."""

from __future__ import annotations

from typing import Any

from pybk.metadata.base import MetadataStore
from pybk.metadata.memory import MemoryMetadataStore, _State

__all__ = ["MemoryDirectory", "open_store", "session_options"]


class MemoryDirectory:
    """The shared data behind ``memory://NAME`` stores: every :func:`open_store` of a name
    through one directory is a new session on the same data (like clients of one ZooKeeper).

    An explicit object, not a process-wide table: whoever wants named in-memory stores makes
    a directory and hands it to every ``open_store`` that must share them."""

    def __init__(self) -> None:
        self._states: dict[str, _State] = {}

    def state(self, name: str) -> _State:
        return self._states.setdefault(name, _State())

    def forget(self, name: str) -> None:
        """Drop the data behind ``memory://name``."""
        self._states.pop(name, None)


def session_options(uri: str, timeout: float | None) -> dict[str, Any]:
    """The :func:`open_store` options that make a registration (and a lock) vanish about
    ``timeout`` seconds after its process dies: the SQLite lease (renewed every fifth of it)
    or the ZooKeeper session timeout. ``{}`` for None and for memory stores."""
    if timeout is None or uri.startswith("memory://"):
        return {}
    if not timeout > 0:
        raise ValueError(f"session timeout must be > 0, got {timeout!r}")
    if uri.startswith("sqlite://"):
        return {"ttl": timeout, "heartbeat_interval": timeout / 5}
    if uri.startswith("zk://"):
        return {"session_timeout": timeout}
    return {}


def open_store(uri: str, *, memory: MemoryDirectory | None = None,
               **options: Any) -> MetadataStore:
    """Open the metadata store named by ``uri``; ``options`` go to the backend's constructor
    (e.g. ``ttl=``/``heartbeat_interval=`` for SQLite, ``session_timeout=`` for ZooKeeper).
    ``memory://NAME`` needs ``memory=``, the :class:`MemoryDirectory` its sessions share.

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
        if memory is None:
            raise ValueError(
                f"metadata URI {uri!r} names a shared in-memory store: pass memory=, the "
                "MemoryDirectory whose sessions share it (or use memory:// for a private one)")
        return MemoryMetadataStore(_state=memory.state(rest), **options)
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
