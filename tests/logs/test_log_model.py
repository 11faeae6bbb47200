"""A hypothesis state machine: one log on an in-memory cluster of 4 real bookies, checked
against a list model.

Rules: appends (awaited one by one, in batches, or left in flight), flushes, rolls, writer
crashes followed by a takeover, readers from arbitrary positions, truncation, offloading the
completed segments to a tier (fsspec's memory filesystem; the bookies' copies deleted at
once, so readers read them from the tier), retention by size, and crash restarts of bookies
(one down at a time: E=3 of 4 bookies keeps writing). After every step:
positions handed out strictly increase; a reader from any position returns exactly the model's
records from there (every acknowledged record once, in order, nothing before the truncation
point); a tailing reader started at the beginning has seen every acknowledged record once, in
order. After a takeover the log holds every record the old writer had acknowledged, then
perhaps some it had sent without an answer (each at most once, in append order), and the new
writer's records follow them all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from logs_kit import FAST

from pybk import AlreadyTruncatedError, LogRecord, Position
from pybk.cluster import LocalCluster
from pybk.logs import OFFLOADED, LogWriter
from pybk.metadata.memory import MemoryMetadataStore
from pybk.storage.memfs import MemFileSystem

BOOKIES = [f"bookie-{i}" for i in range(4)]
#: the tailing reader is checked after every step: a short explicit LAC interval keeps the
#: wait for the writer's last record short (the mechanism is the same as the 0.2 s default)
CONFIG = dataclasses.replace(FAST, explicit_lac_interval=0.02)


class LogMachine(RuleBasedStateMachine):
    tiers = 0  # machines made (each offloads under a folder of its own)

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.cluster = LocalCluster("/c", BOOKIES, fs=MemFileSystem(),
                                    metadata=MemoryMetadataStore(), rng=random.Random(7),
                                    client_config=CONFIG)
        self.run(self.cluster.start())
        self.ns = self.cluster.client().namespace()
        self.log = self.run(self.ns.create_log("m", ensemble_size=3, write_quorum=3,
                                               ack_quorum=2, roll_entries=3))
        self.writer = self.run(self._new_writer())
        self.model: list[tuple[Position, bytes]] = []  # acknowledged, kept, in order
        self.inflight: list[tuple[bytes, asyncio.Future[Position]]] = []
        self.stale: list[asyncio.Future[Any]] = []  # futures of crashed writers
        self.truncated: Position | None = None
        self.counter = 0
        self.down: str | None = None
        self.seen: list[LogRecord] = []
        self.tail = self.loop.create_task(self._tail())
        self.takeovers = 0
        LogMachine.tiers += 1
        self.tier = f"memory://pybk-model-{LogMachine.tiers}"
        self.run(self.log.set_offload(self.tier, deletion_lag=0))
        self.offloaded: set[int] = set()  # segments read from the tier from now on

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    async def _new_writer(self) -> LogWriter:
        return await self.log.writer(flush_records=3)

    async def _tail(self) -> None:
        async for rec in self.log.reader():
            self.seen.append(rec)

    def _data(self) -> bytes:
        self.counter += 1
        return b"rec-%05d" % self.counter

    def _acked(self, data: bytes, pos: Position) -> None:
        assert not self.model or pos > self.model[-1][0], (pos, self.model[-1])
        self.model.append((pos, data))

    # -- rules -------------------------------------------------------------------------------

    @rule(n=st.integers(1, 4))
    def append_awaited(self, n: int) -> None:
        self._settle_inflight()
        for _ in range(n):
            data = self._data()
            self._acked(data, self.run(self.writer.append(data)))

    @rule(n=st.integers(1, 7))
    def append_many(self, n: int) -> None:
        self._settle_inflight()
        items = [self._data() for _ in range(n)]

        async def go() -> list[Position]:
            return await self.writer.append_many(items)

        positions = self.run(go())
        for data, pos in zip(items, positions, strict=True):
            self._acked(data, pos)

    @rule(n=st.integers(1, 6))
    def append_in_flight(self, n: int) -> None:
        async def go() -> None:
            for _ in range(n):
                data = self._data()
                self.inflight.append((data, self.writer.append(data)))

        self.run(go())

    @rule()
    def flush(self) -> None:
        self.run(self.writer.flush())
        self._settle_inflight()

    @rule()
    def roll(self) -> None:
        self._settle_inflight()
        before = self.writer.segment
        self.run(self.writer.roll())
        after = self.writer.segment
        assert before is not None and after is not None
        assert after.seq > before.seq or (self.writer._seg_entries == 0)

    def _settle_inflight(self) -> None:
        if not self.inflight:
            return
        self.run(self.writer.flush())
        for data, fut in self.inflight:
            self._acked(data, fut.result())
        self.inflight = []

    @rule()
    def crash_and_take_over(self) -> None:
        old = self.writer
        self.run(old.abort())
        unknown = [d for d, _ in self.inflight]
        self.stale.extend(f for _, f in self.inflight)
        self.inflight = []
        self.writer = self.run(self._new_writer())
        self.takeovers += 1
        # the log: the model, then perhaps some of the unanswered records, in append order
        last = self.run(self.log.last_position())
        got = self._read(None, last) if last is not None else []
        kept = len(self.model)
        assert [(r.position, r.data) for r in got[:kept]] == self.model, "lost acknowledged"
        extra = [r.data for r in got[kept:]]
        assert extra == [d for d in unknown if d in set(extra)], (extra, unknown)
        for r in got[kept:]:
            self._acked(r.data, r.position)
        # the new writer's first record follows all of them
        data = self._data()
        self._acked(data, self.run(self.writer.append(data)))

    @rule(data=st.data())
    def read_from_anywhere(self, data: st.DataObject) -> None:
        self._settle_inflight()
        self._sync_truncation()
        if not self.model:
            return
        i = data.draw(st.integers(0, len(self.model) - 1))
        start = self.model[i][0]
        if data.draw(st.booleans()):  # a position between records
            start = start.next_slot()
            i += 1
        got = self._read(start, self.model[-1][0])
        assert [(r.position, r.data) for r in got] == self.model[i:]

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        self._settle_inflight()
        if not self.model:
            return
        self._catch_up_tail()
        i = data.draw(st.integers(0, len(self.model) - 1))
        cut = self.model[i][0]
        self.run(self.writer.truncate(cut))
        if self.truncated is None or cut > self.truncated:
            self.truncated = cut
        self.model = [(p, d) for p, d in self.model if p >= self.truncated]
        if Position(1, 0, 0) < self.truncated:
            with pytest.raises(AlreadyTruncatedError):
                self.run(self.log.reader(Position(1, 0, 0)).__anext__())

    @rule()
    def offload(self) -> None:
        self._settle_inflight()
        done = self.run(self.log.offload())
        segments = {s.seq: s for s in self.run(self.log.segments())}
        for seq in done:
            assert segments[seq].tier == OFFLOADED, segments[seq]
        self.offloaded.update(done)

    @rule(max_bytes=st.integers(1, 120))
    def retention_by_size(self, max_bytes: int) -> None:
        self._settle_inflight()
        self._catch_up_tail()
        self.run(self.log.set_retention(max_bytes=max_bytes))
        self.run(self.log.apply_retention())
        self.run(self.log.set_retention(max_bytes=None))
        self._sync_truncation()

    def _sync_truncation(self) -> None:
        """Take a truncation retention made (here, or a roll's round that ran meanwhile)."""
        cut = self.run(self.log.metadata()).truncated_before
        if cut is None or (self.truncated is not None and cut <= self.truncated):
            return
        assert cut.entry == 0 and cut.slot == 0, "retention cut inside a segment"
        current = self.writer.segment
        assert current is None or cut.segment <= current.seq, "the open segment was cut"
        self.truncated = cut
        self.model = [(p, d) for p, d in self.model if p >= cut]

    @precondition(lambda self: self.down is None)
    @rule(which=st.sampled_from(BOOKIES))
    def stop_bookie(self, which: str) -> None:
        self.run(self.cluster.stop_bookie(which))
        self.down = which

    @precondition(lambda self: self.down is not None)
    @rule()
    def start_bookie(self) -> None:
        assert self.down is not None
        self.run(self.cluster.start_bookie(self.down))
        self.down = None

    # -- checks ------------------------------------------------------------------------------

    def _read(self, start: Position | None, stop: Position) -> list[LogRecord]:
        async def go() -> list[LogRecord]:
            return [r async for r in self.log.reader(start, stop_at=stop)]

        return list(self.run(go()))

    def _catch_up_tail(self) -> None:
        if not self.model:
            return
        last = self.model[-1][0]

        async def wait() -> None:
            while not self.seen or self.seen[-1].position < last:
                if self.tail.done():
                    self.tail.result()
                await asyncio.sleep(0.005)

        self.run(wait())

    @invariant()
    def writer_is_consistent(self) -> None:
        self.writer._check()
        assert self.writer.error is None, self.writer.error

    @invariant()
    def tail_saw_every_acknowledged_record_once_in_order(self) -> None:
        self._catch_up_tail()
        positions = [r.position for r in self.seen]
        assert positions == sorted(set(positions)), "the tail repeated or reordered records"
        mine = {p: d for p, d in self.model}
        for r in self.seen:
            if r.position in mine:
                assert mine[r.position] == r.data
        kept = [r for r in self.seen if self.truncated is None or r.position >= self.truncated]
        assert [(r.position, r.data) for r in kept][:len(self.model)] == self.model

    def teardown(self) -> None:
        self.tail.cancel()

        async def close() -> None:
            await asyncio.gather(self.tail, return_exceptions=True)
            await self.writer.abort()
            await asyncio.gather(*self.stale, *(f for _, f in self.inflight),
                                 return_exceptions=True)
            await self.cluster.close()

        try:
            self.loop.run_until_complete(asyncio.wait_for(close(), 30))
        finally:
            self.loop.close()
            import fsspec

            fs = fsspec.filesystem("memory")
            if fs.exists(self.tier):
                fs.rm(self.tier, recursive=True)


LogMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=25, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
test_log_against_a_list_model = LogMachine.TestCase
