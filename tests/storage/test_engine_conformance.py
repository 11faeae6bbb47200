"""Every storage engine passes the ledger storage conformance suite
(pybk.testing.ledger_storage_conformance), one test per check and engine."""

from __future__ import annotations

import uuid

import pytest

from pybk.storage import FileSystem
from pybk.storage.dbstore import DbLedgerStore
from pybk.storage.engine import LedgerStorage
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.testing.ledger_storage_conformance import CHECKS, EngineFactory

IID = str(uuid.UUID(int=37, version=4))


def _journal(fs: FileSystem, data_dir: str) -> LedgerStorage:
    # small segments: rotation, sealed segments and compaction take part
    return LedgerStore(fs, data_dir, IID, StoreConfig(segment_size=8192))


def _db(fs: FileSystem, data_dir: str) -> LedgerStorage:
    # a small write cache and read-ahead: flushes between checkpoints, evictions
    return DbLedgerStore(fs, data_dir, IID, StoreConfig(
        segment_size=8192, storage="db", db_write_cache_bytes=4096, db_read_ahead_bytes=2048))


ENGINES: dict[str, EngineFactory] = {"journal": _journal, "db": _db}


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("engine", sorted(ENGINES))
async def test_engine_conformance(engine: str, check: str) -> None:
    await CHECKS[check](ENGINES[engine])
