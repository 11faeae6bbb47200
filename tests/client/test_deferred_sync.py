"""Deferred sync (``create_ledger(write_flags={"deferred_sync"})`` and ``force()``) on
in-process bookies with a slow disk: appends are answered before the fsync, the LAC readers
see never passes what ``force()`` made durable, a bookie failure fails the writer (no
ensemble change), a bookie that lost what it acknowledged fails the force, close forces."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

import pybk
from pybk.errors import BookieUnavailableError, IOBookieError, LedgerClosedError
from pybk.storage.memfs import MemFileSystem
from pybk.testing import HookedTransport
from pybk.wire import ForceRequest, ForceResponse, Request, Response, Status, parse_entry_header

from .conftest import FAST, mem_cluster

pytestmark = pytest.mark.timeout(60)

DEFERRED = {"deferred_sync"}
#: no periodic LAC: what readers learn comes from the entries and the force alone
QUIET = dataclasses.replace(FAST, explicit_lac_interval=0.0)


def _slow(cluster: pybk.LocalCluster, delay: float) -> None:
    """Every fsync from now on takes ``delay`` (the cluster started at full speed)."""
    fs = cluster.bookie(cluster.bookie_ids[0]).fs
    assert isinstance(fs, MemFileSystem)
    fs.sync_delay = delay


async def test_appends_are_answered_before_the_fsync_and_force_makes_them_durable() -> None:
    async with mem_cluster(3, client_config=QUIET) as cluster:
        _slow(cluster, 0.2)
        lh = await cluster.client().create_ledger(3, 2, 2, write_flags=DEFERRED)
        assert isinstance(lh, pybk.DeferredSyncLedgerHandle)
        loop = asyncio.get_running_loop()
        started = loop.time()
        ids = [await lh.append(b"e%d" % i) for i in range(5)]
        assert ids == [0, 1, 2, 3, 4]
        assert loop.time() - started < 0.2  # five appends in less than one fsync
        pending = {b: cluster.bookie(b).deferred.pending(lh.id) for b in cluster.bookie_ids}
        assert sum(pending.values()) > 0  # answered, not yet synced
        assert lh.last_add_written == 4 and lh.last_add_confirmed == -1
        reader = await cluster.client().open_ledger(lh.id, recovery=False)
        assert await reader.read_last_add_confirmed() == -1  # nothing durable told yet
        assert await lh.force() == 4
        assert all(cluster.bookie(b).deferred.pending(lh.id) == 0 for b in cluster.bookie_ids)
        assert lh.last_add_confirmed == 4
        assert await reader.read_last_add_confirmed() == 4  # the force told the bookies
        assert await lh.force() == 4  # nothing new: at once
        await lh.close()
        md = await cluster.client().ledger_metadata(lh.id)
        assert md.is_closed and md.last_entry_id == 4


async def test_entries_carry_the_durable_lac_never_the_written_one() -> None:
    async with mem_cluster(3, client_config=QUIET) as cluster:
        _slow(cluster, 0.05)
        lh = await cluster.client().create_ledger(3, 3, 2, write_flags=DEFERRED)
        for i in range(3):
            await lh.append(b"a%d" % i)
        assert await lh.force() == 2
        for i in range(3):
            await lh.append(b"b%d" % i)
        await lh.force()
        bookie = cluster.bookie(cluster.bookie_ids[0])
        lacs = [parse_entry_header(bookie.store.read(lh.id, e))[2] for e in range(6)]
        assert lacs == [-1, -1, -1, 2, 2, 2]  # entries 3..5 were written before 3..5 were durable
        await lh.close()


async def test_close_forces_first() -> None:
    async with mem_cluster(3) as cluster:
        _slow(cluster, 0.05)
        flags = [pybk.WriteFlag.DEFERRED_SYNC]
        lh = await cluster.client().create_ledger(3, 2, 2, write_flags=flags)
        futs = [lh.append(b"x%d" % i) for i in range(20)]
        await lh.close()
        assert [f.result() for f in futs] == list(range(20))
        assert all(cluster.bookie(b).deferred.pending(lh.id) == 0 for b in cluster.bookie_ids)
        rh = await cluster.client().open_ledger(lh.id)
        assert rh.last_add_confirmed == 19
        with pytest.raises(LedgerClosedError):
            await lh.force()


async def test_a_bookie_failure_fails_the_writer_without_an_ensemble_change() -> None:
    async with mem_cluster(4) as cluster:
        lh = await cluster.client().create_ledger(3, 3, 2, write_flags=DEFERRED)
        await lh.append(b"a")
        assert await lh.force() == 0
        victim = lh.metadata.ensembles[0][1]
        cluster.transport.hooks.unavailable(victim)
        with pytest.raises(BookieUnavailableError, match="deferred sync, which never replaces"):
            await lh.append(b"b")
        assert lh.ensemble_changes == 0
        with pytest.raises(BookieUnavailableError):
            lh.append(b"c")
        with pytest.raises(BookieUnavailableError):
            await lh.force()
        cluster.transport.hooks.clear()
        rh = await cluster.client().open_ledger(lh.id)  # recovery seals it
        assert rh.last_add_confirmed in (0, 1)
        md = await cluster.client().ledger_metadata(lh.id)
        assert len(md.ensembles) == 1


class ForgetfulTransport(HookedTransport):
    """Answers FORCE to one bookie as a bookie that restarted and lost its unsynced entries."""

    forgetful: str | None = None

    def send(self, bookie_id: str, request: Request,
             timeout: float | None = None) -> asyncio.Future[Response]:
        if isinstance(request, ForceRequest) and bookie_id == self.forgetful:
            fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            fut.set_result(ForceResponse(Status.OK, request.ledger_id, -1))
            return fut
        return super().send(bookie_id, request, timeout)


async def test_a_bookie_that_lost_acknowledged_entries_fails_the_force() -> None:
    async with mem_cluster(3, transport_wrapper=ForgetfulTransport) as cluster:
        lh = await cluster.client().create_ledger(3, 2, 2, write_flags=DEFERRED)
        await lh.append_many([b"a", b"b", b"c"])
        transport = cluster.transport
        assert isinstance(transport, ForgetfulTransport)
        transport.forgetful = lh.metadata.ensembles[0][0]
        with pytest.raises(IOBookieError, match="they are lost"):
            await lh.force()
        assert lh.last_add_confirmed == -1
        with pytest.raises(IOBookieError):
            lh.append(b"d")


async def test_write_flags_are_checked() -> None:
    async with mem_cluster(3) as cluster:
        client = cluster.client()
        with pytest.raises(TypeError, match="collection of flags"):
            await client.create_ledger(3, 2, 2, write_flags="deferred_sync")
        with pytest.raises(ValueError, match="unknown write flag 'fast'"):
            await client.create_ledger(3, 2, 2, write_flags={"fast"})
        lh = await client.create_ledger(3, 2, 2, write_flags=())
        assert type(lh) is pybk.LedgerHandle
        await lh.close()


def test_the_sync_facade_forces(tmp_path: Path) -> None:
    with pybk.sync.LocalCluster(tmp_path, bookies=3) as cluster:
        lh = cluster.client().create_ledger(3, 2, 2, write_flags={"deferred_sync"})
        assert isinstance(lh, pybk.sync.DeferredSyncLedgerHandle)
        assert [lh.append(b"x%d" % i) for i in range(3)] == [0, 1, 2]
        assert lh.last_add_confirmed == -1
        assert lh.force() == 2
        assert lh.last_add_confirmed == 2
        lh.close()
