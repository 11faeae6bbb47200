"""pybk: Apache BookKeeper's replicated log, as a Python library.

Public names only; see API.md for the contract.
"""

from pybk import sync
from pybk.client import Client, ClientConfig
from pybk.cluster import LocalCluster
from pybk.errors import (
    BKError,
    BookieUnavailableError,
    CorruptRecordError,
    DigestMismatchError,
    LedgerClosedError,
    LedgerExistsError,
    LedgerFencedError,
    LedgerRecoveryError,
    MetadataStoreError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    ReadOnlyBookieError,
    TimeoutError,
    UnauthorizedError,
)
from pybk.metadata.base import LedgerMetadata
from pybk.replication.reader import LedgerEntry, ReadHandle
from pybk.replication.writer import LedgerHandle

__version__ = "0.1.0"

__all__ = [
    "BKError",
    "BookieUnavailableError",
    "Client",
    "ClientConfig",
    "CorruptRecordError",
    "DigestMismatchError",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerHandle",
    "LedgerMetadata",
    "LedgerRecoveryError",
    "LocalCluster",
    "MetadataStoreError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ReadHandle",
    "ReadOnlyBookieError",
    "TimeoutError",
    "UnauthorizedError",
    "__version__",
    "sync",
]
