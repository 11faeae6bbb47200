"""Key/value tables kept on pybk logs (BookKeeper's table service): per range an MVCC store
whose commands go to the range's log first, checkpoints in pybk, recovery from the newest
checkpoint plus replay; the Python API here and a gRPC server speaking BookKeeper's
table-service protocol in :mod:`pybk.tables.grpc` (the ``tables`` extra). docs/tables.md.
"""

from pybk.tables.api import AsyncTable, AsyncTables, Table, Tables
from pybk.tables.engine import TablesEngine
from pybk.tables.errors import (
    NamespaceExistsError,
    NamespaceNotFoundError,
    RangeFencedError,
    TableBadRequestError,
    TableError,
    TableExistsError,
    TableNotFoundError,
)
from pybk.tables.mvcc import KeyValue

__all__ = [
    "AsyncTable", "AsyncTables", "KeyValue", "NamespaceExistsError", "NamespaceNotFoundError",
    "RangeFencedError", "Table", "TableBadRequestError", "TableError", "TableExistsError",
    "TableNotFoundError", "Tables", "TablesEngine",
]
