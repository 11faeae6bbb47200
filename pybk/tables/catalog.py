"""Table namespaces and tables: their records in the metadata store's key/value namespace.

``tables/ns/<namespace>`` and ``tables/t/<namespace>/<table>`` hold JSON records; ids come
from the counters in ``tables/ids`` (namespaces from 0, tables from 1024, as BookKeeper numbers
them) and ``tables/id/<table id>`` names the table of an id (the gRPC protocol routes by
id). Every change is a create or a compare-and-set, so servers sharing a store agree.
``extra`` is opaque to the tables (the gRPC server keeps BookKeeper's configuration messages
there, so a read gives back exactly what a create stored).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pybk.errors import KeyExistsError, NoSuchKeyError
from pybk.metadata.base import MetadataStore, VersionedValue
from pybk.tables.errors import (
    NamespaceExistsError,
    NamespaceNotFoundError,
    TableExistsError,
    TableNotFoundError,
)
from pybk.tables.hashing import RangeSpec, split_ranges

__all__ = ["NamespaceInfo", "TableCatalog", "TableInfo", "check_table_name"]

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,127}")
_ROOT = "tables"
FIRST_TABLE_ID = 1024


def check_table_name(kind: str, name: object) -> str:
    """Namespace and table names: 1-128 letters, digits, ``_`` and ``-`` (not first)."""
    if not isinstance(name, str):
        raise TypeError(f"a {kind} name is a str, not {type(name).__name__}")
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad {kind} name {name!r}: 1-128 letters, digits, _ and - "
                         "(not starting with -)")
    return name


@dataclass(frozen=True)
class NamespaceInfo:
    namespace_id: int
    name: str
    extra: str = ""


@dataclass(frozen=True)
class TableInfo:
    table_id: int
    namespace: str
    name: str
    num_ranges: int
    extra: str = ""
    ranges: list[RangeSpec] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.ranges:
            self.ranges.extend(split_ranges(self.num_ranges))


def _enc(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()


class TableCatalog:
    """Namespaces and tables in one metadata store."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._by_id: dict[int, TableInfo] = {}

    async def _next_id(self, kind: str, first: int) -> int:
        key = f"{_ROOT}/ids"
        try:
            await self._store.create_value(key, _enc({"ns": 0, "table": FIRST_TABLE_ID}))
        except KeyExistsError:
            pass
        taken: list[int] = []

        def bump(cur: VersionedValue) -> bytes:
            doc = json.loads(cur.value)
            taken[:] = [doc.get(kind, first)]
            doc[kind] = taken[0] + 1
            return _enc(doc)

        await self._store.update_value(key, bump)
        return taken[0]

    # -- namespaces --------------------------------------------------------------------------

    async def create_namespace(self, name: str, extra: str = "") -> NamespaceInfo:
        check_table_name("namespace", name)
        try:
            await self._store.read_value(f"{_ROOT}/ns/{name}")
            raise NamespaceExistsError(f"namespace {name!r} exists")
        except NoSuchKeyError:
            pass
        info = NamespaceInfo(await self._next_id("ns", 0), name, extra)
        try:
            await self._store.create_value(f"{_ROOT}/ns/{name}", _enc(
                {"id": info.namespace_id, "name": name, "extra": extra}))
        except KeyExistsError:
            raise NamespaceExistsError(f"namespace {name!r} exists") from None
        return info

    async def get_namespace(self, name: str) -> NamespaceInfo:
        check_table_name("namespace", name)
        try:
            doc = json.loads((await self._store.read_value(f"{_ROOT}/ns/{name}")).value)
        except NoSuchKeyError:
            raise NamespaceNotFoundError(f"no namespace {name!r}") from None
        return NamespaceInfo(doc["id"], doc["name"], doc.get("extra", ""))

    async def list_namespaces(self) -> list[str]:
        prefix = f"{_ROOT}/ns/"
        return [k[len(prefix):] for k in await self._store.list_keys(prefix)]

    async def delete_namespace(self, name: str) -> None:
        """Remove a namespace record (its tables must be deleted first: the caller does)."""
        check_table_name("namespace", name)
        try:
            await self._store.delete_value(f"{_ROOT}/ns/{name}")
        except NoSuchKeyError:
            raise NamespaceNotFoundError(f"no namespace {name!r}") from None

    # -- tables ------------------------------------------------------------------------------

    async def create_table(self, namespace: str, name: str, num_ranges: int,
                           extra: str = "") -> TableInfo:
        check_table_name("table", name)
        split_ranges(num_ranges)  # checks the count
        await self.get_namespace(namespace)
        key = f"{_ROOT}/t/{namespace}/{name}"
        try:
            await self._store.read_value(key)
            raise TableExistsError(f"table {namespace}/{name} exists")
        except NoSuchKeyError:
            pass
        info = TableInfo(await self._next_id("table", FIRST_TABLE_ID), namespace, name,
                         num_ranges, extra)
        try:
            await self._store.create_value(key, _enc(
                {"id": info.table_id, "ranges": num_ranges, "extra": extra}))
        except KeyExistsError:
            raise TableExistsError(f"table {namespace}/{name} exists") from None
        await self._store.create_value(f"{_ROOT}/id/{info.table_id}",
                                       f"{namespace}/{name}".encode())
        return info

    async def get_table(self, namespace: str, name: str) -> TableInfo:
        check_table_name("namespace", namespace)
        check_table_name("table", name)
        try:
            doc = json.loads((await self._store.read_value(f"{_ROOT}/t/{namespace}/{name}")).value)
        except NoSuchKeyError:
            await self.get_namespace(namespace)
            raise TableNotFoundError(f"no table {namespace}/{name}") from None
        info = TableInfo(doc["id"], namespace, name, doc["ranges"], doc.get("extra", ""))
        self._by_id[info.table_id] = info
        return info

    async def table_by_id(self, table_id: int) -> TableInfo:
        cached = self._by_id.get(table_id)
        if cached is not None:
            return cached
        try:
            where = (await self._store.read_value(f"{_ROOT}/id/{table_id}")).value.decode()
        except NoSuchKeyError:
            raise TableNotFoundError(f"no table with id {table_id}") from None
        namespace, name = where.split("/", 1)
        return await self.get_table(namespace, name)

    async def list_tables(self, namespace: str) -> list[str]:
        await self.get_namespace(namespace)
        prefix = f"{_ROOT}/t/{namespace}/"
        return [k[len(prefix):] for k in await self._store.list_keys(prefix)]

    async def delete_table(self, namespace: str, name: str) -> TableInfo:
        info = await self.get_table(namespace, name)
        try:
            await self._store.delete_value(f"{_ROOT}/t/{namespace}/{name}")
        except NoSuchKeyError:
            raise TableNotFoundError(f"no table {namespace}/{name}") from None
        try:
            await self._store.delete_value(f"{_ROOT}/id/{info.table_id}")
        except NoSuchKeyError:
            pass
        self._by_id.pop(info.table_id, None)
        return info
