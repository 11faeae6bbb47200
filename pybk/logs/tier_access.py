"""The seam between offloading and the object store: a tier's calls as coroutines.

:mod:`pybk.logs.offload` and the offloaded segments' read handles talk to a tier only through
a :class:`TierAccess`, opened by the namespace's ``tiers`` opener. In production that is
:class:`ThreadedTier`: the blocking fsspec calls of :class:`pybk.logs.tier_store.TierStore`,
each in a worker thread off the event loop. The simulator opens one of its own instead
(``pybk.sim.tier``), on virtual time with faults, and no thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from pybk.logs.tier_store import SegmentIndex, TierStore

__all__ = ["ThreadedTier", "TierAccess", "TierOpener", "open_threaded_tier"]


class TierAccess(Protocol):
    """One tier URL's objects (the operations of :class:`TierStore`, awaitable)."""

    url: str

    def base(self, namespace: str, log: str, seq: int, ledger: int, uid: str) -> str: ...

    async def write_data(self, path: str, chunks: Iterable[list[bytes]]) -> tuple[int, int]: ...

    async def write_index(self, path: str, index: SegmentIndex) -> None: ...

    async def read_index(self, path: str) -> SegmentIndex: ...

    async def verify(self, path: str, seq: int, ledger: int) -> SegmentIndex: ...

    async def read_range(self, path: str, start: int, end: int) -> bytes: ...

    async def delete(self, path: str) -> None: ...

    async def list_segments(self, namespace: str, log: str) -> list[str]: ...

    async def list_objects(self, namespace: str, log: str) -> list[tuple[str, float]]: ...

    async def list_uploads(self, namespace: str, log: str) -> list[tuple[str, str, float]]: ...

    async def abort_upload(self, name: str, upload_id: str) -> None: ...


#: opens a tier: ``await opener(url, options)``
TierOpener = Callable[[str, dict[str, Any]], Awaitable[TierAccess]]


class ThreadedTier:
    """A :class:`TierStore` whose blocking calls run in worker threads."""

    def __init__(self, store: TierStore) -> None:
        self.store = store
        self.url = store.url

    def base(self, namespace: str, log: str, seq: int, ledger: int, uid: str) -> str:
        return self.store.base(namespace, log, seq, ledger, uid)

    async def write_data(self, path: str, chunks: Iterable[list[bytes]]) -> tuple[int, int]:
        return await asyncio.to_thread(self.store.write_data, path, chunks)

    async def write_index(self, path: str, index: SegmentIndex) -> None:
        await asyncio.to_thread(self.store.write_index, path, index)

    async def read_index(self, path: str) -> SegmentIndex:
        return await asyncio.to_thread(self.store.read_index, path)

    async def verify(self, path: str, seq: int, ledger: int) -> SegmentIndex:
        return await asyncio.to_thread(self.store.verify, path, seq, ledger)

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        return await asyncio.to_thread(self.store.read_range, path, start, end)

    async def delete(self, path: str) -> None:
        await asyncio.to_thread(self.store.delete, path)

    async def list_segments(self, namespace: str, log: str) -> list[str]:
        return await asyncio.to_thread(self.store.list_segments, namespace, log)

    async def list_objects(self, namespace: str, log: str) -> list[tuple[str, float]]:
        return await asyncio.to_thread(self.store.list_objects, namespace, log)

    async def list_uploads(self, namespace: str, log: str) -> list[tuple[str, str, float]]:
        return await asyncio.to_thread(self.store.list_uploads, namespace, log)

    async def abort_upload(self, name: str, upload_id: str) -> None:
        await asyncio.to_thread(self.store.abort_upload, name, upload_id)


async def open_threaded_tier(url: str, options: dict[str, Any]) -> TierAccess:
    """The production opener: fsspec for ``url`` (made in a thread: some filesystems
    connect when made)."""
    return ThreadedTier(await asyncio.to_thread(TierStore, url, options))
