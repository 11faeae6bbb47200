"""pybk for synchronous code: the async API driven by one event loop in a background thread.

:mod:`.runner` holds that loop thread (every synchronous class uses it, the WAL included),
:mod:`.client` the ledger client and LocalCluster, :mod:`.logs` namespaces and logs,
:mod:`.mirror` a log mirror between two clusters.
"""

from pybk.sync.client import (
    Client,
    DeferredSyncLedgerHandle,
    LedgerHandle,
    LedgerHandleAdv,
    LocalCluster,
    ReadHandle,
)
from pybk.sync.logs import SyncLog, SyncLogReader, SyncLogWriter, SyncNamespace
from pybk.sync.mirror import LogMirror
from pybk.sync.runner import LoopThread

__all__ = [
    "Client",
    "DeferredSyncLedgerHandle",
    "LedgerHandle",
    "LedgerHandleAdv",
    "LocalCluster",
    "LogMirror",
    "LoopThread",
    "ReadHandle",
    "SyncLog",
    "SyncLogReader",
    "SyncLogWriter",
    "SyncNamespace",
]
