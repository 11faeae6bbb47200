"""The pybk exception hierarchy.

One class per failure a caller can act on, all rooted at :class:`BKError`. The names follow
BookKeeper's ``BKException.Code`` so that people who know BookKeeper find what they expect.

Bad input from a *caller* (a wrong argument) raises ``ValueError``/``TypeError`` naming the
offending value; the classes here describe what the cluster, the network or the disk did.

Every class carries a ``status`` (see :class:`pybk.protocol.Status`) so an error raised on a
bookie can travel over the wire and be raised again, as the same class, on the client.
"""

from __future__ import annotations

import builtins


class BKError(Exception):
    """Base class of every error pybk raises on purpose."""

    #: The wire status code for this error (``pybk.protocol.Status`` value).
    status: int = 100


class LedgerFencedError(BKError):
    """The ledger was fenced by a recovering reader; this writer may no longer add to it.

    An add that fails this way is *indeterminate*: the entry may or may not be part of the
    ledger once it is closed (like a timeout).
    """

    status = 6


class LedgerClosedError(BKError):
    """The ledger is closed (or this handle was closed); it accepts no more adds."""

    status = 14


class NoSuchLedgerError(BKError):
    """The ledger does not exist (in the metadata store, or on this bookie)."""

    status = 1


class NoSuchEntryError(BKError):
    """The entry does not exist. A bookie says so only when its index proves absence."""

    status = 2


class EntryNotConfirmedError(NoSuchEntryError, ValueError):
    """A read asked for entries past the last add confirmed (they may not exist yet, or ever;
    ``read_unconfirmed`` reads what the bookies hold). Also a ValueError, as it was before it
    had a class of its own."""


class LedgerExistsError(BKError):
    """A ledger with this id already exists."""

    status = 15


class NotEnoughBookiesError(BKError):
    """Too few writable bookies to form (or repair) an ensemble."""

    status = 16


class DigestMismatchError(BKError):
    """An entry failed its digest check, or its embedded ledger/entry ids did not match."""

    status = 17


class BookieUnavailableError(BKError):
    """A bookie could not be reached, or it is stopped."""

    status = 13


class UnauthorizedError(BKError):
    """Wrong password / master key, or an unauthenticated connection."""

    status = 5


class CorruptRecordError(BKError):
    """A record on disk failed its checksum or could not be parsed.

    Never turned into "absent": corruption is an error (BookKeeper issue #2908).
    """

    status = 9

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class MetadataVersionError(BKError):
    """A compare-and-set on ledger metadata lost: someone else updated it first."""

    status = 18


class MetadataStoreError(BKError):
    """The metadata store failed or its session was lost; the operation's outcome is unknown."""

    status = 19


class TimeoutError(BKError, builtins.TimeoutError):  # the name is the contract
    """An operation did not complete in time. Also a built-in ``TimeoutError``."""

    status = 12


class ReadOnlyBookieError(BKError):
    """The bookie is read-only (disk above its watermark, or a journal failure)."""

    status = 7


class TooManyRequestsError(BKError):
    """The bookie is applying backpressure; retry later."""

    status = 8


class EntryExistsError(BKError):
    """An add of an existing (ledger, entry) with *different* bytes (replicas must agree)."""

    status = 10


class UnknownLedgerStateError(BKError):
    """The bookie may have lost data for this ledger and cannot answer truthfully (limbo)."""

    status = 11


class BadRequestError(BKError):
    """A request was malformed or not allowed in the current state."""

    status = 3


class IOBookieError(BKError):
    """An I/O error on the bookie's disk."""

    status = 4


class JournalFailedError(IOBookieError):
    """The journal hit an unrecoverable error (e.g. fsync failed) and stopped accepting writes.

    Nothing covered by the failed fsync is ever acknowledged; the bookie never retries an
    fsync and then acknowledges (the "fsyncgate" lesson).
    """


