"""In-process metadata store: asyncio only, no threads, so the simulator can run it; its one
clock (``clock``, the wall clock by default) stamps a new ledger's creation time.

Several :class:`MemoryMetadataStore` objects may share one state (``store.session()``): each
is one *session*, like one ZooKeeper client. A bookie registration belongs to the session
that made it and lives until ``unregister_bookie``, ``close()`` or ``expire_session()`` —
the in-memory stand-in for "the bookie stopped heartbeating / its session expired".

Ledger metadata is kept serialized (``LedgerMetadata.to_bytes``): every read parses and
checks it as the durable backends do (:meth:`MemoryMetadataStore.corrupt_ledger` damages it).

Fault hooks for the simulator: ``before_op(op, key)`` is awaited before every operation; it
may sleep (stall the store) or raise (e.g. ``MetadataStoreError``) to fail the operation
before it takes effect. ``after_op(op, key)`` is awaited after a ledger mutation
(``create_ledger``, ``write_ledger``, ``delete_ledger``) took effect; raising there models
a write whose reply was lost (the caller sees an error, the store has the change), the
"outcome unknown" case of a real ZooKeeper. Every operation also yields to the loop once,
so concurrent read-modify-write loops really interleave.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from pybk.errors import (
    ClientClosedError,
    KeyExistsError,
    LedgerExistsError,
    MetadataVersionError,
    NoSuchKeyError,
    NoSuchLedgerError,
)
from pybk.metadata._common import (
    MAX_LEDGER_ID,
    CallbackWatch,
    LockElection,
    allocatable,
    check_bookie_id,
    check_expected_marks,
    check_key,
    check_ledger_id,
    check_metadata,
    check_owner,
    check_prefix,
    check_registration,
    check_value,
    election_lock,
    merge_missing,
    stamped,
)
from pybk.metadata.base import (
    BookieRegistration,
    Election,
    LedgerMetadata,
    MetadataStore,
    VersionedValue,
    Watch,
)
from pybk.metadata.memory_state import MemoryState
from pybk.metadata.memory_watches import UNKNOWN, PolledDelivery, WatchPoller
from pybk.runtime.eventloop import yield_now

__all__ = [
    "BeforeOp",
    "MemoryMetadataStore",
]

#: ``before_op(op_name, key)``: awaited before each operation (simulator fault injection).
BeforeOp = Callable[[str, object], Awaitable[None]]


class MemoryMetadataStore(MetadataStore):
    """A :class:`MetadataStore` held in this process's memory (``memory://``)."""

    def __init__(
        self,
        *,
        before_op: BeforeOp | None = None,
        after_op: BeforeOp | None = None,
        clock: Callable[[], float] | None = None,
        watch_delivery: PolledDelivery | None = None,
        _state: MemoryState | None = None,
    ):
        self._state = _state if _state is not None else MemoryState()
        #: wall-clock seconds, stamped on a ledger it creates (the simulator gives its own)
        self.clock: Callable[[], float] = clock if clock is not None else time.time
        if watch_delivery is not None:
            self._state.poller = WatchPoller(watch_delivery)
        self._session_id = next(self._state.session_ids)
        self._closed = False
        self._my_watches: list[CallbackWatch] = []
        self.before_op: BeforeOp | None = before_op
        self.after_op: BeforeOp | None = after_op
        #: seconds between a candidate's retries when a lock watch was missed (store faults)
        self.election_retry = 1.0
        # what this session last returned to a caller, per subject (the watch guarantee:
        # a watch set later fires at once when the subject changed since)
        self._returned_ledgers: dict[int, int | None] = {}
        self._returned_values: dict[str, int | None] = {}
        self._returned_locks: dict[str, int] = {}
        self._returned_bookies: int | None = None

    # -- sessions ----------------------------------------------------------------------------

    def session(self) -> MemoryMetadataStore:
        """Another client of the same store, with its own session (and the same fault hooks
        and clock)."""
        return MemoryMetadataStore(
            before_op=self.before_op, after_op=self.after_op, clock=self.clock,
            _state=self._state,
        )

    @property
    def polled(self) -> bool:
        """Whether watches poll (a :class:`PolledDelivery` was given) instead of firing at
        once."""
        return self._state.poller is not None

    @property
    def session_id(self) -> int:
        return self._session_id

    def expire_session(self) -> list[str]:
        """End this session as if its owner died: its registrations vanish (watchers are told).

        The store stays usable under a fresh session; whoever owns it must register again,
        as a restarted bookie would. Returns the bookie ids that were dropped.
        """
        dropped = self._drop_registrations()
        self._session_id = next(self._state.session_ids)
        return dropped

    def _drop_registrations(self) -> list[str]:
        st = self._state
        dropped = [b for b, (_, owner) in st.bookies.items() if owner == self._session_id]
        for b in dropped:
            del st.bookies[b]
        if dropped:
            st.bookies_changed()
        for name in [n for n, (_, owner) in st.locks.items() if owner == self._session_id]:
            del st.locks[name]
            st.lock_changed(name)
        return sorted(dropped)

    # -- test hooks --------------------------------------------------------------------------

    def corrupt_ledger(self, ledger_id: int, data: bytes) -> None:
        """Replace a ledger's stored bytes (tests: readers must raise CorruptRecordError)."""
        _, version = self._state.ledgers[ledger_id]
        self._state.ledgers[ledger_id] = (bytes(data), version)

    def raw_ledger(self, ledger_id: int) -> bytes:
        """The stored bytes of a ledger's metadata."""
        return self._state.ledgers[ledger_id][0]

    def peek_ledger(self, ledger_id: int) -> LedgerMetadata:
        """A ledger's metadata as stored now, without yielding to the loop nor the store's
        hooks (tests, the simulator's probes); KeyError when there is none, and
        CorruptRecordError when its bytes do not parse."""
        data, version = self._state.ledgers[ledger_id]
        return self._parse(ledger_id, data, version)

    def _parse(self, ledger_id: int, data: bytes, version: int) -> LedgerMetadata:
        cached = self._state.parsed.get(ledger_id)
        if cached is not None and cached[0] is data and cached[1] == version:
            return cached[2]
        md = LedgerMetadata.from_bytes(data, version)
        self._state.parsed[ledger_id] = (data, version, md)
        return md

    def _check(self) -> None:
        """Assert internal invariants (sortedcontainers habit)."""
        st = self._state
        for lid, (_, version) in st.ledgers.items():
            assert lid >= 0 and 0 < version <= st.next_version
        for b, (reg, _) in st.bookies.items():
            assert reg.bookie_id == b
        for marks in st.under_replicated.values():
            assert marks == sorted(set(marks))
        for name in st.locks:
            assert check_key(name) == name
        for key, (_, version) in st.values.items():
            assert check_key(key) == key and 0 < version <= st.next_version

    # -- plumbing ----------------------------------------------------------------------------

    async def _enter(self, op: str, key: object = None) -> None:
        if self._closed:
            raise ClientClosedError(f"memory metadata store is closed (operation {op})")
        await yield_now
        if self.before_op is not None:
            await self.before_op(op, key)
        if self._closed:
            raise ClientClosedError(f"memory metadata store is closed (operation {op})")

    async def _applied(self, op: str, key: object) -> None:
        if self.after_op is not None:
            await self.after_op(op, key)

    # -- ledgers -----------------------------------------------------------------------------

    async def allocate_ledger_id(self) -> int:
        await self._enter("allocate_ledger_id")
        st = self._state
        while st.next_id in st.ledgers and st.next_id < MAX_LEDGER_ID:
            st.next_id += 1
        lid = allocatable(st.next_id, 1)[0]
        st.next_id += 1
        return lid

    async def create_ledger(self, metadata: LedgerMetadata) -> LedgerMetadata:
        check_metadata(metadata)
        metadata = stamped(metadata, self.clock())
        data = metadata.to_bytes()
        await self._enter("create_ledger", metadata.ledger_id)
        st = self._state
        if metadata.ledger_id in st.ledgers:
            raise LedgerExistsError(f"ledger {metadata.ledger_id} already exists")
        version = st.bump_version()
        st.ledgers[metadata.ledger_id] = (data, version)
        if metadata.ledger_id < MAX_LEDGER_ID:
            st.next_id = max(st.next_id, metadata.ledger_id + 1)
        self._returned_ledgers[metadata.ledger_id] = version
        await self._applied("create_ledger", metadata.ledger_id)
        return metadata.with_changes(version=version)

    async def read_ledger(self, ledger_id: int) -> LedgerMetadata:
        check_ledger_id(ledger_id)
        await self._enter("read_ledger", ledger_id)
        try:
            data, version = self._state.ledgers[ledger_id]
        except KeyError:
            self._returned_ledgers[ledger_id] = None
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        self._returned_ledgers[ledger_id] = version
        return self._parse(ledger_id, data, version)

    async def write_ledger(self, metadata: LedgerMetadata, expected_version: int) -> LedgerMetadata:
        check_metadata(metadata)
        data = metadata.to_bytes()
        lid = metadata.ledger_id
        await self._enter("write_ledger", lid)
        st = self._state
        try:
            _, current = st.ledgers[lid]
        except KeyError:
            raise NoSuchLedgerError(f"ledger {lid} does not exist") from None
        if current != expected_version:
            raise MetadataVersionError(
                f"ledger {lid}: version {expected_version} is stale (store has {current})"
            )
        version = st.bump_version()
        st.ledgers[lid] = (data, version)
        self._returned_ledgers[lid] = version
        st.ledger_changed(lid)
        await self._applied("write_ledger", lid)
        return metadata.with_changes(version=version)

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        check_ledger_id(ledger_id)
        await self._enter("delete_ledger", ledger_id)
        st = self._state
        try:
            _, current = st.ledgers[ledger_id]
        except KeyError:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
        if expected_version is not None and current != expected_version:
            raise MetadataVersionError(
                f"ledger {ledger_id}: version {expected_version} is stale (store has {current})"
            )
        del st.ledgers[ledger_id]
        st.parsed.pop(ledger_id, None)
        self._returned_ledgers[ledger_id] = None
        st.ledger_changed(ledger_id)
        await self._applied("delete_ledger", ledger_id)

    async def list_ledgers(self) -> list[int]:
        await self._enter("list_ledgers")
        return sorted(self._state.ledgers)

    # -- bookies -----------------------------------------------------------------------------

    async def register_bookie(self, registration: BookieRegistration) -> None:
        check_registration(registration)
        await self._enter("register_bookie", registration.bookie_id)
        st = self._state
        before = st.bookies.get(registration.bookie_id)
        st.bookies[registration.bookie_id] = (registration, self._session_id)
        if before is None or before[0] != registration:
            st.bookies_changed()

    async def unregister_bookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        await self._enter("unregister_bookie", bookie_id)
        if self._state.bookies.pop(bookie_id, None) is not None:
            self._state.bookies_changed()

    async def list_bookies(self) -> list[BookieRegistration]:
        await self._enter("list_bookies")
        self._returned_bookies = self._state.bookies_version
        return [reg for _, (reg, _) in sorted(self._state.bookies.items())]

    # -- watches -----------------------------------------------------------------------------

    def watch_ledger(self, ledger_id: int, callback: Callable[[int], None]) -> Watch:
        check_ledger_id(ledger_id)
        watches = self._state.ledger_watches

        def forget(w: CallbackWatch) -> None:
            lst = watches.get(ledger_id, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                watches.pop(ledger_id, None)
            if w in self._my_watches:
                self._my_watches.remove(w)

        w = CallbackWatch(asyncio.get_running_loop(), lambda: callback(ledger_id), forget)
        watches.setdefault(ledger_id, []).append(w)
        self._my_watches.append(w)
        st = self._state

        def version() -> int | None:
            now = st.ledgers.get(ledger_id)
            return None if now is None else now[1]

        returned = self._returned_ledgers.get(ledger_id, UNKNOWN)
        if st.poller is not None:
            st.poller.add(w, version, returned)
        elif returned is not UNKNOWN and returned != version():
            w.fire()  # changed since this session last returned it
        return w

    def watch_bookies(self, callback: Callable[[], None]) -> Watch:
        watches = self._state.bookie_watches

        def forget(w: CallbackWatch) -> None:
            if w in watches:
                watches.remove(w)
            if w in self._my_watches:
                self._my_watches.remove(w)

        w = CallbackWatch(asyncio.get_running_loop(), callback, forget)
        watches.append(w)
        self._my_watches.append(w)
        st = self._state
        if st.poller is not None:
            st.poller.add(w, lambda: st.bookies_version,
                          UNKNOWN if self._returned_bookies is None else self._returned_bookies)
        elif self._returned_bookies not in (None, st.bookies_version):
            w.fire()
        return w

    async def sync_watches(self) -> bool:
        """Return once every change made before the call has been delivered to this
        session's watches. Fired at once: the fires already scheduled run first (False:
        every watch was established when set). Polled: a poll after the call compares every
        watch of this session (bounded by its establishment delay and 100 polls); True when
        one had never been compared before."""
        st = self._state
        if st.poller is None or self._closed:
            await yield_now  # (a fire is delivered on the loop's next turn)
            return False
        d = st.poller.delivery
        bound = max(1.0, d.establish_delay + 100 * d.poll_interval)
        return await st.poller.settle(self._my_watches, bound)

    # -- under-replication marks ---------------------------------------------------------------

    async def mark_under_replicated(self, ledger_id: int, missing_bookies: list[str]) -> None:
        check_ledger_id(ledger_id)
        for b in missing_bookies:
            check_bookie_id(b)
        await self._enter("mark_under_replicated", ledger_id)
        marks = self._state.under_replicated
        marks[ledger_id] = merge_missing(marks.get(ledger_id, ()), missing_bookies)

    async def list_under_replicated(self) -> dict[int, list[str]]:
        await self._enter("list_under_replicated")
        return {k: list(v) for k, v in sorted(self._state.under_replicated.items())}

    async def clear_under_replicated(
        self, ledger_id: int, expected: Sequence[str] | None = None
    ) -> bool:
        check_ledger_id(ledger_id)
        want = check_expected_marks(expected)
        await self._enter("clear_under_replicated", ledger_id)
        marks = self._state.under_replicated
        if ledger_id not in marks or (want is not None and marks[ledger_id] != want):
            return False
        del marks[ledger_id]
        return True

    # -- locks and elections -------------------------------------------------------------------

    async def try_lock(self, name: str, owner: str) -> bool:
        check_key(name)
        check_owner(owner)
        await self._enter("try_lock", name)
        st = self._state
        held = st.locks.get(name)
        if held is None:
            st.locks[name] = (owner, self._session_id)
            st.lock_changed(name)
        self._returned_locks[name] = st.lock_versions.get(name, 0)
        return held is None or held[1] == self._session_id

    async def unlock(self, name: str) -> None:
        check_key(name)
        await self._enter("unlock", name)
        st = self._state
        held = st.locks.get(name)
        if held is not None and held[1] == self._session_id:
            del st.locks[name]
            st.lock_changed(name)
            self._returned_locks[name] = st.lock_versions[name]

    async def lock_owner(self, name: str) -> str | None:
        check_key(name)
        await self._enter("lock_owner", name)
        held = self._state.locks.get(name)
        self._returned_locks[name] = self._state.lock_versions.get(name, 0)
        return None if held is None else held[0]

    async def list_locks(self, prefix: str = "") -> dict[str, str]:
        check_prefix(prefix)
        await self._enter("list_locks", prefix)
        return {n: o for n, (o, _) in sorted(self._state.locks.items()) if n.startswith(prefix)}

    def holds_lock(self, name: str) -> bool:
        held = self._state.locks.get(name)
        return not self._closed and held is not None and held[1] == self._session_id

    def watch_lock(self, name: str, callback: Callable[[str], None]) -> Watch:
        check_key(name)
        watches = self._state.lock_watches

        def forget(w: CallbackWatch) -> None:
            lst = watches.get(name, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                watches.pop(name, None)
            if w in self._my_watches:
                self._my_watches.remove(w)

        w = CallbackWatch(asyncio.get_running_loop(), lambda: callback(name), forget)
        watches.setdefault(name, []).append(w)
        self._my_watches.append(w)
        st = self._state
        seen = self._returned_locks.get(name)
        if st.poller is not None:
            st.poller.add(w, lambda: st.lock_versions.get(name, 0),
                          UNKNOWN if seen is None else seen)
        elif seen is not None and seen != st.lock_versions.get(name, 0):
            w.fire()
        return w

    def election(self, name: str, candidate: str) -> Election:
        return LockElection(self, name, candidate, retry_interval=self.election_retry)

    async def election_leader(self, name: str) -> str | None:
        return await self.lock_owner(election_lock(name))

    # -- cookies -------------------------------------------------------------------------------

    async def read_cookie(self, bookie_id: str) -> bytes | None:
        check_bookie_id(bookie_id)
        await self._enter("read_cookie", bookie_id)
        return self._state.cookies.get(bookie_id)

    async def write_cookie(self, bookie_id: str, cookie: bytes) -> None:
        check_bookie_id(bookie_id)
        if not isinstance(cookie, bytes | bytearray):
            raise TypeError(f"cookie must be bytes, got {type(cookie).__name__}")
        await self._enter("write_cookie", bookie_id)
        self._state.cookies[bookie_id] = bytes(cookie)

    async def delete_cookie(self, bookie_id: str) -> None:
        check_bookie_id(bookie_id)
        await self._enter("delete_cookie", bookie_id)
        self._state.cookies.pop(bookie_id, None)

    # -- key/value namespace -------------------------------------------------------------------

    async def create_value(self, key: str, value: bytes) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        await self._enter("create_value", key)
        st = self._state
        if key in st.values:
            raise KeyExistsError(f"key {key!r} already exists")
        version = st.bump_version()
        st.values[key] = (data, version)
        self._returned_values[key] = version
        st.value_changed(key)
        await self._applied("create_value", key)
        return VersionedValue(key, data, version)

    async def read_value(self, key: str) -> VersionedValue:
        check_key(key)
        await self._enter("read_value", key)
        try:
            data, version = self._state.values[key]
        except KeyError:
            self._returned_values[key] = None
            raise NoSuchKeyError(f"key {key!r} does not exist") from None
        self._returned_values[key] = version
        return VersionedValue(key, data, version)

    async def write_value(
        self, key: str, value: bytes, expected_version: int
    ) -> VersionedValue:
        check_key(key)
        data = check_value(key, value)
        await self._enter("write_value", key)
        st = self._state
        try:
            _, current = st.values[key]
        except KeyError:
            raise NoSuchKeyError(f"key {key!r} does not exist") from None
        if current != expected_version:
            raise MetadataVersionError(
                f"key {key!r}: version {expected_version} is stale (store has {current})"
            )
        version = st.bump_version()
        st.values[key] = (data, version)
        self._returned_values[key] = version
        st.value_changed(key)
        await self._applied("write_value", key)
        return VersionedValue(key, data, version)

    async def delete_value(self, key: str, expected_version: int | None = None) -> None:
        check_key(key)
        await self._enter("delete_value", key)
        st = self._state
        try:
            _, current = st.values[key]
        except KeyError:
            raise NoSuchKeyError(f"key {key!r} does not exist") from None
        if expected_version is not None and current != expected_version:
            raise MetadataVersionError(
                f"key {key!r}: version {expected_version} is stale (store has {current})"
            )
        del st.values[key]
        self._returned_values[key] = None
        st.value_changed(key)
        await self._applied("delete_value", key)

    async def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        await self._enter("list_keys", prefix)
        return sorted(k for k in self._state.values if k.startswith(prefix))

    def watch_value(self, key: str, callback: Callable[[str], None]) -> Watch:
        check_key(key)
        watches = self._state.value_watches

        def forget(w: CallbackWatch) -> None:
            lst = watches.get(key, [])
            if w in lst:
                lst.remove(w)
            if not lst:
                watches.pop(key, None)
            if w in self._my_watches:
                self._my_watches.remove(w)

        w = CallbackWatch(asyncio.get_running_loop(), lambda: callback(key), forget)
        watches.setdefault(key, []).append(w)
        self._my_watches.append(w)
        st = self._state

        def version() -> int | None:
            now = st.values.get(key)
            return None if now is None else now[1]

        returned = self._returned_values.get(key, UNKNOWN)
        if st.poller is not None:
            st.poller.add(w, version, returned)
        elif returned is not UNKNOWN and returned != version():
            w.fire()
        return w

    # -- lifecycle -----------------------------------------------------------------------------

    async def close(self) -> None:
        """End this session: its registrations and watches go away. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._drop_registrations()
        for w in list(self._my_watches):
            w.cancel()
