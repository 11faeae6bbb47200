"""Failures are findings: which exceptions injected faults explain, and catching the rest.

A bug that raises instead of corrupting data is a bug all the same. So an exception in a
bookie, a client, a reader or the workload is a violation of its own kind (X1, with its
traceback in the trace) unless it is in :data:`EXPECTED`, the explicit list of outcomes the
injected faults produce. The list is by class, each with the faults that cause it; a class
that is not on it (``UnexpectedConditionError``, ``KeyError``, ``AssertionError``...) is
always a finding.

Where exceptions are caught:

* the workload's processes check each one (``Process.expected``);
* a bookie's request handler never raises (it answers IO_ERROR and logs the exception): the
  :class:`LogFindings` handler sees every record pybk logs with an exception attached;
* an exception escaping a callback, or a task's exception nobody retrieved, reaches the
  loop's exception handler (``SimLoop.unhandled``);
* a request handler that raises all the same is reported by the simulated network.
"""

from __future__ import annotations

import builtins
import logging
import traceback
from collections.abc import Callable

from pybk import errors
from pybk.sim.tier import SimTierError

__all__ = ["EXPECTED", "LogFindings", "is_expected"]

#: exceptions that injected faults explain (each line: the class, then the faults)
EXPECTED: tuple[type[BaseException], ...] = (
    # dropped messages, partitions, paused processes, slow links and fsyncs, stalled metadata
    builtins.TimeoutError,  # (pybk.TimeoutError is one; asyncio.wait_for bounds too)
    # crashed bookies, reset connections, corrupt frames
    errors.BookieUnavailableError,
    # too few writable bookies: crashes, partitions, full disks
    errors.NotEnoughBookiesError,
    # a recovery (or a new log writer) fenced the ledger under its writer
    errors.LedgerFencedError,
    # a ledger closed (by recovery) under its writer, or a handle closed by a crash
    errors.LedgerClosedError,
    # recovery could not decide (bookies unreachable, damaged): the ledger stays IN_RECOVERY
    errors.LedgerRecoveryError,
    # spurious CAS conflicts (meta_cas), and races between writers and recoveries
    errors.MetadataVersionError,
    # a ledger deleted by the deleter or by a log truncation
    errors.NoSuchLedgerError,
    errors.NoSuchEntryError,
    # full disks (enospc), failed fsyncs (fsync_eio), damaged data (bitflip, latent,
    # misdirected reads and writes)
    errors.ReadOnlyBookieError,
    errors.IOBookieError,  # (JournalFailedError is one)
    errors.CorruptRecordError,
    errors.DigestMismatchError,
    errors.UnknownLedgerStateError,
    # a crashed writer's client and metadata session
    errors.ClientClosedError,
    # a log: truncated ahead of a reader, or taken over by a newer writer while it opened
    errors.AlreadyTruncatedError,
    errors.WriterConflictError,
    # bounded resources under slow bookies
    errors.TooManyRequestsError,
    # the simulated object store's injected errors and lost answers (pybk.sim.tier)
    SimTierError,
)


def is_expected(exc: BaseException) -> bool:
    return isinstance(exc, EXPECTED)


class LogFindings(logging.Handler):
    """Collects the records pybk logs with an exception attached whose exception is not
    expected (a bookie's "unexpected error handling ...", a failed callback). Installed on
    the ``pybk`` logger for the length of a run."""

    def __init__(self, report: Callable[[str, BaseException, str], None]) -> None:
        super().__init__(logging.ERROR)
        self._report = report
        self._saved: tuple[int, bool] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if not record.exc_info or record.exc_info[1] is None:
            return
        exc = record.exc_info[1]
        if is_expected(exc):
            return
        tb = "".join(traceback.format_exception(*record.exc_info))
        self._report(record.name, exc, f"{record.getMessage()}\n{tb}")

    def install(self) -> None:
        """Attach to the ``pybk`` logger. A logger silenced above ERROR (as the sweep's
        workers do) is opened to ERROR for this handler only (its records do not propagate
        meanwhile); otherwise the logger is left as the application set it."""
        logger = logging.getLogger("pybk")
        self._saved = (logger.level, logger.propagate)
        logger.addHandler(self)
        if logger.getEffectiveLevel() > logging.ERROR:
            logger.setLevel(logging.ERROR)
            logger.propagate = False

    def remove(self) -> None:
        logger = logging.getLogger("pybk")
        logger.removeHandler(self)
        if self._saved is not None:
            logger.setLevel(self._saved[0])
            logger.propagate = self._saved[1]
            self._saved = None