class LedgerRecoveryError(BKError):
    """Recovery could not decide the ledger's end; the ledger stays IN_RECOVERY.

    Raised instead of closing the ledger short when the replies do not prove where it ends.
    """

    status = 20


class UnexpectedConditionError(BKError):
    """Something that the protocol says cannot happen did (e.g. metadata changed under recovery)."""

    status = 21


class BookieStateError(BKError):
    """A bookie refuses to start or serve: its data directory does not match its identity,
    or it is stopped."""

    status = 22


class ProtocolError(BKError):
    """A malformed frame or message on the wire (bad length, CRC, version, operation...)."""

    status = 23


class ClientClosedError(BKError):
    """The client (or the cluster) was closed."""

    status = 24


class NoSuchKeyError(BKError):
    """A key of the metadata store's key/value namespace does not exist."""

    status = 25


class KeyExistsError(BKError):
    """A key of the metadata store's key/value namespace already exists."""

    status = 26


class LogNotFoundError(BKError):
    """The named log does not exist in this namespace (never created, or deleted)."""

    status = 27


class LogExistsError(BKError):
    """A log with this name already exists in the namespace."""

    status = 28


class AlreadyTruncatedError(BKError):
    """A reader asked for a position before the log's truncation point: those records are
    gone (DistributedLog's AlreadyTruncatedTransactionException)."""

    status = 29


class EndOfStreamError(BKError):
    """The log was marked ended (``mark_end_of_stream``): it takes no more records."""

    status = 30


class WriterConflictError(BKError):
    """Another writer opened the log at the same moment and won the race for its writer
    lock; this one never wrote anything. (A writer that opens *later* fences the earlier one
    instead, whose appends then fail with LedgerFencedError.)"""

    status = 31


class RecordTooLargeError(BKError, ValueError):
    """A record (or a batch of records) is larger than the log's size limits. Raised before
    anything is sent; also a ValueError, since the caller passed it."""

    status = 32


class LockedError(BKError):
    """A resource is held by someone else: e.g. an embedded WAL directory opened by another
    process (the message names the holder)."""

    status = 33


_BY_STATUS: dict[int, type[BKError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, BKError) and _cls is not BKError:
        _BY_STATUS.setdefault(_cls.status, _cls)
_BY_STATUS[JournalFailedError.status] = IOBookieError


def error_for_status(status: int, message: str = "") -> BKError:
    """Build the exception that corresponds to a non-OK wire status."""
    cls = _BY_STATUS.get(status, BKError)
    if cls is CorruptRecordError:
        return CorruptRecordError(message or "corrupt record")
    return cls(message or cls.__name__)


def fresh_copy(exc: BaseException) -> BaseException:
    """A new exception of the same kind, message and cause: one failure handed to many waiters
    must not be one object raised in many tasks (its traceback would pile up). ``exc`` itself
    when its class cannot be rebuilt from its args."""
    try:
        new = type(exc)(*exc.args)
    except Exception:
        return exc
    new.__cause__ = exc.__cause__
    return new


__all__ = [
    "AlreadyTruncatedError",
    "BKError",
    "BadRequestError",
    "BookieStateError",
    "BookieUnavailableError",
    "ClientClosedError",
    "CorruptRecordError",
    "DigestMismatchError",
    "EndOfStreamError",
    "EntryExistsError",
    "EntryNotConfirmedError",
    "IOBookieError",
    "JournalFailedError",
    "KeyExistsError",
    "LedgerClosedError",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerRecoveryError",
    "LockedError",
    "LogExistsError",
    "LogNotFoundError",
    "MetadataStoreError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchKeyError",
    "NoSuchLedgerError",
    "NotEnoughBookiesError",
    "ProtocolError",
    "ReadOnlyBookieError",
    "RecordTooLargeError",
    "TimeoutError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnexpectedConditionError",
    "UnknownLedgerStateError",
    "WriterConflictError",
    "error_for_status",
    "fresh_copy",
]
