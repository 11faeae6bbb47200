"""Ledger ids at the edges: the int64 maximum, an allocator with nothing left, and ids a
caller created by name before an allocator handed them out."""

from __future__ import annotations

import pathlib

import pytest

import pybk
from pybk.metadata import open_store
from pybk.testing.metadata_helpers import sample_metadata

LARGEST = (1 << 63) - 1


@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
async def test_an_allocator_with_no_id_left_says_so(tmp_path: pathlib.Path, scheme: str) -> None:
    store = open_store("memory://" if scheme == "memory" else f"sqlite:///{tmp_path}/m.db")
    try:
        await store.create_ledger(sample_metadata(LARGEST - 2))  # by name: the allocator skips
        assert await store.allocate_ledger_id() == LARGEST - 1
        with pytest.raises(pybk.LedgerIdOverflowError, match="no ledger id left"):
            await store.allocate_ledger_id()
        await store.create_ledger(sample_metadata(LARGEST))  # by name, still allowed
        with pytest.raises(pybk.LedgerIdOverflowError):
            await store.allocate_ledger_id()
    finally:
        await store.close()


async def test_a_client_skips_an_id_another_client_created_by_name(
        tmp_path: pathlib.Path) -> None:
    """Client A's store claimed a block of ids; client B creates, by name, the id A would be
    handed next. A's unnamed create takes the id after it instead of failing."""
    from pybk.storage.memfs import MemFileSystem

    uri = f"sqlite:///{tmp_path}/m.db"
    async with pybk.LocalCluster("/ids", bookies=3, fs=MemFileSystem(), metadata=uri) as cluster:
        a = cluster.client()
        first = await a.create_ledger(3, 2, 2)
        b = pybk.Client(uri, transport=cluster.transport)
        try:
            taken = await b.create_ledger(3, 2, 2, ledger_id=first.id + 1)
            assert taken.id == first.id + 1
            second = await a.create_ledger(3, 2, 2)
            assert second.id not in (first.id, taken.id)
            assert await second.append(b"x") == 0
        finally:
            await b.close()


async def test_ledger_ids_beyond_int64_are_refused(tmp_path: pathlib.Path) -> None:
    from pybk.storage.memfs import MemFileSystem

    async with pybk.LocalCluster("/ids", bookies=3, fs=MemFileSystem()) as cluster:
        client = cluster.client()
        with pytest.raises(ValueError, match=r"2\*\*63 - 1"):
            await client.create_ledger(3, 2, 2, ledger_id=1 << 63)
        lh = await client.create_ledger(3, 2, 2, ledger_id=LARGEST)
        assert await lh.append(b"last") == 0
        await lh.close()
        rh = await client.open_ledger(LARGEST)
        assert [e.data for e in await rh.read(0, 0)] == [b"last"]
