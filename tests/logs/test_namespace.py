"""Namespaces: create / open / list / delete logs, names and knobs checked first, deletion
reaches writers and readers; the same on SQLite metadata with real files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from logs_kit import mem_cluster

import pybk
from pybk import LogExistsError, LogNotFoundError
from pybk.logs import LogConfig

pytestmark = pytest.mark.timeout(60)


async def test_create_open_list_delete() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        ns = client.namespace("default")
        assert await ns.list_logs() == []
        log = await ns.create_log("orders", compression="zstd", roll_entries=5)
        await ns.create_log("audit.2024-01")
        assert await ns.list_logs() == ["audit.2024-01", "orders"]
        md = await (await ns.open_log("orders")).metadata()
        assert md.config == LogConfig(compression="zstd", roll_entries=5)
        assert (md.epoch, md.segments, md.truncated_before, md.end_of_stream) == (0, (), None,
                                                                                 False)
        with pytest.raises(LogExistsError, match="orders"):
            await ns.create_log("orders")
        other = client.namespace("other")
        assert await other.list_logs() == []
        await other.create_log("orders")  # namespaces do not share names
        async with await log.writer() as w:
            await w.append_many([b"a", b"b"])
        assert await client.list_ledgers() != []
        await ns.delete_log("orders")
        assert await ns.list_logs() == ["audit.2024-01"]
        assert await other.list_logs() == ["orders"]
        assert not await ns.log_exists("orders") and await other.log_exists("orders")
        for call in (lambda: ns.open_log("orders"), lambda: ns.delete_log("orders"),
                     lambda: ns.open_log("never")):
            with pytest.raises(LogNotFoundError, match="does not exist"):
                await call()
        md_other = await (await other.open_log("orders")).metadata()
        assert md_other.segments == ()
        # the deleted log's ledgers are gone; a log of the same name starts afresh
        again = await ns.create_log("orders")
        assert await again.segments() == []
        assert await again.first_position() is None and await again.last_position() is None


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "sp ace", "x" * 201, "é"])
async def test_bad_names_are_refused(name: str) -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        with pytest.raises(ValueError, match="name"):
            await client.namespace("default").create_log(name)
        with pytest.raises(ValueError, match="name"):  # ("a/b" is a tenancy namespace)
            client.namespace(name if name != "a/b" else "a/b/c")
        with pytest.raises(TypeError):
            await client.namespace("default").open_log(3)  # type: ignore[arg-type]


@pytest.mark.parametrize("knobs, word", [
    ({"ensemble_size": 2, "write_quorum": 3}, "quorum"),
    ({"ack_quorum": 0}, "ack"),
    ({"compression": "lz4"}, "compression"),
    ({"roll_bytes": 0}, "roll_bytes"),
    ({"roll_entries": -1}, "roll_entries"),
    ({"roll_seconds": 0}, "roll_seconds"),
    ({"retention_bytes": 0}, "retention_bytes"),
    ({"digest_type": "MD5"}, "digest_type"),
])
async def test_bad_knobs_are_refused_before_anything_is_stored(knobs: dict[str, object],
                                                               word: str) -> None:
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace("default")
        with pytest.raises(ValueError, match=word):
            await ns.create_log("x", **knobs)  # type: ignore[arg-type]
        assert await ns.list_logs() == []


async def test_delete_log_stops_its_writer_and_readers() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        ns = client.namespace("default")
        log = await ns.create_log("doomed")
        w = await log.writer()
        await w.append(b"one")
        reader = log.reader()
        first = await reader.__anext__()
        assert first.data == b"one"
        await ns.delete_log("doomed")
        assert await client.list_ledgers() == []
        with pytest.raises(pybk.BKError):  # the segment's ledger is gone: fenced
            await asyncio.wait_for(w.append(b"two"), 10)
        with pytest.raises(LogNotFoundError):
            await asyncio.wait_for(reader.__anext__(), 10)
        await reader.aclose()
        with pytest.raises(LogNotFoundError):
            await log.writer()
        await w.close()


async def test_logs_on_sqlite_metadata_and_real_files(tmp_path: Path) -> None:
    async with pybk.LocalCluster(tmp_path / "c", bookies=3) as cluster:
        ns = cluster.client().namespace("default")
        log = await ns.create_log("events", compression="zstd", roll_entries=2)
        async with await log.writer() as w:
            positions = [await w.append(f"e{i}".encode()) for i in range(5)]
        assert positions[-1].segment == 3
    async with pybk.LocalCluster(tmp_path / "c", bookies=3) as cluster:  # reopened
        ns = cluster.client().namespace("default")
        log = await ns.open_log("events")
        got = [r async for r in log.reader(stop_at=positions[-1])]
        assert [r.data for r in got] == [f"e{i}".encode() for i in range(5)]
        assert [r.position for r in got] == positions
