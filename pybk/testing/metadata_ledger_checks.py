"""Ledger metadata on a metadata backend (part of :data:`pybk.testing.metadata_conformance.CHECKS`):
create and read back (every field, the creation time), CAS conflicts, the update loop under
concurrent updaters, deletion and listing, unique ids under concurrency, corrupt stored bytes
and bad arguments. A topic of its own: the ledger records are what every client relies on.
"""

from __future__ import annotations

import asyncio
import time

from pybk.errors import (
    CorruptRecordError,
    LedgerExistsError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from pybk.metadata.base import CLOSED, IN_RECOVERY, BookieRegistration, MetadataStore
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.metadata_helpers import same_metadata, sample_metadata

__all__ = [
    "check_bad_arguments_are_value_errors",
    "check_cas_conflict",
    "check_corrupt_metadata_is_an_error",
    "check_create_read_round_trip",
    "check_create_records_the_creation_time",
    "check_delete_and_list",
    "check_id_allocation_unique_under_concurrency",
    "check_the_largest_ledger_id",
    "check_update_loop_under_concurrent_updaters",
]


async def check_create_read_round_trip(backend: MetadataBackend) -> None:
    store = await backend.open()
    lid = await store.allocate_ledger_id()
    md = sample_metadata(lid)
    created = await store.create_ledger(md)
    assert created.version >= 0, created.version
    read = await store.read_ledger(lid)
    assert same_metadata(read, md), (read, md)
    assert read.version == created.version
    other = await backend.open()
    assert same_metadata(await other.read_ledger(lid), md)
    try:
        await other.create_ledger(sample_metadata(lid, length=5))
    except LedgerExistsError:
        pass
    else:
        raise AssertionError("creating an existing ledger did not raise LedgerExistsError")
    assert (await store.read_ledger(lid)).length == 0
    try:
        await store.read_ledger(lid + 1_000_000)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("reading a missing ledger did not raise NoSuchLedgerError")


async def check_create_records_the_creation_time(backend: MetadataBackend) -> None:
    """A ledger created without a creation time gets the store's wall clock at creation (a
    given one is kept: :func:`check_create_read_round_trip`)."""
    store = await backend.open()
    lid = await store.allocate_ledger_id()
    before = int(time.time() * 1000)
    created = await store.create_ledger(sample_metadata(lid, ctime_ms=0))
    after = int(time.time() * 1000)
    assert before - 1000 <= created.ctime_ms <= after + 1000, (before, created.ctime_ms, after)
    assert (await store.read_ledger(lid)).ctime_ms == created.ctime_ms
    updated = await store.update_ledger(lid, lambda md: md.with_changes(length=7))
    assert updated.ctime_ms == created.ctime_ms  # (an update keeps it)


async def check_cas_conflict(backend: MetadataBackend) -> None:
    a, b = await backend.open(), await backend.open()
    lid = await a.allocate_ledger_id()
    v0 = await a.create_ledger(sample_metadata(lid))
    v1 = await b.write_ledger(v0.with_changes(state=IN_RECOVERY), v0.version)
    assert v1.version != v0.version
    try:
        await a.write_ledger(v0.with_changes(state=CLOSED, last_entry_id=9), v0.version)
    except MetadataVersionError:
        pass
    else:
        raise AssertionError("a CAS with a stale version did not raise MetadataVersionError")
    for never_stored in (-1, -7):  # "never stored" is never the current version
        try:
            await a.write_ledger(v0.with_changes(length=3), never_stored)
        except MetadataVersionError:
            pass
        else:
            raise AssertionError(f"a CAS with version {never_stored} was accepted")
        try:
            await a.delete_ledger(lid, expected_version=never_stored)
        except MetadataVersionError:
            pass
        else:
            raise AssertionError(f"a delete with version {never_stored} was accepted")
    now = await a.read_ledger(lid)
    assert now.state == IN_RECOVERY and now.version == v1.version, now
    v2 = await a.write_ledger(now.with_changes(state=CLOSED, last_entry_id=9), now.version)
    assert (await b.read_ledger(lid)).version == v2.version
    try:
        await a.write_ledger(sample_metadata(lid + 1_000_000), 0)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("a CAS on a missing ledger did not raise NoSuchLedgerError")


async def check_update_loop_under_concurrent_updaters(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    lid = await stores[0].allocate_ledger_id()
    await stores[0].create_ledger(sample_metadata(lid))
    per_store, updaters = 5, 4

    async def bump(store: MetadataStore, amount: int) -> None:
        for _ in range(per_store):
            await store.update_ledger(lid, lambda m: m.with_changes(length=m.length + amount))

    await asyncio.gather(*(bump(s, i + 1) for s in stores for i in range(updaters)))
    final = await stores[1].read_ledger(lid)
    expected = len(stores) * per_store * sum(range(1, updaters + 1))
    assert final.length == expected, (final.length, expected)
    same = await stores[2].update_ledger(lid, lambda m: None)
    assert same.version == final.version and same.length == expected
    try:
        await stores[0].update_ledger(lid + 1_000_000, lambda m: m)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("update_ledger on a missing ledger did not raise")


async def check_delete_and_list(backend: MetadataBackend) -> None:
    store = await backend.open()
    ids = [await store.allocate_ledger_id() for _ in range(4)]
    created = {lid: await store.create_ledger(sample_metadata(lid)) for lid in reversed(ids)}
    assert await store.list_ledgers() == sorted(ids)
    victim = ids[1]
    old = created[victim]
    updated = await store.write_ledger(old.with_changes(length=1), old.version)
    try:
        await store.delete_ledger(victim, expected_version=created[victim].version)
    except MetadataVersionError:
        pass
    else:
        raise AssertionError("delete with a stale version did not raise MetadataVersionError")
    await store.delete_ledger(victim, expected_version=updated.version)
    await store.delete_ledger(ids[2])
    assert await store.list_ledgers() == sorted([ids[0], ids[3]])
    for gone in (victim, ids[2]):
        try:
            await store.read_ledger(gone)
        except NoSuchLedgerError:
            pass
        else:
            raise AssertionError(f"deleted ledger {gone} still readable")
    try:
        await store.delete_ledger(victim)
    except NoSuchLedgerError:
        pass
    else:
        raise AssertionError("deleting a missing ledger did not raise NoSuchLedgerError")


async def check_id_allocation_unique_under_concurrency(backend: MetadataBackend) -> None:
    stores = [await backend.open() for _ in range(3)]
    per_store = 40
    results = await asyncio.gather(
        *(s.allocate_ledger_id() for s in stores for _ in range(per_store))
    )
    assert len(set(results)) == len(results), sorted(results)
    assert all(isinstance(i, int) and i >= 0 for i in results)
    # ids handed out are usable and never collide with a created ledger
    await stores[0].create_ledger(sample_metadata(results[0]))
    more = [await stores[1].allocate_ledger_id() for _ in range(5)]
    assert not set(more) & set(results)


async def check_corrupt_metadata_is_an_error(backend: MetadataBackend) -> None:
    store = await backend.open()
    lid = await store.allocate_ledger_id()
    await store.create_ledger(sample_metadata(lid))
    good = sample_metadata(lid).to_bytes()
    flipped = bytearray(good)
    flipped[-3] ^= 0x20
    for bad in (bytes(flipped), good[:-1], b"", b"not metadata at all", good[:8]):
        await backend.corrupt_ledger(store, lid, bad)
        try:
            await store.read_ledger(lid)
        except CorruptRecordError:
            pass
        else:
            raise AssertionError(f"corrupt bytes {bad[:16]!r}... were accepted")
    # update_ledger must not paper over corruption either
    try:
        await store.update_ledger(lid, lambda m: m.with_changes(length=1))
    except CorruptRecordError:
        pass
    else:
        raise AssertionError("update_ledger accepted corrupt metadata")


async def check_bad_arguments_are_value_errors(backend: MetadataBackend) -> None:
    store = await backend.open()
    for call in (
        lambda: store.read_ledger(-1),
        lambda: store.read_ledger(1 << 63),
        lambda: store.create_ledger(sample_metadata(1 << 63)),
        lambda: store.delete_ledger(-5),
        lambda: store.create_ledger(sample_metadata(-2)),
        lambda: store.create_ledger(sample_metadata(1, state="BOGUS")),
        lambda: store.register_bookie(BookieRegistration("a/b", "")),
        lambda: store.read_cookie(""),
    ):
        try:
            await call()
        except ValueError as exc:
            assert str(exc), "ValueError without a message"
        else:
            raise AssertionError("bad argument accepted")
    assert await store.list_ledgers() == []


async def check_the_largest_ledger_id(backend: MetadataBackend) -> None:
    """``2**63 - 1`` (the wire's int64 max) can be created by name and read back, and the
    allocator never hands it out, nor anything above it, afterwards."""
    store = await backend.open()
    largest = (1 << 63) - 1
    await store.create_ledger(sample_metadata(largest))
    assert (await store.read_ledger(largest)).ledger_id == largest
    for _ in range(3):
        lid = await store.allocate_ledger_id()
        assert 0 <= lid < largest, lid
        await store.create_ledger(sample_metadata(lid))
    assert largest in await store.list_ledgers()
