"""The ZooKeeper store's key/value namespace (``kv/<key path>``), versioned by ``mzxid``.

A key's znode holds ``KEY_MARK`` + its value; a node made only as the parent of deeper keys
holds b"" and counts as absent. A key's version is the znode's ``mzxid`` (unique across the
ensemble), not its own version, which restarts at 0 when a key is deleted and created again:
a stale compare-and-set must never succeed on the new key. A CAS reads the node, compares its
mzxid and writes with the node's own version (a change in between fails it).
:class:`~.store.ZooKeeperMetadataStore` hands its key/value calls to :class:`ZkKeyValues`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from pybk.errors import KeyExistsError, MetadataStoreError, MetadataVersionError, NoSuchKeyError
from pybk.metadata._common import check_key, check_prefix, check_value
from pybk.metadata.base import VersionedValue, Watch
from pybk.metadata.zookeeper.bridge import KazooBridge
from pybk.metadata.zookeeper.paths import Layout
from pybk.metadata.zookeeper.recipes import DataWatches

__all__ = ["KEY_MARK", "ZkKeyValues", "key_version"]

#: First byte of a key's znode data (parents made by ``makepath`` hold b"").
KEY_MARK = b"\x01"


def key_version(data: bytes | None, stat: Any) -> int | None:
    """A key's state for watches: a parent-only node counts as absent."""
    if stat is None or not bytes(data or b"").startswith(KEY_MARK):
        return None
    return int(stat.mzxid)


class ZkKeyValues:
    """The key/value part of the :class:`~pybk.metadata.base.MetadataStore` contract on one
    store's session (``bridge``); ``watchers`` are its shared key watches."""

    def __init__(self, bridge: KazooBridge, layout: Layout) -> None:
        self._bridge = bridge
        self._layout = layout
        self.watchers: DataWatches[str] = DataWatches(bridge, layout.kv, key_version)

    async def _get_key(self, op: str, key: str) -> tuple[bytes, Any]:
        """(value, stat) of a key; NoSuchKeyError when absent or only a parent node."""
        try:
            data, stat = await self._bridge.call(
                op, "get", self._layout.kv(key), expect=(NoNodeError,))
        except NoNodeError:
            raise NoSuchKeyError(f"key {key!r} does not exist") from None
        data = bytes(data or b"")
        if not data.startswith(KEY_MARK):
            raise NoSuchKeyError(f"key {key!r} does not exist")
        return data[len(KEY_MARK):], stat

    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        path = self._layout.kv(key)
        before = self._bridge.last_zxid()
        for _ in range(20):
            try:
                _, stat = await self._bridge.call(
                    "create_value", "create", path, KEY_MARK + data, makepath=True,
                    include_data=True, expect=(NodeExistsError,),
                )
            except NodeExistsError:
                # a parent node of deeper keys: it becomes this key, by CAS
                try:
                    old, stat = await self._bridge.call(
                        "create_value", "get", path, expect=(NoNodeError,)
                    )
                except NoNodeError:
                    continue
                if bytes(old or b"").startswith(KEY_MARK):
                    raise KeyExistsError(f"key {key!r} already exists") from None
                try:
                    stat = await self._bridge.call(
                        "create_value", "set", path, KEY_MARK + data, version=stat.version,
                        expect=(BadVersionError, NoNodeError),
                    )
                except (BadVersionError, NoNodeError):
                    continue
            self.watchers.saw(key, stat.mzxid, before)
            return VersionedValue(key, data, stat.mzxid)
        raise MetadataStoreError(f"could not create key {key!r}: contention")

    async def read_value(self, key: str) -> VersionedValue:
        check_key(key)
        before = self._bridge.last_zxid()
        try:
            data, stat = await self._get_key("read_value", key)
        except NoSuchKeyError:
            self.watchers.saw(key, None, before)
            raise
        self.watchers.saw(key, stat.mzxid, before)
        return VersionedValue(key, data, stat.mzxid)

    async def write_value(
        self, key: str, value: bytes, expected_version: int
    ) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        before = self._bridge.last_zxid()
        _, stat = await self._get_key("write_value", key)
        if stat.mzxid != expected_version:
            raise MetadataVersionError(
                f"key {key!r}: version {expected_version} is stale (store has {stat.mzxid})"
            )
        try:
            new = await self._bridge.call(
                "write_value", "set", self._layout.kv(key), KEY_MARK + data,
                version=stat.version, expect=(BadVersionError, NoNodeError),
            )
        except BadVersionError:
            raise MetadataVersionError(
                f"key {key!r}: version {expected_version} is stale (changed meanwhile)"
            ) from None
        except NoNodeError:
            raise NoSuchKeyError(f"key {key!r} does not exist") from None
        self.watchers.saw(key, new.mzxid, before)
        return VersionedValue(key, data, new.mzxid)

    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        check_key(key)
        path = self._layout.kv(key)
        before = self._bridge.last_zxid()
        for _ in range(20):
            _, stat = await self._get_key("delete_value", key)
            if expected_version is not None and stat.mzxid != expected_version:
                raise MetadataVersionError(
                    f"key {key!r}: version {expected_version} is stale (store has {stat.mzxid})"
                )
            try:
                if stat.numChildren:  # keys below it stay: it becomes a bare parent node
                    await self._bridge.call(
                        "delete_value", "set", path, b"", version=stat.version,
                        expect=(BadVersionError, NoNodeError),
                    )
                else:
                    await self._bridge.call(
                        "delete_value", "delete", path, version=stat.version,
                        expect=(BadVersionError, NoNodeError, NotEmptyError),
                    )
            except (BadVersionError, NoNodeError, NotEmptyError):
                continue  # changed meanwhile: look again (a CAS then fails on the mzxid)
            self.watchers.saw(key, None, before)
            return
        raise MetadataStoreError(f"could not delete key {key!r}: contention")

    async def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        found: list[str] = []

        async def walk(rel: str) -> None:
            base = self._layout.p("kv", rel) if rel else self._layout.p("kv")
            names = await self._bridge.children("list_keys", base)

            async def visit(name: str) -> None:
                child = f"{rel}/{name}" if rel else name
                try:
                    data, _ = await self._bridge.call(
                        "list_keys", "get", f"{base}/{name}", expect=(NoNodeError,)
                    )
                except NoNodeError:
                    return
                if bytes(data or b"").startswith(KEY_MARK):
                    found.append(child)
                await walk(child)

            await asyncio.gather(*map(visit, names))

        await walk(prefix[:-1])
        return sorted(found)

    def watch_value(self, key: str, callback: Callable[[str], None]) -> Watch:
        """One kazoo DataWatch per watched key and store (as for ledgers)."""
        check_key(key)
        return self.watchers.watch(key, lambda: callback(key))
