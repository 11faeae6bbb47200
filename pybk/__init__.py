"""pybk: Apache BookKeeper's replicated log, as a Python library.

Public names only; see API.md for the contract.
"""

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

__version__ = "0.1.0"

__all__ = [
    "BKError",
    "BookieUnavailableError",
    "CorruptRecordError",
    "DigestMismatchError",
    "LedgerClosedError",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerRecoveryError",
    "MetadataStoreError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ReadOnlyBookieError",
    "TimeoutError",
    "UnauthorizedError",
    "__version__",
]
