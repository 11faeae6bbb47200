"""What the store-level checkpoint and deletion tests share: a store on a MemFileSystem with
small segments, its configurations, and framed entries."""

from __future__ import annotations

import uuid

from pybk.storage import MemFileSystem
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=12, version=4))
KEY = b"k" * 32
CONFIG = StoreConfig(segment_size=4096)
#: deltas only (after start-up's base) up to the count limit
CHAIN = StoreConfig(segment_size=4096, checkpoint_delta_ratio=1e9)


def body(lid: int, eid: int) -> bytes:
    return DigestManager(lid).frame(eid, eid - 1, 0, bytes([lid % 256, eid % 256]) * 20)


async def open_store(fs: MemFileSystem, config: StoreConfig = CONFIG) -> LedgerStore:
    s = LedgerStore(fs, "/data", IID, config)
    await s.open()
    return s


async def fill(s: LedgerStore, lid: int, eids: range) -> None:
    """Add ``eids`` to ledger ``lid``, each awaited (durable)."""
    for eid in eids:
        await s.add(lid, eid, body(lid, eid), KEY)
