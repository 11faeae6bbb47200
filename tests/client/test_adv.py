"""Caller-chosen entry ids (``Client.create_ledger_adv``, ``LedgerHandleAdv``) on in-process
bookies: out-of-order and parallel appends, the LAC over the contiguous prefix, duplicates
and bad ids refused, close and recovery sealing at the prefix, an ensemble change, the sync
facade."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

import pybk
from pybk.errors import (
    BadRequestError,
    DuplicateEntryIdError,
    LedgerClosedError,
    LedgerFencedError,
)

from .conftest import mem_cluster, until

pytestmark = pytest.mark.timeout(60)


async def test_out_of_order_ids_are_confirmed_in_order() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger_adv(3, 2, 2)
        assert isinstance(lh, pybk.LedgerHandleAdv)
        f2 = lh.append(2, b"c")
        f1 = lh.append(1, b"b")
        await asyncio.sleep(0)
        assert lh.held == 2 and lh.last_add_pushed == -1  # nothing before id 0 is sent
        assert not f1.done() and not f2.done()
        assert await lh.append(0, b"a") == 0
        assert await f1 == 1 and await f2 == 2
        assert lh.last_add_confirmed == 2 and lh.length == 3
        f4 = lh.append(4, b"e")
        assert await lh.append(3, b"d") == 3
        assert await f4 == 4
        await lh.close()
        rh = await cluster.client().open_ledger(lh.id)
        assert rh.last_add_confirmed == 4
        assert [e.data for e in await rh.read(0, 4)] == [b"a", b"b", b"c", b"d", b"e"]


async def test_parallel_writers_with_shuffled_ids() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger_adv(3, 3, 2)
        ids = list(range(100))
        random.Random(7).shuffle(ids)
        rng = random.Random(8)

        async def writer(mine: list[int]) -> list[int]:
            out = []
            for eid in mine:  # (each awaits its own adds, so ascending: no waiting in a cycle)
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)
                out.append(await lh.append(eid, b"%d" % eid))
            return out

        futs = [lh.append(eid, b"%d" % eid) for eid in ids]  # one burst, shuffled
        got = await asyncio.gather(*(writer(list(range(100 + i, 300, 4))) for i in range(4)))
        assert await asyncio.gather(*futs) == ids
        assert got == [list(range(100 + i, 300, 4)) for i in range(4)]
        assert lh.last_add_confirmed == 299 and lh.held == 0
        lh._check()
        entries = await lh.read(0, 299)
        assert [e.data for e in entries] == [b"%d" % i for i in range(300)]
        await lh.close()


async def test_duplicate_and_bad_ids_are_refused() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger_adv(3, 2, 2)
        assert await lh.append(0, b"a") == 0
        lh.append(5, b"f")
        for dup in (0, 5):  # confirmed, and held ahead of a gap
            with pytest.raises(DuplicateEntryIdError, match=f"entry id {dup} was added"):
                lh.append(dup, b"z")
        with pytest.raises(ValueError):  # (DuplicateEntryIdError is one too)
            lh.append(0, b"z")
        with pytest.raises(TypeError, match="entry_id must be an int"):
            lh.append("1", b"x")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="entry_id must be an int"):
            lh.append(True, b"x")
        with pytest.raises(ValueError, match="entry_id must be >= 0"):
            lh.append(-1, b"x")
        with pytest.raises(TypeError, match="takes bytes"):
            lh.append(1, "text")  # type: ignore[arg-type]
        with pytest.raises(BadRequestError, match="caller-chosen entry ids"):
            await lh.append_many([b"x"])
        assert await lh.append(1, b"b") == 1  # refusals took nothing
        assert lh.last_add_confirmed == 1 and lh.held == 1
        await lh.close()


async def test_close_seals_at_the_contiguous_prefix() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger_adv(3, 2, 2)
        await asyncio.gather(lh.append(1, b"b"), lh.append(0, b"a"))
        held = [lh.append(3, b"d"), lh.append(4, b"e")]
        await lh.close()
        md = await cluster.client().ledger_metadata(lh.id)
        assert md.is_closed and md.last_entry_id == 1 and md.length == 2
        for fut in held:
            with pytest.raises(LedgerClosedError, match="entry id 2 was never added"):
                await fut
        with pytest.raises(LedgerClosedError):
            lh.append(2, b"c")


async def test_recovery_seals_at_the_contiguous_prefix() -> None:
    async with mem_cluster(3) as cluster:
        lh = await cluster.client().create_ledger_adv(3, 2, 2)
        for eid in (0, 2, 1):
            lh.append(eid, b"x%d" % eid)
        held = lh.append(4, b"x4")
        await until(lambda: lh.last_add_confirmed == 2)
        rh = await cluster.client().open_ledger(lh.id)  # fences and seals
        assert rh.last_add_confirmed == 2
        with pytest.raises(LedgerFencedError):
            await lh.append(3, b"x3")
        with pytest.raises(LedgerFencedError):  # held behind it: never added either
            await held
        assert [e.data for e in await rh.read(0, 2)] == [b"x0", b"x1", b"x2"]
        await lh.close()


async def test_a_bookie_failure_changes_the_ensemble_under_adv_writes() -> None:
    async with mem_cluster(4) as cluster:
        lh = await cluster.client().create_ledger_adv(3, 3, 2)
        victim = lh.metadata.ensembles[0][0]
        futs = [lh.append(eid, b"%d" % eid) for eid in (3, 1, 0)]
        cluster.transport.hooks.unavailable(victim)
        futs += [lh.append(eid, b"%d" % eid) for eid in (2, 5, 4)]
        assert sorted(await asyncio.gather(*futs)) == list(range(6))
        assert lh.ensemble_changes >= 1 and lh.last_add_confirmed == 5
        await lh.close()
        md = await cluster.client().ledger_metadata(lh.id)
        assert md.last_entry_id == 5 and victim not in md.ensembles[max(md.ensembles)]


def test_the_sync_facade_takes_caller_chosen_ids(tmp_path: Path) -> None:
    with pybk.sync.LocalCluster(tmp_path, bookies=3) as cluster:
        client = cluster.client()
        lh = client.create_ledger_adv(3, 2, 2)
        assert isinstance(lh, pybk.sync.LedgerHandleAdv)
        later = lh.append_async(1, b"b")
        assert lh.append(0, b"a") == 0
        assert later.result(timeout=10) == 1
        with pytest.raises(DuplicateEntryIdError):
            lh.append(1, b"again")
        lh.close()
        rh = client.open_ledger(lh.id)
        assert [e.data for e in rh.read(0, 1)] == [b"a", b"b"]
