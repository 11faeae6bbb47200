"""The key/value namespace of a metadata backend (part of
:data:`pybk.testing.metadata_conformance.CHECKS`): create, read, CAS and delete (versions never
reused across incarnations of a key), the update loop under concurrent updaters, listing by
prefix and bad keys, prefixes and values (value watches: :mod:`.metadata_watch_checks`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pybk.errors import KeyExistsError, MetadataVersionError, NoSuchKeyError
from pybk.metadata.base import MAX_VALUE_SIZE, MetadataStore
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_helpers import raises

__all__ = [
    "check_values_bad_arguments",
    "check_values_create_read_cas",
    "check_values_list_by_prefix",
    "check_values_update_loop_under_concurrent_updaters",
]


async def check_values_create_read_cas(backend: MetadataBackend) -> None:
    a, b = await backend.open(), await backend.open()
    created = await a.create_value("logs/ns/orders", b"v0")
    assert (created.key, created.value) == ("logs/ns/orders", b"v0"), created
    read = await b.read_value("logs/ns/orders")
    assert (read.value, read.version) == (b"v0", created.version), read
    await raises(KeyExistsError, lambda: b.create_value("logs/ns/orders", b"other"),
                 "creating an existing key")
    v1 = await b.write_value("logs/ns/orders", b"v1", created.version)
    assert v1.version != created.version and v1.value == b"v1"
    await raises(MetadataVersionError, lambda: a.write_value("logs/ns/orders", b"x",
                                                             created.version), "a stale CAS")
    for never in (-1, -7):
        await raises(MetadataVersionError, lambda n=never: a.write_value(  # type: ignore[misc]
            "logs/ns/orders", b"x", n), f"a CAS with version {never}")
        await raises(MetadataVersionError, lambda n=never: a.delete_value(  # type: ignore[misc]
            "logs/ns/orders", n), f"a delete with version {never}")
    assert (await a.read_value("logs/ns/orders")).value == b"v1"
    await raises(NoSuchKeyError, lambda: a.read_value("logs/ns/missing"), "reading a missing key")
    await raises(NoSuchKeyError, lambda: a.write_value("logs/ns/missing", b"x", v1.version),
                 "a CAS on a missing key")
    await raises(NoSuchKeyError, lambda: a.delete_value("logs/ns/missing"),
                 "deleting a missing key")
    # empty values and binary values round-trip
    empty = await a.create_value("e", b"")
    assert (await b.read_value("e")).value == b"" and empty.value == b""
    blob = bytes(range(256)) * 3
    await a.write_value("e", blob, empty.version)
    assert (await b.read_value("e")).value == blob
    # delete, then create again: the new incarnation's versions are new, a stale CAS fails
    await raises(MetadataVersionError, lambda: a.delete_value("logs/ns/orders",
                                                              created.version), "stale delete")
    await a.delete_value("logs/ns/orders", v1.version)
    await raises(NoSuchKeyError, lambda: b.read_value("logs/ns/orders"), "reading a deleted key")
    again = await b.create_value("logs/ns/orders", b"again")
    assert again.version not in (created.version, v1.version), (again, created, v1)
    for stale in (created.version, v1.version):
        await raises(MetadataVersionError, lambda s=stale: a.write_value(  # type: ignore[misc]
            "logs/ns/orders", b"x", s), "a CAS with a version of the old incarnation")
    await a.delete_value("logs/ns/orders")
    await raises(NoSuchKeyError, lambda: a.read_value("logs/ns/orders"), "reading a deleted key")


async def check_values_update_loop_under_concurrent_updaters(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    await stores[0].create_value("counter", b"0")
    per_store, updaters = 4, 3

    def add(amount: int) -> Callable[[object], bytes]:
        return lambda cur: str(int(cur.value) + amount).encode()  # type: ignore[attr-defined]

    async def bump(store: MetadataStore, amount: int) -> None:
        for _ in range(per_store):
            await store.update_value("counter", add(amount))

    await asyncio.gather(*(bump(s, i + 1) for s in stores for i in range(updaters)))
    final = await stores[1].read_value("counter")
    assert int(final.value) == len(stores) * per_store * sum(range(1, updaters + 1)), final
    same = await stores[2].update_value("counter", lambda cur: None)
    assert same.version == final.version
    await raises(NoSuchKeyError, lambda: stores[0].update_value("nope", lambda c: b"x"),
                 "update_value on a missing key")


async def check_values_list_by_prefix(backend: MetadataBackend) -> None:
    store, other = await backend.open(), await backend.open()
    assert await store.list_keys() == []
    keys = ["logs/a/x", "logs/a/y", "logs/a/y/deeper", "logs/b/z", "logs/a.b/q", "logsx", "top"]
    for k in reversed(keys):
        await store.create_value(k, k.encode())
    assert await other.list_keys("logs/a/") == ["logs/a/x", "logs/a/y", "logs/a/y/deeper"]
    assert await other.list_keys("logs/") == sorted(k for k in keys if k.startswith("logs/"))
    assert await other.list_keys("") == sorted(keys)
    assert await other.list_keys("nothing/") == []
    # a key with keys below it: deleting it leaves them; creating it again works
    await store.delete_value("logs/a/y")
    assert await other.list_keys("logs/a/") == ["logs/a/x", "logs/a/y/deeper"]
    assert (await other.read_value("logs/a/y/deeper")).value == b"logs/a/y/deeper"
    await raises(NoSuchKeyError, lambda: other.read_value("logs/a/y"), "reading a deleted key")
    await other.create_value("logs/a/y", b"back")
    assert (await store.read_value("logs/a/y")).value == b"back"
    # a parent that was never a key is not listed and cannot be read
    await store.create_value("p/q/r", b"1")
    assert await store.list_keys("p/") == ["p/q/r"]
    await raises(NoSuchKeyError, lambda: store.read_value("p/q"), "reading a bare parent path")


async def check_values_bad_arguments(backend: MetadataBackend) -> None:
    store = await backend.open()
    bad_keys: list[object] = ["", "/a", "a/", "a//b", "a/../b", ".", "a/./b", "sp ace", "é",
                              "a" * 600, 7, None, b"bytes"]
    for key in bad_keys:
        for call in (
            lambda k=key: store.create_value(k, b"x"),
            lambda k=key: store.read_value(k),
            lambda k=key: store.write_value(k, b"x", 1),
            lambda k=key: store.delete_value(k),
        ):
            try:
                await call()
            except (ValueError, TypeError) as exc:
                assert str(exc), "an error without a message"
            else:
                raise AssertionError(f"bad key {key!r} accepted")
    for prefix in ("a", "/", "a//", 3):
        try:
            await store.list_keys(prefix)  # type: ignore[arg-type]
        except (ValueError, TypeError):
            pass
        else:
            raise AssertionError(f"bad prefix {prefix!r} accepted")
    for value in ("text", 5, None):
        try:
            await store.create_value("k", value)  # type: ignore[arg-type]
        except TypeError:
            pass
        else:
            raise AssertionError(f"value {value!r} accepted")
    try:
        await store.create_value("k", bytes(MAX_VALUE_SIZE + 1))
    except ValueError as exc:
        assert str(MAX_VALUE_SIZE) in str(exc), exc
    else:
        raise AssertionError("an oversized value was accepted")
    await store.create_value("k", bytes(MAX_VALUE_SIZE))  # the limit itself is fine
    assert await store.list_keys() == ["k"]
