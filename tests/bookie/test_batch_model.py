"""The batched add path of a bookie (``Bookie.add_request`` with an AddBatchRequest: one
journal append, one index update, one answer) against the model of tests/bookie/test_stateful.

The machine of test_stateful (single adds, reads, fences, LAC writes, deletions, compactions,
checkpoints, restarts, crashes, full disks) plus batches:

* a batch mixes new entries, entries already held (same or other bytes), duplicates inside the
  batch and entries framed with the wrong id: each entry's outcome is judged on its own
  (partial failure inside a batch);
* batches of several ledgers in flight at once while one of those ledgers is fenced between
  them (a fenced ledger in the middle of a group of batches: the batch admitted before the
  fence is stored, the one after is refused, the other ledgers' are untouched);
* a crash between a batch's write and its sync (a slow disk holds the sync; the crash
  drops, tears or reorders the unsynced bytes): nothing acknowledged is lost, nothing
  unacknowledged reads back as other bytes or as corruption.

The invariants of the base machine run after every step (internal checks, every acknowledged
entry reads back, the directory is sound, fences hold).
"""

from __future__ import annotations

import asyncio
import random

from hypothesis import strategies as st
from hypothesis.stateful import rule

from pybk.errors import status_of
from pybk.wire import (
    AddBatchRequest,
    AddOutcome,
    FenceRequest,
    Status,
    outcome_of,
)

from .test_stateful import KEY, LEDGERS, BookieMachine, body

BATCH_ENTRIES = st.lists(st.tuples(st.sampled_from([*range(13), 100]), st.integers(0, 1),
                                   st.sampled_from(["ok", "ok", "ok", "misframed"])),
                         min_size=1, max_size=10)


