"""Model-based test of the write pipeline: hypothesis picks every interleaving of appends,
bookie replies (OK or error) and loop steps; after each step the writer's promises hold.

The transport here is a script, not a bookie: it records each request and lets the test
answer it in any order, which is the point (real bookies answer in too few orders).

Checked after every step:
* acknowledgements come in entry-id order with no gaps (ordering, L6);
* every acknowledged entry is held by at least Qa bookies of its write set in the fragment
  the *metadata store* records for it (R3: never ack against an ensemble that is not
  durable; AllAckedEntriesAreReadable);
* the pipeline's own invariants (``_check``).
"""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.client.context import ClientConfig
from pybk.client.quorum import Quorums
from pybk.errors import BKError
from pybk.metadata.base import BookieRegistration
from pybk.metadata.memory import MemoryMetadataStore
from pybk.transport.base import Transport
from pybk.wire import AddRequest, AddResponse, Request, Response, Status, error_response


class ScriptedTransport(Transport):
    def __init__(self) -> None:
        self.outstanding: list[tuple[str, AddRequest, asyncio.Future[Response]]] = []

    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        assert isinstance(request, AddRequest)
        self.outstanding.append((bookie_id, request, fut))
        return fut

    def live(self) -> list[tuple[str, AddRequest, asyncio.Future[Response]]]:
        self.outstanding = [o for o in self.outstanding if not o[2].done()]
        return self.outstanding


ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("batch"), st.integers(0, 6)),
        st.tuples(st.just("ok"), st.integers(0, 50)),
        st.tuples(st.just("err"), st.integers(0, 50)),
        st.tuples(st.just("step"), st.integers(1, 5)),
    ),
    max_size=60,
)


@given(
    quorum=st.sampled_from([(3, 2, 2), (3, 3, 2), (4, 3, 2), (3, 2, 1), (2, 2, 2)]),
    actions=ACTIONS,
    seed=st.integers(0, 1000),
)
@settings(derandomize=True, deadline=None, max_examples=150)
def test_writer_promises_hold_in_every_interleaving(
    quorum: tuple[int, int, int], actions: list[tuple[str, int]], seed: int
) -> None:
    asyncio.run(_run(quorum, actions, seed))


async def _run(quorum: tuple[int, int, int], actions: list[tuple[str, int]], seed: int) -> None:
    from pybk.client import Client

    store = MemoryMetadataStore()
    for i in range(7):
        await store.register_bookie(BookieRegistration(f"b{i}", ""))
    transport = ScriptedTransport()
    config = ClientConfig(add_timeout=1e6)
    client = Client(store, transport=transport, config=config, rng=random.Random(seed))
    lh = await client.create_ledger(*quorum)
    q = Quorums(*quorum)
    held: dict[int, set[str]] = {}
    acked: list[int] = []
    futures: list[asyncio.Future[int]] = []
    batches: list[asyncio.Future[list[int]]] = []

    def record(f: asyncio.Future[int]) -> None:
        if not f.cancelled() and f.exception() is None:
            acked.append(f.result())

    def record_batch(f: asyncio.Future[list[int]]) -> None:
        if not f.cancelled() and f.exception() is None:
            acked.extend(f.result())

    async def check() -> None:
        assert acked == list(range(len(acked)))
        md = await store.read_ledger(lh.id)
        for e in acked:
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
            for _ in range(arg):
                try:
                    fut = lh.append(b"x%d" % len(futures))
                except BKError:
                    break
                fut.add_done_callback(record)
                futures.append(fut)
        elif action == "batch":
            first = lh.last_add_pushed + 1
            try:
                bfut = lh._pipeline.push_many([b"b%d" % i for i in range(arg)])
            except BKError:
                continue
            bfut.add_done_callback(record_batch)
            batches.append(bfut)
            if arg:
                assert lh.last_add_pushed == first + arg - 1
        elif action in ("ok", "err"):
            live = transport.live()
            if live:
                bookie, req, fut = live[arg % len(live)]
                if action == "ok":
                    held.setdefault(req.entry_id, set()).add(bookie)
                    fut.set_result(AddResponse(Status.OK, req.ledger_id, req.entry_id))
                else:
                    status = rng.choice([Status.IO_ERROR, Status.READ_ONLY, Status.TIMEOUT])
                    fut.set_result(error_response(req, status, "scripted"))
        else:
            await steps(arg)
        await steps(3)
        await check()

    # let everything finish: answer whatever is still outstanding with OK
    for _ in range(200):
        live = transport.live()
        if not live and all(f.done() for f in [*futures, *batches]):
            break
        for bookie, req, fut in live:
            held.setdefault(req.entry_id, set()).add(bookie)
            fut.set_result(AddResponse(Status.OK, req.ledger_id, req.entry_id))
        await steps(5)
    assert all(f.done() for f in [*futures, *batches])
    await steps(3)
    await check()
    ok = [f.result() for f in futures if f.exception() is None]
    ok += [i for b in batches if b.exception() is None for i in b.result()]
    assert sorted(ok) == acked
