"""pybk: Apache BookKeeper's replicated log, as a Python library.

Public names only; see API.md for the contract.
"""

from pybk import sync
from pybk.client import Client, ClientConfig
from pybk.cluster import LocalCluster
from pybk.errors import (
    AlreadyTruncatedError,
    BKError,
    BookieUnavailableError,
    CorruptRecordError,
    DigestMismatchError,
    EndOfStreamError,
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
from pybk.metadata.base import LedgerMetadata
from pybk.replication.reader import LedgerEntry, ReadHandle
from pybk.replication.writer import LedgerHandle
from pybk.stream import Log, LogReader, LogRecord, LogWriter, Namespace, Position
from pybk.wal import WAL, AsyncWAL

__version__ = "0.1.0"

__all__ = [
    "WAL",
    "AlreadyTruncatedError",
    "AsyncWAL",
    "BKError",
    "BookieUnavailableError",
    "Client",
    "ClientConfig",
    "CorruptRecordError",
    "DigestMismatchError",
    "EndOfStreamError",
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
    "Position",
    "ReadHandle",
    "ReadOnlyBookieError",
    "RecordTooLargeError",
    "TimeoutError",
    "UnauthorizedError",
    "WriterConflictError",
    "__version__",
    "sync",
]
