"""A namespace's usage counters (its ledger count), kept race-safely in the metadata store.

``tenancy/usage/<tenant>/<namespace>`` holds a JSON object (``{"ledgers": n}``; other
counters may sit beside it and are kept). Every change is a compare-and-set, so concurrent
creators on any number of clients can never take the count past
``NamespacePolicies.max_ledgers``: :func:`reserve_ledger` increments before a ledger is
created (QuotaExceededError when the namespace is full) and :func:`release_ledger`
decrements when one is deleted, or when a creation that reserved fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from pybk.errors import KeyExistsError, NoSuchKeyError, QuotaExceededError
from pybk.metadata.base import MetadataStore, VersionedValue
from pybk.metadata.tenancy import split_namespace

__all__ = ["USAGE_PREFIX", "NamespaceUsage", "namespace_usage", "release_ledger",
           "reserve_ledger", "usage_key"]

USAGE_PREFIX: Final = "tenancy/usage/"


@dataclass(frozen=True)
class NamespaceUsage:
    """What a namespace uses now (as counted at creation and deletion)."""

    ledgers: int = 0


def usage_key(namespace: str) -> str:
    tenant, ns = split_namespace(namespace)
    return f"{USAGE_PREFIX}{tenant}/{ns}"


def _doc(value: VersionedValue) -> dict[str, Any]:
    doc = json.loads(value.value)
    if not isinstance(doc, dict):
        raise ValueError(f"{value.key}: usage record is not a JSON object")
    return doc


async def namespace_usage(store: MetadataStore, namespace: str) -> NamespaceUsage:
    try:
        doc = _doc(await store.read_value(usage_key(namespace)))
    except NoSuchKeyError:
        return NamespaceUsage()
    return NamespaceUsage(ledgers=int(doc.get("ledgers", 0)))


async def reserve_ledger(store: MetadataStore, namespace: str, limit: int | None) -> int:
    """Count one more ledger in ``namespace`` (QuotaExceededError when ``limit`` ledgers
    are there already); returns the new count."""
    key = usage_key(namespace)

    def bump(current: VersionedValue) -> bytes:
        doc = _doc(current)
        have = int(doc.get("ledgers", 0))
        if limit is not None and have >= limit:
            raise QuotaExceededError(
                f"namespace {namespace!r} has {have} ledgers, its quota is {limit} "
                "(max_ledgers)")
        return json.dumps({**doc, "ledgers": have + 1}).encode()

    while True:
        try:
            return int(_doc(await store.update_value(key, bump))["ledgers"])
        except NoSuchKeyError:
            if limit is not None and limit < 1:
                raise QuotaExceededError(
                    f"namespace {namespace!r}: quota of {limit} ledgers") from None
            try:
                await store.create_value(key, json.dumps({"ledgers": 1}).encode())
                return 1
            except KeyExistsError:
                continue  # another creator made it first: count on top of theirs


async def release_ledger(store: MetadataStore, namespace: str) -> None:
    """Count one ledger fewer in ``namespace`` (never below zero)."""

    def drop(current: VersionedValue) -> bytes | None:
        doc = _doc(current)
        have = int(doc.get("ledgers", 0))
        if have <= 0:
            return None
        return json.dumps({**doc, "ledgers": have - 1}).encode()

    try:
        await store.update_value(usage_key(namespace), drop)
    except NoSuchKeyError:
        pass
