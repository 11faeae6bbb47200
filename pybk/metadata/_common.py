"""Small helpers every metadata backend shares: argument checks, watch handles, mark merging.

Kept apart from ``base.py`` so the interface module stays a pure contract.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable

from pybk.metadata.base import (
    MAX_KEY_LENGTH,
    MAX_VALUE_SIZE,
    STATES,
    BookieRegistration,
    LedgerMetadata,
    Watch,
)

__all__ = [
    "CallbackWatch",
    "check_bookie_id",
    "check_key",
    "check_ledger_id",
    "check_metadata",
    "check_prefix",
    "check_registration",
    "check_value",
    "merge_missing",
]

_KEY_SEGMENT = re.compile(r"[A-Za-z0-9._:-]+")


def check_ledger_id(ledger_id: object) -> int:
    """Ledger ids are non-negative ints; anything else is a caller error."""
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or ledger_id < 0:
        raise ValueError(f"ledger id must be a non-negative int, got {ledger_id!r}")
    return ledger_id


def check_metadata(metadata: object) -> LedgerMetadata:
    """Reject metadata no backend should store (a caller bug, not a store failure)."""
    if not isinstance(metadata, LedgerMetadata):
        raise TypeError(f"expected LedgerMetadata, got {type(metadata).__name__}")
    check_ledger_id(metadata.ledger_id)
    if metadata.state not in STATES:
        raise ValueError(f"ledger {metadata.ledger_id}: unknown state {metadata.state!r}")
    if not metadata.ensembles:
        raise ValueError(f"ledger {metadata.ledger_id}: metadata has no ensemble")
    return metadata


def check_key(key: object) -> str:
    """Keys of the key/value namespace: '/'-separated segments of ``[A-Za-z0-9._:-]``, none
    empty, ``.`` or ``..`` (they become znode paths and SQLite text alike)."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"key must have 1 to {MAX_KEY_LENGTH} characters, got {key[:80]!r}")
    for seg in key.split("/"):
        if seg in (".", "..") or not _KEY_SEGMENT.fullmatch(seg):
            raise ValueError(
                f"bad key {key!r}: segments are non-empty runs of letters, digits and ._:- "
                f"(not {seg!r})"
            )
    return key


def check_prefix(prefix: object) -> str:
    """A listing prefix: ``""`` or a valid key followed by ``/``."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if prefix and (not prefix.endswith("/") or check_key(prefix[:-1]) is None):
        raise ValueError(f"bad prefix {prefix!r}: expected '' or a key path ending in '/'")
    return prefix


def check_value(key: str, value: object) -> bytes:
    """Values are bytes of at most MAX_VALUE_SIZE (checked before anything is sent)."""
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"value of {key!r} must be bytes, not {type(value).__name__}")
    data = bytes(value)
    if len(data) > MAX_VALUE_SIZE:
        raise ValueError(
            f"value of {key!r} is {len(data)} bytes, above the {MAX_VALUE_SIZE}-byte limit"
        )
    return data


def check_bookie_id(bookie_id: object) -> str:
    """Bookie ids become file names / znode names: no '/', not empty."""
    if not isinstance(bookie_id, str) or not bookie_id or "/" in bookie_id:
        raise ValueError(f"bookie id must be a non-empty str without '/', got {bookie_id!r}")
    return bookie_id


def check_registration(registration: object) -> BookieRegistration:
    if not isinstance(registration, BookieRegistration):
        raise TypeError(f"expected BookieRegistration, got {type(registration).__name__}")
    check_bookie_id(registration.bookie_id)
    return registration


def merge_missing(existing: Iterable[str], added: Iterable[str]) -> list[str]:
    """Union of two under-replication marks, sorted (deterministic, order-free)."""
    return sorted(dict.fromkeys([*existing, *added]))


class CallbackWatch(Watch):
    """A watch handle that delivers callbacks on one event loop and can be cancelled.

    ``fire()`` may be called from any thread when ``threadsafe`` is set (ZooKeeper's kazoo
    threads); otherwise it must be called on the loop (memory/SQLite backends).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        callback: Callable[[], None],
        on_cancel: Callable[[CallbackWatch], None] | None = None,
        *,
        threadsafe: bool = False,
    ) -> None:
        self._loop = loop
        self._callback = callback
        self._on_cancel = on_cancel
        self._threadsafe = threadsafe
        self.cancelled = False

    def fire(self) -> None:
        """Schedule one callback on the loop (never calls it synchronously)."""
        if self.cancelled or self._loop.is_closed():
            return
        if self._threadsafe:
            self._loop.call_soon_threadsafe(self._deliver)
        else:
            self._loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        if not self.cancelled:
            self._callback()

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        if self._on_cancel is not None:
            self._on_cancel(self)
