"""pybk: Apache BookKeeper's replicated log, as a Python library.

Public names only; docs/api.md is the reference (every name, argument and error).
"""

from pybk import sync
from pybk.client import Client, ClientConfig
from pybk.client.adv import LedgerHandleAdv
from pybk.client.deferred import DeferredSyncLedgerHandle, WriteFlag
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
    CursorNotFoundError,
    DigestMismatchError,
    DuplicateEntryIdError,
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
from pybk.tables import (
    AsyncTable,
    AsyncTables,
    KeyValue,
    NamespaceExistsError,
    NamespaceNotFoundError,
    RangeFencedError,
    Table,
    TableBadRequestError,
    TableError,
    TableExistsError,
    TableNotFoundError,
    Tables,
)
from pybk.wal import WAL, AsyncWAL, AsyncWALFollower, WALFollower

__version__ = "0.1.0"

__all__ = [
    "WAL",
    "AlreadyTruncatedError",
    "AsyncTable",
    "AsyncTables",
    "AsyncWAL",
    "AsyncWALFollower",
    "AutoRecoveryConfig",
    "BKError",
    "BookieUnavailableError",
    "Client",
    "ClientConfig",
    "CorruptRecordError",
    "CursorNotFoundError",
    "DefaultPlacementPolicy",
    "DeferredSyncLedgerHandle",
    "DigestMismatchError",
    "DuplicateEntryIdError",
    "EndOfStreamError",
    "EntryNotConfirmedError",
    "EntryTooLargeError",
    "KeyValue",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerHandle",
    "LedgerHandleAdv",
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
    "NamespaceExistsError",
    "NamespaceNotFoundError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "PlacementPolicy",
    "Position",
    "RackAwarePlacementPolicy",
    "RangeFencedError",
    "ReadHandle",
    "ReadOnlyBookieError",
    "RecordTooLargeError",
    "Table",
    "TableBadRequestError",
    "TableError",
    "TableExistsError",
    "TableNotFoundError",
    "Tables",
    "TimeoutError",
    "UnauthorizedError",
    "WALFollower",
    "WriteFlag",
    "WriterConflictError",
    "__version__",
    "sync",
]