class BatchBookieMachine(BookieMachine):
    """The bookie state machine with batched adds (see the module docstring)."""

    def _batch(self, lid: int, entries: list[tuple[int, int, str]],
               recovery: bool) -> tuple[AddBatchRequest, list[bool]]:
        ids, bodies, misframed = [], [], []
        for eid, variant, kind in entries:
            data = body(lid, eid, variant)
            if kind == "misframed":  # framed as another entry: refused alone
                data = body(lid, eid + 1, variant)
            else:
                self.m.tried.setdefault((lid, eid), set()).add(data)
            ids.append(eid)
            bodies.append(data)
            misframed.append(kind == "misframed")
        return AddBatchRequest(lid, KEY, ids, bodies, recovery), misframed

    def _submit(self, request: AddBatchRequest) -> asyncio.Future[AddOutcome]:
        """Drive the bookie's add path; the future holds the outcome (answered once)."""
        fut: asyncio.Future[AddOutcome] = self.loop.create_future()

        def on_done(outcome: AddOutcome) -> None:
            assert not fut.done(), "a batch was answered twice"
            fut.set_result(outcome)

        self.bookie.add_request(request, on_done)
        return fut

    def _judge_batch(self, request: AddBatchRequest, misframed: list[bool],
                     outcome: AddOutcome) -> None:
        if isinstance(outcome, list):
            assert len(outcome) == len(request.bodies)
        for i, (eid, data) in enumerate(zip(request.entry_ids, request.bodies, strict=True)):
            err = outcome_of(outcome, i)
            status = Status.OK if err is None else status_of(err)
            if misframed[i]:
                assert status in (Status.BAD_REQUEST, Status.FENCED, Status.UNAVAILABLE,
                                  Status.READ_ONLY), (eid, status)
                continue
            self._judge_add(request.ledger_id, eid, data, request.recovery, status)

    @rule(lid=LEDGERS, entries=BATCH_ENTRIES, recovery=st.booleans())
    def add_batch(self, lid: int, entries: list[tuple[int, int, str]], recovery: bool) -> None:
        request, misframed = self._batch(lid, entries, recovery)
        self._judge_batch(request, misframed, self.run(self._submit(request)))

    @rule(batches=st.lists(st.tuples(LEDGERS, BATCH_ENTRIES), min_size=2, max_size=4),
          fence_at=st.integers(0, 4), fence_lid=LEDGERS)
    def batches_around_a_fence(self, batches: list[tuple[int, list[tuple[int, int, str]]]],
                               fence_at: int, fence_lid: int) -> None:
        """Batches of several ledgers submitted together, the fence of one ledger among them
        (synchronously, as a server would take them off one connection)."""
        async def go() -> None:
            futs = []
            fence = None
            fenced_before: set[int] = set()
            for k, (lid, entries) in enumerate(batches):
                if k == fence_at:
                    self.m.fence_tried.add(fence_lid)
                    fence = asyncio.ensure_future(self.bookie.handle(
                        FenceRequest(fence_lid, KEY)))
                    await asyncio.sleep(0)  # (the fence takes effect now, before the rest)
                    fenced_before.add(fence_lid)
                request, misframed = self._batch(lid, entries, False)
                futs.append((request, misframed, self._submit(request), set(fenced_before)))
            for request, misframed, fut, fenced in futs:
                outcome = await fut
                if request.ledger_id in fenced:  # admitted after the fence: refused whole
                    for i in range(len(request.bodies)):
                        err = outcome_of(outcome, i)
                        assert err is not None, "a normal add after the fence was stored"
                self._judge_batch(request, misframed, outcome)
            if fence is not None:
                r = await fence
                if r.status == Status.OK:
                    self.m.fenced.add(fence_lid)

        self.run(go())

    @rule(batches=st.lists(st.tuples(LEDGERS, BATCH_ENTRIES), min_size=1, max_size=3),
          steps=st.integers(0, 4), mode=st.sampled_from(["drop", "torn", "reorder"]),
          seed=st.integers(0, 1000))
    def crash_between_write_and_sync(self, batches: list[tuple[int, list[tuple[int, int, str]]]],
                                     steps: int, mode: str, seed: int) -> None:
        """A slow disk: the batches are written, their sync takes a while, the bookie dies
        (kill -9 and power cut) before or after it returns."""
        self.fs.sync_delay = 0.005

        async def go() -> None:
            futs = []
            for lid, entries in batches:
                request, misframed = self._batch(lid, entries, False)
                futs.append((request, misframed, self._submit(request)))
            for _ in range(steps):
                await asyncio.sleep(0)
            if steps == 4:
                await asyncio.sleep(0.006)  # the first sync returned: some are acknowledged
            self.bookie.crash()
            for request, misframed, fut in futs:
                self._judge_batch(request, misframed, await fut)

        self._unavailable_ok = True
        try:
            self.run(go())
        finally:
            self._unavailable_ok = False
            self.fs.sync_delay = 0.0
        self.fs.crash(mode, random.Random(seed))
        self.crashes += 1
        self.bookie = self._start()


BatchBookieMachine.TestCase.settings = BookieMachine.TestCase.settings
test_batched_bookie_state_machine = BatchBookieMachine.TestCase


class ChunkedBatchBookieMachine(BatchBookieMachine):
    """The same machine with batches of more than 3 entries admitted over several loop
    turns (pybk.bookie.turns), as the bookie admits batches of more than 2,048."""

    def _start(self):  # type: ignore[no-untyped-def]
        b = super()._start()
        b.admit_chunk = 3
        return b

    def _submit(self, request: AddBatchRequest) -> asyncio.Future[AddOutcome]:
        """As the base machine's, from inside the loop (where a server submits: the later
        chunks are scheduled on it)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            async def inside() -> AddOutcome:
                return await super(ChunkedBatchBookieMachine, self)._submit(request)

            return self.loop.create_task(inside())
        return super()._submit(request)


ChunkedBatchBookieMachine.TestCase.settings = BookieMachine.TestCase.settings
test_chunked_batched_bookie_state_machine = ChunkedBatchBookieMachine.TestCase
