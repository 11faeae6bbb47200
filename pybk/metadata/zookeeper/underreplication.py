"""The ZooKeeper store's under-replication marks, and the ledger-id tree they share with ledgers.

A mark is the persistent znode ``underreplication/ledgers/<two levels>/urL<id>`` holding the
JSON list of the ledger's missing bookies; marking merges into it and clearing may be
conditional, both by compare-and-set on the znode version. :func:`walk_ledger_tree` lists
either tree (the store lists its ledgers with it). :class:`~.store.ZooKeeperMetadataStore`
hands its mark calls to :class:`ZkUnderReplication`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from pybk.errors import CorruptRecordError, MetadataVersionError
from pybk.metadata._common import (
    check_bookie_id,
    check_expected_marks,
    check_ledger_id,
    merge_missing,
)
from pybk.metadata.zookeeper.bridge import KazooBridge
from pybk.metadata.zookeeper.paths import Layout, ledger_id_from

__all__ = ["ZkUnderReplication", "walk_ledger_tree"]


class ZkUnderReplication:
    """The under-replication part of the :class:`~pybk.metadata.base.MetadataStore` contract
    on one store's session (``bridge``)."""

    def __init__(self, bridge: KazooBridge, layout: Layout) -> None:
        self._bridge = bridge
        self._layout = layout

    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        check_ledger_id(ledger_id)
        for b in missing_bookies:
            check_bookie_id(b)
        path = self._layout.under_replicated(ledger_id)
        for _ in range(100):
            try:
                data, stat = await self._bridge.call(
                    "mark_under_replicated", "get", path, expect=(NoNodeError,)
                )
            except NoNodeError:
                value = json.dumps(merge_missing([], missing_bookies)).encode()
                try:
                    await self._bridge.call(
                        "mark_under_replicated", "create", path, value, makepath=True,
                        expect=(NodeExistsError, NoNodeError),
                    )
                    return
                except (NodeExistsError, NoNodeError):
                    continue
            merged = merge_missing(_parse_missing(data, ledger_id), missing_bookies)
            try:
                await self._bridge.call(
                    "mark_under_replicated", "set", path, json.dumps(merged).encode(),
                    version=stat.version, expect=(BadVersionError, NoNodeError),
                )
                return
            except (BadVersionError, NoNodeError):
                continue
        raise MetadataVersionError(f"under-replication mark of ledger {ledger_id}: too contended")

    async def list_under_replicated(self) -> dict[int, list[str]]:
        base = self._layout.p("underreplication", "ledgers")
        out: dict[int, list[str]] = {}
        for lid, path in await walk_ledger_tree(self._bridge, "list_under_replicated", base, "urL"):
            try:
                data, _ = await self._bridge.call(
                    "list_under_replicated", "get", path, expect=(NoNodeError,)
                )
            except NoNodeError:
                continue
            out[lid] = _parse_missing(data, lid)
        return out

    async def clear_under_replicated(
        self, ledger_id: int, expected: Sequence[str] | None = None
    ) -> bool:
        check_ledger_id(ledger_id)
        want = check_expected_marks(expected)
        path = self._layout.under_replicated(ledger_id)
        for _ in range(100):
            try:
                data, stat = await self._bridge.call(
                    "clear_under_replicated", "get", path, expect=(NoNodeError,))
            except NoNodeError:
                return False
            if want is not None and _parse_missing(data, ledger_id) != want:
                return False
            try:
                await self._bridge.call(
                    "clear_under_replicated", "delete", path, version=stat.version,
                    expect=(NoNodeError, BadVersionError),
                )
                return True
            except NoNodeError:
                return False
            except BadVersionError:
                continue  # widened meanwhile: compare again
        raise MetadataVersionError(f"under-replication mark of ledger {ledger_id}: too contended")


async def walk_ledger_tree(
        bridge: KazooBridge, op: str, base: str, prefix: str) -> list[tuple[int, str]]:
    """(ledger id, path) of every leaf under a two-level hierarchical tree (the ledgers' and
    the marks' layout, :func:`.paths.ledger_subpath`); ``prefix`` starts each leaf's name."""
    out: list[tuple[int, str]] = []
    for top in await bridge.children(op, base):
        mids = await bridge.children(op, f"{base}/{top}")
        leaves = await asyncio.gather(
            *(bridge.children(op, f"{base}/{top}/{m}") for m in mids))
        for mid, names in zip(mids, leaves, strict=True):
            for leaf in names:
                lid = ledger_id_from(top, mid, leaf, prefix)
                if lid is not None:
                    out.append((lid, f"{base}/{top}/{mid}/{leaf}"))
    return sorted(out)


def _parse_missing(data: bytes, ledger_id: int) -> list[str]:
    """The missing bookies a mark holds (a JSON list of ids); CorruptRecordError if not."""
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(b, str) for b in value):
        raise CorruptRecordError(f"under-replication mark of ledger {ledger_id}: not a list")
    return value
