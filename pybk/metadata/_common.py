"""Small helpers every metadata backend shares: argument checks, watch handles, mark merging.

Kept apart from ``base.py`` so the interface module stays a pure contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from pybk.errors import BKError, ClientClosedError, LedgerIdOverflowError
from pybk.metadata.base import (
    MAX_KEY_LENGTH,
    MAX_VALUE_SIZE,
    STATES,
    BookieRegistration,
    Election,
    LedgerMetadata,
    Watch,
    check_group,
    check_rack,
)

if TYPE_CHECKING:
    from pybk.metadata.base import MetadataStore

__all__ = [
    "MAX_LEDGER_ID",
    "MAX_OWNER_LENGTH",
    "CallbackWatch",
    "LockElection",
    "allocatable",
    "check_bookie_id",
    "check_expected_marks",
    "check_group",
    "check_key",
    "check_ledger_id",
    "check_metadata",
    "check_owner",
    "check_prefix",
    "check_rack",
    "check_registration",
    "check_value",
    "election_lock",
    "merge_missing",
    "stamped",
]

log = logging.getLogger(__name__)

#: Longest owner label of a lock or candidate label of an election.
MAX_OWNER_LENGTH = 256

_KEY_SEGMENT = re.compile(r"[A-Za-z0-9._:-]+")


#: the largest ledger id (int64, as on the wire); created only by a caller who names it,
#: never handed out by ``allocate_ledger_id``
MAX_LEDGER_ID = (1 << 63) - 1


def check_ledger_id(ledger_id: object) -> int:
    """Ledger ids are ints in [0, 2**63 - 1]; anything else is a caller error."""
    if (isinstance(ledger_id, bool) or not isinstance(ledger_id, int) or ledger_id < 0
            or ledger_id > MAX_LEDGER_ID):
        raise ValueError(f"ledger id must be an int in [0, 2**63 - 1], got {ledger_id!r}")
    return ledger_id


def allocatable(first: int, count: int) -> range:
    """The ids of the block ``[first, first + count)`` an allocator may hand out (never
    ``MAX_LEDGER_ID``; its ``stop`` is the allocator's next first id); LedgerIdOverflowError
    when there is none left. Creating ``MAX_LEDGER_ID`` by name moves no allocator."""
    if first >= MAX_LEDGER_ID:
        raise LedgerIdOverflowError(
            f"no ledger id left to hand out (the next would be {first}); ledgers created "
            f"with an id of their own may still use any free id")
    return range(first, min(first + count, MAX_LEDGER_ID))


def stamped(metadata: LedgerMetadata, now: float) -> LedgerMetadata:
    """``metadata`` as a backend creates it: its creation time ``now`` (wall-clock seconds)
    recorded in ``ctime_ms``, unless the caller gave one."""
    if metadata.ctime_ms:
        return metadata
    return metadata.with_changes(ctime_ms=int(now * 1000))


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
    check_rack(registration.rack)
    check_group(registration.group)
    return registration


def check_owner(owner: object) -> str:
    """Owner labels of locks and candidate labels of elections: non-empty text."""
    if not isinstance(owner, str):
        raise TypeError(f"lock owner must be a str, not {type(owner).__name__}")
    if not owner or len(owner) > MAX_OWNER_LENGTH:
        raise ValueError(f"lock owner must have 1 to {MAX_OWNER_LENGTH} characters, "
                         f"got {owner[:80]!r}")
    return owner


def check_expected_marks(expected: Sequence[str] | None) -> list[str] | None:
    """The ``expected`` argument of ``clear_under_replicated``, canonical (sorted, unique)."""
    if expected is None:
        return None
    if isinstance(expected, str):
        raise TypeError("expected must be a sequence of bookie ids, not a str")
    for b in expected:
        check_bookie_id(b)
    return merge_missing([], expected)


def election_lock(name: str) -> str:
    """The lock a lock-based election of ``name`` is won by."""
    return f"elections/{check_key(name)}"


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


class LockElection(Election):
    """An election won by taking an ephemeral lock (``elections/<name>``): the memory and
    SQLite backends' election (ZooKeeper uses ephemeral-sequential nodes instead).

    The candidate tries the lock, then waits for the lock's watch (the holder released it
    or lost it) or ``retry_interval`` (a watch missed because of a store fault), and tries
    again. The leader stops leading as soon as its store says it no longer holds the lock
    (lease lapsed, session expired, store closed).
    """

    def __init__(
        self, store: MetadataStore, name: str, candidate: str, *, retry_interval: float
    ) -> None:
        check_key(name)
        check_owner(candidate)
        super().__init__(name, candidate)
        self._store = store
        self._lock = election_lock(name)
        self._retry = retry_interval
        self._wake = asyncio.Event()
        self._watch: Watch | None = None
        self._task: asyncio.Task[None] | None = None
        self._resigned = False

    async def join(self) -> None:
        if self._task is not None or self._resigned:
            return
        self._watch = self._store.watch_lock(self._lock, lambda _name: self._wake.set())
        self._task = asyncio.get_running_loop().create_task(
            self._campaign(), name=f"pybk-election-{self.name}")

    async def _campaign(self) -> None:
        store = self._store
        while not self._resigned:
            self._wake.clear()
            try:
                held = store.holds_lock(self._lock) or await store.try_lock(
                    self._lock, self.candidate)
                self._set_leader(held and store.holds_lock(self._lock) and not self._resigned)
            except ClientClosedError:
                self._set_leader(False)
                return
            except BKError as exc:  # a store fault: not leading until the lock is confirmed
                log.info("election %s: candidate %s could not campaign: %s",
                         self.name, self.candidate, exc)
                self._set_leader(False)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._retry):  # (no task per wait, as wait_for)
                    await self._wake.wait()

    async def resign(self) -> None:
        if self._resigned:
            return
        self._resigned = True
        self._set_leader(False)
        if self._watch is not None:
            self._watch.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(BKError):
            await self._store.unlock(self._lock)
