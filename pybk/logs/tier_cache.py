"""Blocks of offloaded segments' data objects, shared by every reader of one client and
bounded in bytes.

A reader of an offloaded segment asks for the byte span of a few entries; the cache fetches
the aligned blocks (``block`` bytes, 1 MiB: the read-ahead) that hold it, one ranged read per
block. Readers of the same segment share blocks, and a block being fetched is fetched once
for all who ask meanwhile, so concurrent readers neither thrash nor multiply requests. The
least recently used blocks go once the total passes ``capacity`` bytes. Offload objects never
change (each attempt has a name of its own), so a cached block is never stale.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Any, Final

from pybk.logs.tier_access import TierAccess

__all__ = ["BLOCK_BYTES", "CAPACITY_BYTES", "TierReadCache"]

#: the unit of every read from the tier (and of the read-ahead)
BLOCK_BYTES: Final = 1 << 20
#: a client's cache, at most
CAPACITY_BYTES: Final = 64 << 20

_Key = tuple[str, str, int]  # (tier URL, object path, block number)

_BY_CLIENT: weakref.WeakKeyDictionary[Any, TierReadCache] = weakref.WeakKeyDictionary()


class TierReadCache:
    """The blocks read from tiers by one client (see the module docstring); ``hits`` and
    ``fetches`` count block lookups answered from memory and ranged reads made."""

    def __init__(self, capacity: int = CAPACITY_BYTES, block: int = BLOCK_BYTES) -> None:
        if capacity < 0 or block < 1:
            raise ValueError(f"need capacity >= 0 and block >= 1, got {capacity}, {block}")
        self.capacity = capacity
        self.block = block
        self._blocks: collections.OrderedDict[_Key, bytes] = collections.OrderedDict()
        self._fetching: dict[_Key, asyncio.Future[bytes]] = {}
        self.bytes = 0
        self.hits = 0
        self.fetches = 0

    @classmethod
    def of(cls, client: Any) -> TierReadCache:
        """The cache of ``client`` (made on first use)."""
        cache = _BY_CLIENT.get(client)
        if cache is None:
            cache = _BY_CLIENT[client] = cls()
        return cache

    async def read(self, store: TierAccess, path: str, start: int, end: int,
                   size: int) -> bytes:
        """Bytes ``[start, end)`` of ``path``'s data object (``size`` bytes long)."""
        if not 0 <= start <= end <= size:
            raise ValueError(f"bad span {start}..{end} of a {size}-byte object")
        first, last = start // self.block, max(start, end - 1) // self.block
        parts = [await self._block(store, path, b, size) for b in range(first, last + 1)]
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        lo = start - first * self.block
        return data[lo:lo + (end - start)]

    async def _block(self, store: TierAccess, path: str, number: int, size: int) -> bytes:
        key = (store.url, path, number)
        while True:
            found = self._blocks.get(key)
            if found is not None:
                self._blocks.move_to_end(key)
                self.hits += 1
                return found
            pending = self._fetching.get(key)
            if pending is None:
                return await self._fetch(store, path, key, size)
            try:
                data = await asyncio.shield(pending)
            except asyncio.CancelledError:
                if not pending.cancelled():
                    raise  # (this caller was cancelled)
                continue  # the reader that fetched it was cancelled: fetch it again
            self.hits += 1
            return data

    async def _fetch(self, store: TierAccess, path: str, key: _Key, size: int) -> bytes:
        number = key[2]
        pending = self._fetching[key] = asyncio.get_running_loop().create_future()
        try:
            self.fetches += 1
            begin = number * self.block
            data = await store.read_range(path, begin, min(size, begin + self.block))
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                pending.cancel()
            else:
                pending.set_exception(exc)
                pending.exception()  # (retrieved: nobody else may be waiting)
            raise
        finally:
            del self._fetching[key]
        pending.set_result(data)
        self._keep(key, data)
        return data

    def _keep(self, key: _Key, data: bytes) -> None:
        if len(data) > self.capacity:
            return
        self._blocks[key] = data
        self.bytes += len(data)
        while self.bytes > self.capacity:
            _, gone = self._blocks.popitem(last=False)
            self.bytes -= len(gone)
