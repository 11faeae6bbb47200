"""The metadata URI schemes: one table from scheme to backend, used by everything that takes a
metadata URI (``open_store``, the command line, Spark's options).

A :class:`Scheme` says how to check a URI's rest, how to open a store from it (the backend is
imported only then), which options make a registration lapse with its process, whether
other processes can share the store, and which local file it lives in, if any. A new backend
is one folder under ``pybk/metadata/`` and one :func:`register_scheme` call.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pybk.metadata.base import MetadataStore

__all__ = ["Scheme", "parse_uri", "register_scheme", "scheme_of", "schemes"]


@dataclass(frozen=True)
class Scheme:
    """One metadata backend as the URI names it (``name://rest``)."""

    name: str
    #: the URI's form, as error messages and help texts spell it
    form: str
    #: ``rest`` -> why it is malformed, or None when it is well formed
    check: Callable[[str], str | None]
    #: ``(rest, options, context)`` -> the store; context carries what a scheme may need
    #: from the caller (``memory=``, the shared in-memory directory)
    open: Callable[[str, dict[str, Any], dict[str, Any]], MetadataStore]
    #: ``timeout`` -> the options that make a registration vanish that long after its
    #: process dies ({} when the store dies with its process anyway)
    session_options: Callable[[float], dict[str, Any]] = field(default=lambda _t: {})
    #: other processes (a bookie, a Spark executor) can open the same store from the URI
    shared: bool = True
    #: ``rest`` -> the local file the store lives in, if it is one
    local_path: Callable[[str], pathlib.Path | None] = field(default=lambda _r: None)
    #: ``(rest, timeout)`` -> options bounding connection and operations by ``timeout``
    timeout_options: Callable[[float], dict[str, Any]] = field(default=lambda _t: {})


_SCHEMES: dict[str, Scheme] = {}


def register_scheme(scheme: Scheme) -> None:
    """Make ``scheme.name://`` URIs open ``scheme``'s backend (a later registration of the
    same name replaces the earlier one)."""
    if not scheme.name or not scheme.name.isidentifier():
        raise ValueError(f"bad scheme name {scheme.name!r}")
    _SCHEMES[scheme.name] = scheme


def schemes() -> list[Scheme]:
    """Every registered scheme, by name."""
    return [_SCHEMES[n] for n in sorted(_SCHEMES)]


def _forms() -> str:
    return ", ".join(s.form for s in schemes())


def parse_uri(uri: object) -> tuple[Scheme, str]:
    """``(scheme, rest)`` of a metadata URI; TypeError for a non-str, ValueError naming the
    URI and the expected forms when it is malformed or its scheme is unknown."""
    if not isinstance(uri, str):
        raise TypeError(f"metadata URI must be a str, got {type(uri).__name__}")
    name, sep, rest = uri.partition("://")
    if not sep:
        raise ValueError(f"bad metadata URI {uri!r}: expected one of {_forms()}")
    scheme = _SCHEMES.get(name)
    if scheme is None:
        raise ValueError(f"bad metadata URI {uri!r}: unknown scheme {name!r} "
                         f"(expected one of {_forms()})")
    problem = scheme.check(rest)
    if problem is not None:
        raise ValueError(f"bad metadata URI {uri!r}: {problem}")
    return scheme, rest


def scheme_of(uri: str) -> Scheme:
    """The scheme of a well-formed URI (ValueError otherwise)."""
    return parse_uri(uri)[0]


# -- the built-in backends ------------------------------------------------------------------


def _memory_check(rest: str) -> str | None:
    return "memory://NAME takes no path" if "/" in rest else None


def _memory_open(rest: str, options: dict[str, Any], ctx: dict[str, Any]) -> MetadataStore:
    from pybk.metadata.memory import MemoryMetadataStore

    if not rest:
        return MemoryMetadataStore(**options)
    memory = ctx.get("memory")
    if memory is None:
        raise ValueError(
            f"metadata URI 'memory://{rest}' names a shared in-memory store: pass memory=, the "
            "MemoryDirectory whose sessions share it (or use memory:// for a private one)")
    return MemoryMetadataStore(_state=memory.state(rest), **options)


def _sqlite_check(rest: str) -> str | None:
    if not rest.startswith("/") or rest == "/" or rest.endswith("/"):
        return "expected sqlite:///absolute/path/to/file.db"
    return None


def _sqlite_open(rest: str, options: dict[str, Any], _ctx: dict[str, Any]) -> MetadataStore:
    from pybk.metadata.sqlite import SqliteMetadataStore

    return SqliteMetadataStore(rest, **options)


def _zk_check(rest: str) -> str | None:
    hosts, slash, root = rest.partition("/")
    if not hosts or not slash or not root.strip("/"):
        return "expected zk://host:port[,host:port]/root"
    for hp in hosts.split(","):
        host, colon, port = hp.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            return f"bad host:port {hp!r}"
    return None


def _zk_open(rest: str, options: dict[str, Any], _ctx: dict[str, Any]) -> MetadataStore:
    from pybk.metadata.zookeeper import ZooKeeperMetadataStore

    hosts, _slash, root = rest.partition("/")
    return ZooKeeperMetadataStore(hosts, "/" + root.strip("/"), **options)


def _etcd_check(rest: str) -> str | None:
    problem = _zk_check(rest)
    if problem is not None:
        return problem.replace("zk://", "etcd://")
    root = rest.partition("/")[2].strip("/")
    if any(not seg or not all(c.isalnum() or c in "._:-" for c in seg) or not seg.isascii()
           for seg in root.split("/")):
        return f"bad root {root!r}: segments of letters, digits and ._:-"
    return None


def _etcd_open(rest: str, options: dict[str, Any], _ctx: dict[str, Any]) -> MetadataStore:
    from pybk.metadata.etcd import EtcdMetadataStore

    hosts, _slash, root = rest.partition("/")
    return EtcdMetadataStore(hosts, "/" + root.strip("/"), **options)


register_scheme(Scheme(
    name="memory", form="memory://[NAME]", check=_memory_check, open=_memory_open,
    shared=False))
register_scheme(Scheme(
    name="sqlite", form="sqlite:///abs/path.db", check=_sqlite_check, open=_sqlite_open,
    session_options=lambda t: {"ttl": t, "heartbeat_interval": t / 5},
    local_path=pathlib.Path))
register_scheme(Scheme(
    name="zk", form="zk://host:port[,host:port]/root", check=_zk_check, open=_zk_open,
    session_options=lambda t: {"session_timeout": t},
    timeout_options=lambda t: {"connect_timeout": max(0.1, t), "op_timeout": max(0.1, t)}))
register_scheme(Scheme(
    name="etcd", form="etcd://host:port[,host:port]/root", check=_etcd_check, open=_etcd_open,
    session_options=lambda t: {"session_timeout": max(1.0, t)},
    timeout_options=lambda t: {"connect_timeout": max(0.1, t), "op_timeout": max(0.1, t)}))
