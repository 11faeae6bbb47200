"""Large batched adds are admitted a chunk per loop turn (pybk.bookie.turns): the loop turns
between the chunks, each entry still gets its own outcome, the batch is answered once, and
a fence or the end of admission between chunks is honoured."""

from __future__ import annotations

import asyncio

from pybk.errors import EntryExistsError, LedgerFencedError
from pybk.wire import AddBatchRequest, AddOutcome, FenceRequest, ReadRequest, Status

from .conftest import KEY, frame

N = 5000  # ten chunks of at most 512 (ADMIT_STEP)


class Turns:
    """Counts loop turns while it runs (a task that yields once per turn)."""

    def __init__(self) -> None:
        self.count = 0
        self.task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.count += 1


def _submit(bookie, request) -> asyncio.Future[AddOutcome]:  # type: ignore[no-untyped-def]
    fut: asyncio.Future[AddOutcome] = asyncio.get_running_loop().create_future()

    def on_done(outcome: AddOutcome) -> None:
        assert not fut.done(), "answered twice"
        fut.set_result(outcome)

    bookie.add_request(request, on_done)
    return fut


async def test_a_large_duplicate_batch_lets_the_loop_turn_between_chunks(harness):
    bookie = harness.bookie
    ids = list(range(N))
    bodies = [frame(1, e) for e in ids]
    assert await _submit(bookie, AddBatchRequest(1, KEY, ids, bodies)) is None
    turns = Turns()
    start = turns.count
    fut = _submit(bookie, AddBatchRequest(1, KEY, ids, bodies))  # all held, identical
    assert not fut.done()  # only the first chunk was admitted in this turn
    assert await fut is None
    assert turns.count - start >= 2  # the loop ran between the chunks
    turns.task.cancel()


async def test_each_entry_of_a_chunked_batch_gets_its_own_outcome(harness):
    bookie = harness.bookie
    held = list(range(N))
    assert await _submit(bookie, AddBatchRequest(1, KEY, held, [frame(1, e) for e in held])) \
        is None
    ids = list(range(N + 1000))  # the held ones, some with other bytes, and 1000 new ones
    bodies = [frame(1, e, b"other" if 2600 <= e < 2700 else None) for e in ids]
    outcome = await _submit(bookie, AddBatchRequest(1, KEY, ids, bodies))
    assert isinstance(outcome, list) and len(outcome) == len(ids)
    refused = [i for i, o in enumerate(outcome) if o is not None]
    assert refused == list(range(2600, 2700))  # (within one chunk)
    assert all(isinstance(outcome[i], EntryExistsError) for i in refused)
    assert len({id(outcome[i]) for i in refused}) == 1  # one error for the lot, not 100
    assert await harness.read(1, N + 999) == (Status.OK, frame(1, N + 999))
    assert await harness.read(1, 2650) == (Status.OK, frame(1, 2650))  # the first bytes stay


async def test_a_fence_between_chunks_refuses_the_chunks_after_it(harness):
    bookie = harness.bookie
    ids = list(range(N))
    fut = _submit(bookie, AddBatchRequest(1, KEY, ids, [frame(1, e) for e in ids]))
    fence = await bookie.handle(FenceRequest(1, KEY))  # lands after the first chunk
    assert fence.status == Status.OK
    outcome = await fut
    assert isinstance(outcome, list)
    stored = [i for i, o in enumerate(outcome) if o is None]
    assert stored == list(range(len(stored))) and 0 < len(stored) < N  # a prefix of chunks
    assert all(isinstance(o, LedgerFencedError) for o in outcome[len(stored):])
    assert await harness.read(1, stored[-1]) == (Status.OK, frame(1, stored[-1]))
    assert (await bookie.handle(ReadRequest(1, len(stored)))).status == Status.NO_SUCH_ENTRY


async def test_a_deferred_sync_batch_is_answered_once_the_last_chunk_is_taken(harness):
    bookie = harness.bookie
    ids = list(range(N))
    turns = Turns()
    start = turns.count
    request = AddBatchRequest(1, KEY, ids, [frame(1, e) for e in ids], deferred_sync=True)
    outcome = await _submit(bookie, request)
    assert outcome is None and turns.count - start >= 2
    assert bookie.deferred.pending(1) == 1  # answered before its sync: one to force
    turns.task.cancel()


async def test_the_chunks_of_batches_in_flight_take_one_loop_turn_each_in_all(harness):
    """Eight large batches at once: after their first chunks (admitted as they arrive), one
    chunk per loop turn, not one per batch per turn (each batch scheduling its own next
    chunk ran eight chunks in a turn: the loop stall grew with the batches in flight)."""
    bookie = harness.bookie
    ids = list(range(N))
    bodies = [frame(1, e) for e in ids]
    assert await _submit(bookie, AddBatchRequest(1, KEY, ids, bodies)) is None
    turns = Turns()
    chunks_at: list[int] = []
    put_batch = bookie._put_batch

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        chunks_at.append(turns.count)
        put_batch(*args, **kwargs)

    bookie._put_batch = counted
    futs = [_submit(bookie, AddBatchRequest(1, KEY, ids, bodies)) for _ in range(8)]
    assert await asyncio.gather(*futs) == [None] * 8
    turns.task.cancel()
    first, later = chunks_at[:8], chunks_at[8:]
    assert len(set(first)) == 1  # (the first chunk of each, as it was submitted)
    assert len(later) == 8 * (-(-N // bookie.admit_step) - 1)
    assert len(set(later)) == len(later), "two chunks ran in one loop turn"
