"""A hypothesis state machine over one bookie on a MemFileSystem, checked against a model.

Rules: adds (single and concurrent, normal and recovery, sometimes with conflicting bytes),
reads, fences, explicit LAC writes, deletions, compactions, checkpoints, clean restarts, and
crashes (drop / torn / reorder) taken while adds are in flight. Invariants after every step:
the bookie's own ``_check()``; every acknowledged add reads back with identical bytes (unless
its ledger's deletion was requested); nothing unacknowledged ever reads back as other bytes or
as corruption; acknowledged fences and deletions survive every crash.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pybk.bookie import Bookie, BookieConfig
from pybk.bookie.inspect import inspect_data_dir
from pybk.storage import MemFileSystem
from pybk.wire import (
    AddRequest,
    DigestManager,
    FenceRequest,
    ReadLacRequest,
    ReadRequest,
    Status,
    WriteLacRequest,
    master_key,
)

KEY = master_key(b"s")
LEDGERS = st.integers(0, 3)
#: mostly near ids, in any order (the index's dense run, its holes, ids before its start), and
#: now and then ids far past them (the index's sparse part)
ENTRIES = st.sampled_from([*range(13), 100, 150])
CONFIG = BookieConfig(segment_size=900, disk_check_interval=0, checkpoint_interval=0)


def body(lid: int, eid: int, variant: int) -> bytes:
    return DigestManager(lid).frame(eid, eid - 1, 0, bytes([variant, lid, eid]) * (5 + eid))


@dataclass
class Model:
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    tried: dict[tuple[int, int], set[bytes]] = field(default_factory=dict)
    fenced: set[int] = field(default_factory=set)
    fence_tried: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    delete_tried: set[int] = field(default_factory=set)
    lac_bodies: dict[int, set[bytes]] = field(default_factory=dict)


class BookieMachine(RuleBasedStateMachine):
    config = CONFIG
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.fs = MemFileSystem()
        self.m = Model()
        self.crashes = 0
        self._unavailable_ok = False
        self._disk_full = False
        self.bookie = self._start()

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def _start(self) -> Bookie:
        b = Bookie("b1", "/d", fs=self.fs, config=self.config, rng=random.Random(3))
        self.run(b.start())
        return b

    def teardown(self) -> None:
        self.bookie.crash()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()

    # ---------------------------------------------------------------- helpers

    async def _add(self, lid: int, eid: int, variant: int, recovery: bool) -> Status:
        data = body(lid, eid, variant)
        self.m.tried.setdefault((lid, eid), set()).add(data)
        r = await self.bookie.handle(AddRequest(lid, eid, KEY, data, recovery))
        self._judge_add(lid, eid, data, recovery, r.status)
        return r.status

    def _judge_add(self, lid: int, eid: int, data: bytes, recovery: bool, status: Status) -> None:
        m = self.m
        if status == Status.OK:
            if lid in m.deleted:
                raise AssertionError(f"add to deleted ledger {lid} accepted")
            if lid in m.fenced and not recovery:
                raise AssertionError(f"normal add to fenced ledger {lid} accepted")
            prior = m.acked.get((lid, eid))
            assert prior is None or prior == data, "conflicting bytes acknowledged"
            m.acked[(lid, eid)] = data
        elif status == Status.ENTRY_EXISTS:
            pass  # another variant may be held (acknowledged or not)
        elif status == Status.FENCED:
            assert lid in m.fence_tried or lid in m.delete_tried, (lid, status)
        elif status == Status.UNAVAILABLE and self._unavailable_ok:
            pass  # the bookie crashed with this add in flight: not acknowledged
        elif status == Status.READ_ONLY and self._disk_full:
            pass  # ENOSPC / watermark: not acknowledged
        else:
            raise AssertionError(f"unexpected add status {status!r}")

    # ---------------------------------------------------------------- rules

    @rule(lid=LEDGERS, eid=ENTRIES, variant=st.integers(0, 1), recovery=st.booleans())
    def add(self, lid: int, eid: int, variant: int, recovery: bool) -> None:
        self.run(self._add(lid, eid, variant, recovery))

    @rule(adds=st.lists(st.tuples(LEDGERS, ENTRIES, st.integers(0, 1)), min_size=2,
                        max_size=12))
    def add_concurrently(self, adds: list[tuple[int, int, int]]) -> None:
        async def go() -> None:
            await asyncio.gather(*(self._add(lid, eid, v, False) for lid, eid, v in adds))

        self.run(go())

    @rule(adds=st.lists(st.tuples(LEDGERS, ENTRIES, st.integers(0, 1)), min_size=1,
                        max_size=8),
          steps=st.integers(0, 6), mode=st.sampled_from(["drop", "torn", "reorder"]),
          seed=st.integers(0, 1000))
    def crash_during_adds(self, adds: list[tuple[int, int, int]], steps: int, mode: str,
                          seed: int) -> None:
        async def go() -> None:
            tasks = [asyncio.ensure_future(self._add(lid, eid, v, False))
                     for lid, eid, v in adds]
            for _ in range(steps):
                await asyncio.sleep(0)
            self.bookie.crash()
            for result in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(result, BaseException):
                    raise result

        self._unavailable_ok = True
        try:
            self.run(go())
        finally:
            self._unavailable_ok = False
        self.fs.crash(mode, random.Random(seed))
        self.crashes += 1
        self.bookie = self._start()

    @rule(adds=st.lists(st.tuples(LEDGERS, ENTRIES, st.integers(0, 1)), min_size=1,
                        max_size=6),
          fence_lid=LEDGERS, room=st.integers(0, 400))
    def disk_fills_up(self, adds: list[tuple[int, int, int]], fence_lid: int, room: int) -> None:
        """The disk fills (ENOSPC mid-batch, or the watermark), then space returns."""
        fs = self.fs
        used = fs.capacity - fs.disk_usage("/")[0]
        saved = fs.capacity
        fs.set_capacity(used + room)
        self._disk_full = True

        async def go() -> None:
            tasks = [self._add(lid, eid, v, False) for lid, eid, v in adds]
            self.m.fence_tried.add(fence_lid)
            fence = self.bookie.handle(FenceRequest(fence_lid, KEY))
            *_, r = await asyncio.gather(*tasks, fence)
            if r.status == Status.OK:
                self.m.fenced.add(fence_lid)
            else:
                assert r.status in (Status.READ_ONLY, Status.NO_SUCH_LEDGER), r

        try:
            self.run(go())
        finally:
            self._disk_full = False
            fs.set_capacity(saved)
        self.bookie.check_disk()
        assert self.bookie.state == "writable", self.bookie.state_reason

    @rule(lid=LEDGERS, eid=st.integers(-1, 12))
    def read(self, lid: int, eid: int) -> None:
        r = self.run(self.bookie.handle(ReadRequest(lid, eid)))
        self._check_read(lid, eid, r.status, r.body, r.entry_id)

    def _check_read(self, lid: int, eid: int, status: Status, data: bytes | None,
                    got_eid: int) -> None:
        m = self.m
        assert status != Status.CORRUPT, "crash produced corruption"
        if lid in m.deleted:
            assert status == Status.NO_SUCH_LEDGER, (lid, eid, status)
            return
        if eid == -1:
            if status == Status.OK:
                eid = got_eid
                assert data is not None and data in m.tried.get((lid, eid), set())
                higher = [e for (l2, e) in m.acked if l2 == lid and e > eid]
                assert not higher or lid in m.delete_tried, (lid, eid, higher)
            else:
                assert status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER), status
                assert lid in m.delete_tried or not any(l2 == lid for (l2, _) in m.acked)
            return
        acked = m.acked.get((lid, eid))
        if acked is not None and lid not in m.delete_tried:
            assert (status, data) == (Status.OK, acked), (lid, eid, status)
        elif status == Status.OK:
            assert data in m.tried.get((lid, eid), set()), "never-written bytes returned"
        else:
            assert status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER), status

    @rule(lid=LEDGERS)
    def fence(self, lid: int) -> None:
        self.m.fence_tried.add(lid)
        r = self.run(self.bookie.handle(FenceRequest(lid, KEY)))
        if r.status == Status.OK:
            assert lid not in self.m.deleted
            self.m.fenced.add(lid)
        else:
            assert r.status == Status.NO_SUCH_LEDGER and lid in self.m.delete_tried, r

    @rule(lid=LEDGERS, lac=st.integers(-1, 12))
    def write_lac(self, lid: int, lac: int) -> None:
        data = DigestManager(lid).frame_lac(lac)
        self.m.lac_bodies.setdefault(lid, set()).add(data)
        r = self.run(self.bookie.handle(WriteLacRequest(lid, lac, KEY, data)))
        assert r.status == Status.OK or (r.status == Status.FENCED
                                         and lid in self.m.delete_tried), r

    @rule(lid=LEDGERS)
    def read_lac(self, lid: int) -> None:
        r = self.run(self.bookie.handle(ReadLacRequest(lid)))
        if r.status == Status.OK:
            assert r.lac_body is None or r.lac_body in self.m.lac_bodies.get(lid, set())
        else:
            assert r.status == Status.NO_SUCH_LEDGER, r

    @rule(lid=LEDGERS)
    def delete(self, lid: int) -> None:
        self.m.delete_tried.add(lid)
        self.run(self.bookie.delete_ledger(lid))
        self.m.deleted.add(lid)

    @rule(threshold=st.sampled_from([0.3, 0.9, 1.0]))
    def compact(self, threshold: float) -> None:
        self.run(self.bookie.compact(threshold))

    @rule()
    def checkpoint(self) -> None:
        self.run(self.bookie.checkpoint())

    @rule()
    def clean_restart(self) -> None:
        self.run(self.bookie.stop())
        self.bookie = self._start()

    @precondition(lambda self: self.crashes < 6)
    @rule(mode=st.sampled_from(["drop", "torn", "reorder"]), seed=st.integers(0, 1000))
    def crash_restart(self, mode: str, seed: int) -> None:
        self.bookie.crash()
        self.fs.crash(mode, random.Random(seed))
        self.crashes += 1
        self.bookie = self._start()

    # ---------------------------------------------------------------- invariants

    @invariant()
    def internal_invariants(self) -> None:
        self.bookie._check()
        self.fs._check()

    @invariant()
    def acknowledged_entries_readable(self) -> None:
        for (lid, eid), data in self.m.acked.items():
            if lid in self.m.delete_tried:
                continue
            r = self.run(self.bookie.handle(ReadRequest(lid, eid)))
            assert (r.status, r.body) == (Status.OK, data), (lid, eid, r)

    @invariant()
    def the_directory_is_sound_and_the_checkpoint_chain_matches_the_segments(self) -> None:
        # the offline inspection: every segment verifies, and the checkpoint chain plus the
        # journal after it is the index a rebuild from every segment gives
        report = inspect_data_dir(self.fs, "/d")
        assert report.ok, report.problems

    @invariant()
    def fences_hold(self) -> None:
        for lid in self.m.fenced:
            if lid in self.m.delete_tried:
                continue
            st_ = self.bookie.store.index.get(lid) if self.bookie.store else None
            assert st_ is not None and st_.fenced, lid


BookieMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_bookie_state_machine = BookieMachine.TestCase


class OverlappedBookieMachine(BookieMachine):
    """The same machine over an overlapped journal: a batch is completed while the next one
    syncs, and buffers of four or more records are split in two."""

    config = BookieConfig(segment_size=900, disk_check_interval=0, checkpoint_interval=0,
                          journal_overlap_syncs=True, journal_overlap_split_min=2)


OverlappedBookieMachine.TestCase.settings = BookieMachine.TestCase.settings
test_overlapped_bookie_state_machine = OverlappedBookieMachine.TestCase


class PreallocatedBookieMachine(BookieMachine):
    """The same machine over preallocated segments written in place (overlapped, as in a
    ``pybk bookie`` process): crashes then also hit half-made segment files and in-place
    writes, whose unsynced bytes a crash drops, tears or reorders over the zeros."""

    config = BookieConfig(segment_size=900, disk_check_interval=0, checkpoint_interval=0,
                          journal_overlap_syncs=True, journal_overlap_split_min=2,
                          journal_preallocate=True)


PreallocatedBookieMachine.TestCase.settings = BookieMachine.TestCase.settings
test_preallocated_bookie_state_machine = PreallocatedBookieMachine.TestCase


class DeltaChainBookieMachine(BookieMachine):
    """The same machine with index checkpoints kept as delta chains (a new base every fourth
    checkpoint): crashes, compactions, deletions and full disks meet chains of deltas, and
    the invariants check after every step that the chain plus the journal after it is the
    index the segments hold."""

    config = BookieConfig(segment_size=900, disk_check_interval=0, checkpoint_interval=0,
                          checkpoint_delta_ratio=1e9, checkpoint_max_deltas=3)


DeltaChainBookieMachine.TestCase.settings = BookieMachine.TestCase.settings
test_delta_chain_bookie_state_machine = DeltaChainBookieMachine.TestCase
