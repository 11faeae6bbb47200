"""pybk: Apache BookKeeper's replicated log, as a Python library.

Public names only; docs/api.md is the reference (every name, argument and error).
"""

from pybk import sync
from pybk.client import Client, ClientConfig
from pybk.client.placement import (
    DefaultPlacementPolicy,
    PlacementPolicy,
    RackAwarePlacementPolicy,
)
from pybk.client.reader import LedgerEntry, ReadHandle
from pybk.client.writer import LedgerHandle
from pybk.cluster import LocalCluster
from pybk.errors import (
    AlreadyTruncatedError,
    BKError,
    BookieUnavailableError,
    CorruptRecordError,
    DigestMismatchError,
    EndOfStreamError,
    EntryNotConfirmedError,
    EntryTooLargeError,
    LedgerClosedError,
    LedgerExistsError,
    LedgerFencedError,
    LedgerRecoveryError,
    LockedError,
    LogExistsError,
    LogNotFoundError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadOnlyBookieError,
    RecordTooLargeError,
    TimeoutError,
    UnauthorizedError,
    WriterConflictError,
)
from pybk.logs import Log, LogReader, LogRecord, LogWriter, Namespace, Position
from pybk.metadata.base import LedgerMetadata
from pybk.ops import AutoRecoveryConfig
from pybk.wal import WAL, AsyncWAL, AsyncWALFollower, WALFollower

__version__ = "0.1.0"

__all__ = [
    "WAL",
    "AlreadyTruncatedError",
    "AsyncWAL",
    "AsyncWALFollower",
    "AutoRecoveryConfig",
    "BKError",
    "BookieUnavailableError",
    "Client",
    "ClientConfig",
    "CorruptRecordError",
    "DefaultPlacementPolicy",
    "DigestMismatchError",
    "EndOfStreamError",
    "EntryNotConfirmedError",
    "EntryTooLargeError",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerHandle",
    "LedgerMetadata",
    "LedgerRecoveryError",
    "LocalCluster",
    "LockedError",
    "Log",
    "LogExistsError",
    "LogNotFoundError",
    "LogReader",
    "LogRecord",
    "LogWriter",
    "MetadataStoreError",
    "MetadataVersionError",
    "Namespace",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "PlacementPolicy",
    "Position",
    "RackAwarePlacementPolicy",
    "ReadHandle",
    "ReadOnlyBookieError",
    "RecordTooLargeError",
    "TimeoutError",
    "UnauthorizedError",
    "WALFollower",
    "WriterConflictError",
    "__version__",
    "sync",
]
