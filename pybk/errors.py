"""The pybk exception hierarchy.

One class per failure a caller can act on, all rooted at :class:`BKError`. The names follow
BookKeeper's ``BKException.Code`` so that people who know BookKeeper find what they expect.

Bad input from a *caller* (a wrong argument) raises ``ValueError``/``TypeError`` naming the
offending value; the classes here describe what the cluster, the network or the disk did.

Every class carries a ``status`` (see :class:`pybk.wire.Status`) so an error raised on a
bookie can travel over the wire and be raised again, as the same class, on the client.
"""

from __future__ import annotations

import builtins
import enum


class Status(enum.IntEnum):
    """Wire status codes: the one status table. Each non-OK code is one class below
    (``BKError.status``); :func:`error_for_status` and :func:`status_of` map between them.
    ``pybk.wire.Status`` is this same enum."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    BAD_REQUEST = 3
    IO_ERROR = 4
    UNAUTHORIZED = 5
    FENCED = 6
    READ_ONLY = 7
    TOO_MANY_REQUESTS = 8
    CORRUPT = 9
    ENTRY_EXISTS = 10
    UNKNOWN_LEDGER_STATE = 11
    TIMEOUT = 12
    UNAVAILABLE = 13
    LEDGER_CLOSED = 14
    LEDGER_EXISTS = 15
    NOT_ENOUGH_BOOKIES = 16
    DIGEST_MISMATCH = 17
    METADATA_VERSION = 18
    METADATA_STORE_ERROR = 19
    LEDGER_RECOVERY_ERROR = 20
    UNEXPECTED_CONDITION = 21
    BOOKIE_STATE = 22
    PROTOCOL_ERROR = 23
    CLIENT_CLOSED = 24
    # not sent by bookies: the metadata key/value namespace and the log layer (pybk.logs)
    NO_SUCH_KEY = 25
    KEY_EXISTS = 26
    LOG_NOT_FOUND = 27
    LOG_EXISTS = 28
    ALREADY_TRUNCATED = 29
    END_OF_STREAM = 30
    WRITER_CONFLICT = 31
    RECORD_TOO_LARGE = 32
    LOCKED = 33
    # refused by the client before an entry id is taken (never sent by bookies)
    ENTRY_TOO_LARGE = 34
    DUPLICATE_ENTRY_ID = 35
    # multi-tenancy: a storage or count quota refuses (sent by bookies); records that are missing
    QUOTA_EXCEEDED = 36
    NO_SUCH_TENANT = 37
    NO_SUCH_NAMESPACE = 38
    NOT_EMPTY = 39
    LEDGER_ID_OVERFLOW = 40  # the metadata store has no ledger id left to hand out
    GENERIC_ERROR = 100  # BKError itself (no more specific class)


class BKError(Exception):
    """Base class of every error pybk raises on purpose."""

    #: The wire status code for this error.
    status: Status = Status.GENERIC_ERROR


class LedgerFencedError(BKError):
    """The ledger was fenced by a recovering reader; this writer may no longer add to it.

    An add that fails this way is *indeterminate*: the entry may or may not be part of the
    ledger once it is closed (like a timeout).
    """

    status = Status.FENCED


class LedgerClosedError(BKError):
    """The ledger is closed (or this handle was closed); it accepts no more adds."""

    status = Status.LEDGER_CLOSED


class NoSuchLedgerError(BKError):
    """The ledger does not exist (in the metadata store, or on this bookie)."""

    status = Status.NO_SUCH_LEDGER


class NoSuchEntryError(BKError):
    """The entry does not exist. A bookie says so only when its index proves absence."""

    status = Status.NO_SUCH_ENTRY


class EntryNotConfirmedError(NoSuchEntryError, ValueError):
    """A read asked for entries past the last add confirmed (they may not exist yet, or ever;
    ``read_unconfirmed`` reads what the bookies hold). Also a ValueError, as it was before it
    had a class of its own."""


class LedgerExistsError(BKError):
    """A ledger with this id already exists."""

    status = Status.LEDGER_EXISTS


class LedgerIdOverflowError(BKError):
    """The metadata store has no ledger id left to hand out (ids are int64; the largest,
    ``2**63 - 1``, is never handed out, only created by a caller who names it)."""

    status = Status.LEDGER_ID_OVERFLOW


class NotEnoughBookiesError(BKError):
    """Too few writable bookies to form (or repair) an ensemble."""

    status = Status.NOT_ENOUGH_BOOKIES


class DigestMismatchError(BKError):
    """An entry failed its digest check, or its embedded ledger/entry ids did not match."""

    status = Status.DIGEST_MISMATCH


class BookieUnavailableError(BKError):
    """A bookie could not be reached, or it is stopped."""

    status = Status.UNAVAILABLE


class UnauthorizedError(BKError):
    """Wrong password / master key, or an unauthenticated connection."""

    status = Status.UNAUTHORIZED


class CorruptRecordError(BKError):
    """A record on disk failed its checksum or could not be parsed.

    Never turned into "absent": corruption is an error (BookKeeper issue #2908).
    """

    status = Status.CORRUPT

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        super().__init__(message)
        self.path = path
        self.offset = offset


class MetadataVersionError(BKError):
    """A compare-and-set on ledger metadata lost: someone else updated it first."""

    status = Status.METADATA_VERSION


class MetadataStoreError(BKError):
    """The metadata store failed or its session was lost; the operation's outcome is unknown."""

    status = Status.METADATA_STORE_ERROR


class TimeoutError(BKError, builtins.TimeoutError):  # the name is the contract
    """An operation did not complete in time. Also a built-in ``TimeoutError``."""

    status = Status.TIMEOUT


class ReadOnlyBookieError(BKError):
    """The bookie is read-only (disk above its watermark, or a journal failure)."""

    status = Status.READ_ONLY


class TooManyRequestsError(BKError):
    """The bookie is applying backpressure; retry later."""

    status = Status.TOO_MANY_REQUESTS


class EntryExistsError(BKError):
    """An add of an existing (ledger, entry) with *different* bytes (replicas must agree)."""

    status = Status.ENTRY_EXISTS


class UnknownLedgerStateError(BKError):
    """The bookie may have lost data for this ledger and cannot answer truthfully (limbo)."""

    status = Status.UNKNOWN_LEDGER_STATE


class BadRequestError(BKError):
    """A request was malformed or not allowed in the current state."""

    status = Status.BAD_REQUEST


class IOBookieError(BKError):
    """An I/O error on the bookie's disk."""

    status = Status.IO_ERROR


class JournalFailedError(IOBookieError):
    """The journal hit an unrecoverable error (e.g. fsync failed) and stopped accepting writes.

    Nothing covered by the failed fsync is ever acknowledged; the bookie never retries an
    fsync and then acknowledges (the "fsyncgate" lesson).
    """


class LedgerRecoveryError(BKError):
    """Recovery could not decide the ledger's end; the ledger stays IN_RECOVERY.

    Raised instead of closing the ledger short when the replies do not prove where it ends.
    """

    status = Status.LEDGER_RECOVERY_ERROR


class UnexpectedConditionError(BKError):
    """Something that the protocol says cannot happen did (e.g. metadata changed under recovery)."""

    status = Status.UNEXPECTED_CONDITION


class BookieStateError(BKError):
    """A bookie refuses to start or serve: its data directory does not match its identity,
    or it is stopped."""

    status = Status.BOOKIE_STATE


class ProtocolError(BKError):
    """A malformed frame or message on the wire (bad length, CRC, version, operation...)."""

    status = Status.PROTOCOL_ERROR


class ClientClosedError(BKError):
    """The client (or the cluster) was closed."""

    status = Status.CLIENT_CLOSED


class NoSuchKeyError(BKError):
    """A key of the metadata store's key/value namespace does not exist."""

    status = Status.NO_SUCH_KEY


class KeyExistsError(BKError):
    """A key of the metadata store's key/value namespace already exists."""

    status = Status.KEY_EXISTS


class LogNotFoundError(BKError):
    """The named log does not exist in this namespace (never created, or deleted)."""

    status = Status.LOG_NOT_FOUND


class CursorNotFoundError(LogNotFoundError):
    """The named cursor of a log does not exist (never subscribed, or deleted); a kind of
    LogNotFoundError (what is not found is part of a log), with its wire status."""


class LogExistsError(BKError):
    """A log with this name already exists in the namespace."""

    status = Status.LOG_EXISTS


class AlreadyTruncatedError(BKError):
    """A reader asked for a position before the log's truncation point: those records are
    gone (DistributedLog's AlreadyTruncatedTransactionException)."""

    status = Status.ALREADY_TRUNCATED


class EndOfStreamError(BKError):
    """The log was marked ended (``mark_end_of_stream``): it takes no more records."""

    status = Status.END_OF_STREAM


class WriterConflictError(BKError):
    """Another writer opened the log at the same moment and won the race for its writer
    lock; this one never wrote anything. (A writer that opens *later* fences the earlier one
    instead, whose appends then fail with LedgerFencedError.)"""

    status = Status.WRITER_CONFLICT


class RecordTooLargeError(BKError, ValueError):
    """A record (or a batch of records) is larger than the log's size limits. Raised before
    anything is sent; also a ValueError, since the caller passed it."""

    status = Status.RECORD_TOO_LARGE


class EntryTooLargeError(BKError, ValueError):
    """An entry is larger than the client's ``max_entry_size`` (``ClientConfig``): refused
    before an entry id is taken, so nothing is left half done. Also a ValueError, since the
    caller passed it. The same limit holds in process and over TCP (it fits one frame)."""

    status = Status.ENTRY_TOO_LARGE


class DuplicateEntryIdError(BKError, ValueError):
    """A caller-chosen entry id (:meth:`pybk.LedgerHandleAdv.append`) that this handle added
    already, or that is at or below its last add confirmed: refused before anything is sent.
    Also a ValueError, since the caller passed it."""

    status = Status.DUPLICATE_ENTRY_ID


class BookieStoppedError(BookieStateError, BookieUnavailableError):
    """A request reached a bookie that is stopped (or crashed): the bookie is unavailable,
    and it is in no state to serve (so both classes)."""

    status = Status.UNAVAILABLE


class LockedError(BKError):
    """A resource is held by someone else: e.g. an embedded WAL directory opened by another
    process (the message names the holder). ``pid`` is the holder's process id when it is
    known (a directory lock's holder), else None."""

    status = Status.LOCKED

    def __init__(self, *args: object, pid: int | None = None) -> None:
        super().__init__(*args)
        #: the process id of the holder (None when unknown)
        self.pid = pid

    def __reduce__(self) -> tuple[object, ...]:
        # (pickled across processes, e.g. to a Spark driver: the pid goes with it)
        return (_locked_error, (self.args, self.pid))


class QuotaExceededError(BKError):
    """A tenant is over a quota (bytes stored, logs, ledgers): new ledgers and entries of
    that tenant are refused until it is under again; other tenants keep writing."""

    status = Status.QUOTA_EXCEEDED


class BacklogQuotaExceededError(QuotaExceededError):
    """A log's slowest durable cursor is behind by more than the log's backlog quota and
    its policy is "refuse": appends are refused until the cursors catch up (retryable)."""


class NoSuchTenantError(BKError):
    """No tenant of that name in the metadata store."""

    status = Status.NO_SUCH_TENANT


class NoSuchNamespaceError(BKError):
    """No namespace of that name (``tenant/namespace``) in the metadata store."""

    status = Status.NO_SUCH_NAMESPACE


class NotEmptyError(BKError):
    """A tenant with namespaces, or a namespace with logs, refuses deletion unless forced."""

    status = Status.NOT_EMPTY


def _locked_error(args: tuple[object, ...], pid: int | None) -> LockedError:
    return LockedError(*args, pid=pid)


_BY_STATUS: dict[int, type[BKError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, BKError) and _cls is not BKError:
        _BY_STATUS.setdefault(_cls.status, _cls)
_BY_STATUS[Status.IO_ERROR] = IOBookieError
_BY_STATUS[Status.UNAVAILABLE] = BookieUnavailableError


def error_for_status(status: int, message: str = "") -> BKError:
    """Build the exception that corresponds to a non-OK wire status (unknown ones: BKError)."""
    cls = _BY_STATUS.get(status, BKError)
    if cls is CorruptRecordError:
        return CorruptRecordError(message or "corrupt record")
    return cls(message or cls.__name__)


def status_of(exc: BaseException) -> Status:
    """The wire status that reports ``exc`` (the one mapping, used by the bookie, the server
    and every transport): a BKError's own status; anything else, a bug the bookie logs with
    its traceback, IO_ERROR (the bookie failed the request: the client replaces it)."""
    if isinstance(exc, BKError):
        return exc.status
    return Status.IO_ERROR


def fresh_copy(exc: BaseException) -> BaseException:
    """A new exception of the same kind, message and cause: one failure handed to many waiters
    must not be one object raised in many tasks (its traceback would pile up). ``exc`` itself
    when its class cannot be rebuilt from its args."""
    try:
        new = type(exc)(*exc.args)
    except Exception:
        return exc
    if isinstance(exc, LockedError) and isinstance(new, LockedError):
        new.pid = exc.pid
    new.__cause__ = exc.__cause__
    return new


__all__ = [
    "AlreadyTruncatedError",
    "BKError",
    "BacklogQuotaExceededError",
    "BadRequestError",
    "BookieStateError",
    "BookieStoppedError",
    "BookieUnavailableError",
    "ClientClosedError",
    "CorruptRecordError",
    "CursorNotFoundError",
    "DigestMismatchError",
    "DuplicateEntryIdError",
    "EndOfStreamError",
    "EntryExistsError",
    "EntryNotConfirmedError",
    "EntryTooLargeError",
    "IOBookieError",
    "JournalFailedError",
    "KeyExistsError",
    "LedgerClosedError",
    "LedgerExistsError",
    "LedgerFencedError",
    "LedgerIdOverflowError",
    "LedgerRecoveryError",
    "LockedError",
    "LogExistsError",
    "LogNotFoundError",
    "MetadataStoreError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchKeyError",
    "NoSuchLedgerError",
    "NoSuchNamespaceError",
    "NoSuchTenantError",
    "NotEmptyError",
    "NotEnoughBookiesError",
    "ProtocolError",
    "QuotaExceededError",
    "ReadOnlyBookieError",
    "RecordTooLargeError",
    "Status",
    "TimeoutError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "UnexpectedConditionError",
    "UnknownLedgerStateError",
    "WriterConflictError",
    "error_for_status",
    "fresh_copy",
    "status_of",
]
