"""LedgerHandleAdv end to end against a model, driven by hypothesis: appends of any id in any
order (duplicates included), bookie answers scripted in any order (stored or failed: bookies
get replaced), loop steps. After every step the handle keeps its promises; at the end, with
everything answered, the LAC is the longest prefix of added ids, close seals there and the
entries held after a gap fail.

Checked after every step:
* a duplicate id is refused (DuplicateEntryIdError), and only a duplicate;
* each append's future resolves to its own id, and the resolved ids are 0..k with no gap;
* every resolved id is held by Qa bookies of its write set in the fragment the metadata store
  records for it; the pipeline's invariants.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.client.context import ClientConfig
from pybk.client.quorum import Quorums
from pybk.errors import DuplicateEntryIdError, LedgerClosedError
from pybk.metadata.base import BookieRegistration
from pybk.metadata.memory import MemoryMetadataStore
from pybk.wire import AddResponse, Status, error_response

from .test_writer_model import ScriptedTransport

ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 9)),
        st.tuples(st.just("ok"), st.integers(0, 50)),
        st.tuples(st.just("err"), st.integers(0, 50)),
        st.tuples(st.just("step"), st.integers(1, 5)),
    ),
    max_size=50,
)


@given(quorum=st.sampled_from([(3, 2, 2), (3, 3, 2), (4, 3, 2), (2, 2, 1)]), actions=ACTIONS,
       seed=st.integers(0, 1000))
@settings(derandomize=True, deadline=None, max_examples=100)
def test_adv_handle_keeps_its_promises(quorum: tuple[int, int, int],
                                       actions: list[tuple[str, int]], seed: int) -> None:
    asyncio.run(_run(quorum, actions, seed))


async def _run(quorum: tuple[int, int, int], actions: list[tuple[str, int]], seed: int) -> None:
    from pybk.client import Client

    store = MemoryMetadataStore()
    for i in range(8):
        await store.register_bookie(BookieRegistration(f"b{i}", ""))
    transport = ScriptedTransport()
    client = Client(store, transport=transport, config=ClientConfig(add_timeout=1e6),
                    rng=random.Random(seed))
    lh = await client.create_ledger_adv(*quorum)
    q = Quorums(*quorum)
    held: dict[int, set[str]] = {}
    offered: dict[int, asyncio.Future[int]] = {}
    resolved: list[int] = []

    def record(eid: int, f: asyncio.Future[int]) -> None:
        if not f.cancelled() and f.exception() is None:
            assert f.result() == eid
            resolved.append(eid)

    async def check() -> None:
        assert sorted(resolved) == list(range(len(resolved)))
        md = await store.read_ledger(lh.id)
        for e in resolved:
            fragment = md.ensemble_for(e)
            replicas = {fragment[i] for i in q.write_set(e)} & held.get(e, set())
            assert len(replicas) >= q.ack_quorum, (e, dict(md.ensembles), held.get(e))
        lh._check()

    async def steps(n: int) -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    rng = random.Random(seed)
    for action, arg in actions:
        if action == "append":
            if arg in offered:
                with pytest.raises(DuplicateEntryIdError):
                    lh.append(arg, b"again")
            elif lh._pipeline.error is None:
                fut = lh.append(arg, b"e%d" % arg)
                fut.add_done_callback(lambda f, eid=arg: record(eid, f))
                offered[arg] = fut
        elif action in ("ok", "err"):
            live = transport.live()
            if live:
                bookie, req, fut = live[arg % len(live)]
                if action == "ok":
                    held.setdefault(req.entry_id, set()).add(bookie)
                    fut.set_result(AddResponse(Status.OK, req.ledger_id, req.entry_id))
                else:
                    status = rng.choice([Status.IO_ERROR, Status.TIMEOUT])
                    fut.set_result(error_response(req, status, "scripted"))
        else:
            await steps(arg)
        await steps(3)
        await check()

    for _ in range(200):  # answer everything still outstanding with OK
        live = transport.live()
        if not live:
            break
        for bookie, req, fut in live:
            held.setdefault(req.entry_id, set()).add(bookie)
            fut.set_result(AddResponse(Status.OK, req.ledger_id, req.entry_id))
        await steps(5)
    await steps(5)
    await check()
    prefix = -1
    while prefix + 1 in offered:
        prefix += 1
    if lh._pipeline.error is None:
        assert lh.last_add_confirmed == prefix and sorted(resolved) == list(range(prefix + 1))
        await asyncio.wait_for(lh.close(), 10)
        md = await store.read_ledger(lh.id)
        assert md.is_closed and md.last_entry_id == prefix
        for eid, fut in offered.items():
            if eid > prefix:
                with pytest.raises(LedgerClosedError):
                    fut.result()
