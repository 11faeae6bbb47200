"""The tables' errors, all under :class:`pybk.BKError`: one class per failure a caller can act
on (the gRPC server maps each to the response code BookKeeper's clients expect)."""

from __future__ import annotations

from pybk.errors import BKError

__all__ = [
    "NamespaceExistsError",
    "NamespaceNotFoundError",
    "RangeFencedError",
    "TableBadRequestError",
    "TableError",
    "TableExistsError",
    "TableNotFoundError",
]


class TableError(BKError):
    """A table operation failed."""


class NamespaceNotFoundError(TableError):
    """The table namespace does not exist."""


class NamespaceExistsError(TableError):
    """A table namespace of that name exists already."""


class TableNotFoundError(TableError):
    """The table does not exist (or its namespace does not)."""


class TableExistsError(TableError):
    """A table of that name exists already in the namespace."""


class TableBadRequestError(TableError, ValueError):
    """The command cannot apply to the key as it is: a put on a counter, an increment of a
    bytes value, a counter going past int64."""


class RangeFencedError(TableError):
    """Another table server took this range over; this one serves it no more."""
