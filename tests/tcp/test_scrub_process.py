"""A ``pybk bookie`` finds damage in a sealed segment by itself (issue 34, item 8): a byte
flipped while it was down used to go unnoticed ("writable (started)") until a reader hit
it. Now its scrubber reports it in the bookie's info and metrics and marks the ledger
under-replicated, so auto-recovery copies the entry back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from abuse_kit import BookieUnderTest, wait_for
from ops_kit import RECOVERY_ARGS

from pybk.client import Client
from pybk.errors import BKError
from pybk.metadata import open_store
from pybk.testing.replicas import replication_problems
from pybk.transport.tcp import TcpTransport
from pybk.wire import BookieInfoRequest, Status

from .proc_cluster import ProcCluster

pytestmark = pytest.mark.integration


async def _wait_marked(bookie: BookieUnderTest, ledger_id: int) -> None:
    """Wait (bounded) until the bookie's scrubber has marked the ledger under-replicated."""
    store = open_store(bookie.metadata)
    try:
        async def marked() -> bool:
            return ledger_id in await store.list_under_replicated()

        await wait_for(marked, 10, "the ledger marked under-replicated")
    finally:
        await store.close()


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


async def test_a_flipped_byte_in_a_sealed_segment_is_reported_and_marked(tmp_path: Path) -> None:
    bookie = await BookieUnderTest(tmp_path / "r", "--segment-mb", "1").astart()
    async with Client(bookie.metadata) as client:
        lh = await client.create_ledger(1, 1, 1)
        await lh.append_many([bytes([i % 251]) * (64 << 10) for i in range(48)])  # 3 MiB
        await lh.close()
    bookie.stop()
    journal = bookie.root / "bookies" / "b1" / "journal"
    first = journal / sorted(n for n in os.listdir(journal) if n.endswith(".seg"))[0]
    # a sealed segment the checkpoint covers; the first is 128 KiB or more (segments start
    # at StoreConfig.segment_initial_size and grow; how far past it depends on the batching)
    assert first.stat().st_size >= 128 << 10, first.stat().st_size
    _flip(first, first.stat().st_size // 2)
    await bookie.astart()
    try:
        async def damaged() -> bool:
            return (await bookie.ametrics()).get("pybk_bookie_damaged_entries", 0) >= 1

        await wait_for(damaged, 30, "the scrubber finds the damage")

        async def resolve(_b: str) -> str:
            return bookie.address

        transport = TcpTransport(resolve)
        try:
            info = await transport.send("b1", BookieInfoRequest(), 10)
            assert info.status == Status.OK and "damaged entries" in info.message, info
        finally:
            await transport.close()
        await _wait_marked(bookie, lh.id)
        assert "scrubber: ledger" in bookie.log()
    finally:
        bookie.stop()  # (by PID: the second start is this test's to stop)


async def test_a_db_bookie_scrubs_its_entry_logs(tmp_path: Path) -> None:
    """The same on the db engine: a byte flipped in an entry log (a clean stop flushed the
    write cache into it) is found by the scrubber at the next start, and reads of the entry
    answer CORRUPT, not the damaged bytes."""
    bookie = await BookieUnderTest(tmp_path / "r", "--storage", "db").astart()
    async with Client(bookie.metadata) as client:
        lh = await client.create_ledger(1, 1, 1)
        await lh.append_many([bytes([i % 251]) * 4096 for i in range(32)])
        await lh.close()
    bookie.stop()
    logs = bookie.root / "bookies" / "b1" / "entrylogs"
    log = logs / sorted(n for n in os.listdir(logs) if n.endswith(".log"))[-1]
    assert log.stat().st_size > 64 << 10
    _flip(log, 64 << 10)
    await bookie.astart()
    try:
        async def damaged() -> bool:
            return (await bookie.ametrics()).get("pybk_bookie_damaged_entries", 0) >= 1

        await wait_for(damaged, 30, "the scrubber finds the damage")
        await _wait_marked(bookie, lh.id)
        async with Client(bookie.metadata) as client:
            rh = await client.open_ledger(lh.id)
            with pytest.raises(BKError):  # (the only replica is damaged: an error, no bytes)
                await rh.read(0, 31)
            await rh.close()
        assert "scrubber: ledger" in bookie.log()
    finally:
        bookie.stop()


async def test_damage_under_a_running_cluster_is_repaired_with_nothing_lost(
        tmp_path: Path) -> None:
    """Four ``pybk bookie --autorecovery`` processes; a byte flipped in a sealed segment of
    one of them while it runs: its scrubber finds it, auto-recovery moves that replica to
    another bookie, and every entry reads back as written."""
    cluster = ProcCluster(tmp_path, 4, extra_args=[*RECOVERY_ARGS, "--segment-mb", "1",
                                                   "--scrub-rate", "64MiB",
                                                   "--scrub-interval", "1"])
    await cluster.start()
    try:
        data = [bytes([i % 251]) * (64 << 10) for i in range(48)]  # 3 MiB: sealed segments
        async with Client(cluster.metadata) as client:
            lh = await client.create_ledger(3, 3, 2)
            await lh.append_many(data)
            await lh.close()
            # the victim: a bookie of the first fragment only (an ensemble change under
            # load may have replaced one part-way), its first segment holding 200 KiB
            ensembles = list(lh.metadata.ensembles.values())
            later = {b for ens in ensembles[1:] for b in ens}

            def first_segment(bookie: str) -> Path:
                journal = tmp_path / "bookies" / bookie / "journal"
                return journal / sorted(n for n in os.listdir(journal) if n.endswith(".seg"))[0]

            candidates = sorted((first_segment(b).stat().st_size, b) for b in ensembles[0]
                                if b not in later)
            assert candidates and candidates[-1][0] >= 128 << 10, (ensembles, candidates)
            size, victim = candidates[-1]
            _flip(first_segment(victim), size // 2)  # while the bookie runs
            store = open_store(cluster.metadata)
            try:
                async def repaired() -> bool:
                    md = await store.read_ledger(lh.id)
                    return (all(victim not in ens for ens in md.ensembles.values())
                            and not await store.list_under_replicated())

                await wait_for(repaired, 90, "the damaged replica moved to another bookie")
                assert await replication_problems(store, client.transport) == []
            finally:
                await store.close()
            rh = await client.open_ledger(lh.id)
            got = [e.data for e in await rh.read(0, len(data) - 1)]
            assert got == data  # nothing lost
            await rh.close()
        assert "scrubber: ledger" in cluster.log(victim)
    finally:
        cluster.stop_all()
