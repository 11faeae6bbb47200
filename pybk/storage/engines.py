"""Which storage engine a bookie runs: ``StoreConfig.storage`` names it."""

from __future__ import annotations

from collections.abc import Callable, Container

from pybk.stats import BookieStats
from pybk.storage.config import StoreConfig
from pybk.storage.dbstore import DbLedgerStore
from pybk.storage.engine import LedgerStorage
from pybk.storage.fs import FileSystem
from pybk.storage.store import LedgerStore

__all__ = ["make_engine"]


def make_engine(
    fs: FileSystem,
    data_dir: str,
    instance_id: str,
    config: StoreConfig,
    *,
    on_fatal: Callable[[BaseException], None] | None = None,
    on_write_error: Callable[[OSError], None] | None = None,
    on_ledger_change: Callable[[int], None] | None = None,
    watched: Container[int] | None = None,
    stats: BookieStats | None = None,
) -> LedgerStorage:
    """The engine ``config.storage`` names ("journal": LedgerStore, "db": DbLedgerStore),
    not opened yet."""
    cls = DbLedgerStore if config.storage == "db" else LedgerStore
    return cls(fs, data_dir, instance_id, config, on_fatal=on_fatal,
               on_write_error=on_write_error, on_ledger_change=on_ledger_change,
               watched=watched, stats=stats)
