"""Randomized recovery: whatever a crashed writer left on the bookies, recovery never loses
an acknowledged entry and never invents one.

Per seed: random E/Qw/Qa; a dead writer had acknowledged entries 0..k-1 (each on at least
Qa bookies of its write set) and had sent entries k..n-1 that reached random subsets; every
entry carries a non-decreasing piggybacked LAC below both its id and k. Up to Qa-1 bookies
are unreachable during recovery. Checked:
* recovery either closes the ledger at some last >= k-1 with every entry 0..last readable
  with the bytes the writer sent (L1, L4), or fails with an error and leaves it IN_RECOVERY;
* a second recovery agrees (L7).
"""

from __future__ import annotations

import random

import pytest

from pybk.client.quorum import Quorums
from pybk.errors import LedgerRecoveryError, NotEnoughBookiesError
from pybk.metadata.base import CLOSED, IN_RECOVERY
from pybk.wire import AddRequest, DigestManager, Status, master_key

from .conftest import mem_cluster

BOOKIES = [f"b{i}" for i in range(7)]


@pytest.mark.parametrize("seed", range(40))
async def test_recovery_keeps_acked_entries(seed: int) -> None:
    rng = random.Random(seed)
    e, w, a = rng.choice(
        [(3, 2, 2), (3, 3, 2), (4, 3, 2), (5, 3, 3), (4, 4, 3), (3, 3, 3), (2, 2, 1), (3, 2, 1)]
    )
    q = Quorums(e, w, a)
    n = rng.randint(0, 8)
    k = rng.randint(0, n)
    async with mem_cluster(BOOKIES, seed=seed) as cluster:
        lh = await cluster.client().create_ledger(e, w, a)
        ensemble = lh.metadata.ensembles[0]
        dm = DigestManager(lh.id)
        lac, length, sent = -1, 0, []
        for entry in range(n):
            lac = rng.randint(lac, min(entry - 1, k - 1)) if min(entry - 1, k - 1) >= lac else lac
            payload = b"%d-%d" % (seed, entry)
            length += len(payload)
            sent.append(payload)
            body = dm.frame(entry, lac, length, payload)
            ws = [ensemble[i] for i in q.write_set(entry)]
            holders = rng.sample(ws, rng.randint(a if entry < k else 0, w))
            for b in holders:
                resp = await cluster.bookie(b).handle(
                    AddRequest(lh.id, entry, master_key(b""), body)
                )
                assert resp.status == Status.OK
        t = cluster.local_transport()
        down = rng.sample(list(ensemble), rng.randint(0, a - 1))
        for b in down:
            t.hooks.unavailable(b)
        client = cluster.client(transport=t)
        try:
            rh = await client.open_ledger(lh.id)
        except (LedgerRecoveryError, NotEnoughBookiesError):
            assert (await cluster.store.read_ledger(lh.id)).state == IN_RECOVERY
            return
        md = rh.metadata
        assert md.state == CLOSED
        last = md.last_entry_id
        assert last >= k - 1, (seed, last, k)
        assert last <= n - 1
        if last >= 0:
            got = [x.data for x in await rh.read(0, last)]
            assert got == sent[: last + 1]
        assert md.length == sum(len(p) for p in sent[: last + 1])
        t.hooks.clear()
        again = await cluster.client().open_ledger(lh.id)
        assert again.metadata.last_entry_id == last
