"""Randomized failures against the writer, then recovery: the ledger invariants hold.

Per seed: a writer pipelines adds while the transport fails a random fraction of adds
(errors, unavailability) so ensemble changes pile up; then a second client recovers the
ledger. Checked (reliability.md section 2.3): acks come in entry-id order (L6); every
acknowledged entry is at or below the closed last entry and reads back with its payload
(L1); the closed ledger is a dense prefix of what was appended (L4); the writer's own
pipeline invariants hold throughout.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from pybk.errors import BKError
from pybk.wire import AddRequest, Request, Status

from .conftest import mem_cluster


@pytest.mark.parametrize("seed", range(8))
async def test_random_add_failures_keep_invariants(seed: int) -> None:
    rng = random.Random(seed)
    async with mem_cluster(9, seed=seed) as cluster:
        quorum = rng.choice([(3, 2, 2), (3, 3, 2), (4, 3, 2), (5, 3, 3)])
        lh = await cluster.client().create_ledger(*quorum)
        t = cluster.transport
        budget = {"left": 8}

        def flaky(bookie: str, req: Request) -> bool:
            if not isinstance(req, AddRequest) or budget["left"] <= 0:
                return False
            if rng.random() < 0.01:
                budget["left"] -= 1
                return True
            return False

        t.hooks.fail(status=Status.IO_ERROR, predicate=flaky)
        acked_order: list[int] = []
        futures = []
        for i in range(150):
            try:
                fut = lh.append(b"p%d" % i)
            except BKError:  # the handle failed (e.g. not enough bookies left): stop
                break
            fut.add_done_callback(
                lambda f: acked_order.append(f.result()) if not f.exception() else None
            )
            futures.append(fut)
            if rng.random() < 0.2:
                await asyncio.sleep(0)
                lh._check()
        results = await asyncio.gather(*futures, return_exceptions=True)
        acked = [r for r in results if isinstance(r, int)]
        assert all(isinstance(r, int | BKError) for r in results)
        assert acked_order == sorted(acked_order) == acked  # in order, no gaps
        assert acked == list(range(len(acked)))
        lh._check()
        assert lh.ensemble_changes >= 1  # every seed here exercises ensemble changes

        t.hooks.clear()
        rh = await cluster.client().open_ledger(lh.id, recovery=True)
        last = rh.metadata.last_entry_id
        assert last >= (acked[-1] if acked else -1)
        entries = await rh.read(0, last) if last >= 0 else []
        assert [e.data for e in entries] == [b"p%d" % i for i in range(last + 1)]
        md = rh.metadata
        starts = sorted(md.ensembles)
        assert starts[0] == 0 and all(s <= last + 1 for s in starts)
        for ens in md.ensembles.values():
            assert len(set(ens)) == quorum[0]
