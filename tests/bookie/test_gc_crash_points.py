"""Crash points of the garbage collector's own run (``GarbageCollector.run``, what its timer
calls): ledgers the metadata no longer has are collected and their segments compacted away
while writes go on; the disk is crashed at every mutating boundary in every mode, and the
restarted bookie must hold every acknowledged entry of the live ledgers, and say
NO_SUCH_LEDGER or hold exactly what was written for the collected ones."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from pybk.bookie import Bookie, BookieConfig
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.storage import MemFileSystem, SimulatedCrash
from pybk.wire import AddRequest, ReadRequest, Status

from .test_crash_points import KEY, Crashed, Injector, Model, body

LIVE = (1, 2)
GONE = (3, 5)
# (ledgers 3 and 5 never were in the metadata: adds of them are not checked here)
CONFIG = BookieConfig(segment_size=1500, disk_check_interval=0, checkpoint_interval=0,
                      gc_interval=0, gc_min_ledger_age=0, gc_major_threshold=0.9,
                      gc_compaction_rate=0, check_unknown_ledgers=False)
PREALLOCATED = dataclasses.replace(CONFIG, journal_preallocate=True,
                                   journal_overlap_syncs=True, journal_overlap_split_min=2)
CONFIGS = pytest.mark.parametrize("config", [CONFIG, PREALLOCATED],
                                  ids=["serial", "preallocated"])


async def metadata() -> MemoryMetadataStore:
    meta = MemoryMetadataStore()
    for lid in LIVE:
        await meta.create_ledger(LedgerMetadata(lid, 1, 1, 1, {0: ("b1",)}))
    return meta


async def workload(fs: MemFileSystem, meta: MemoryMetadataStore, inj: Injector, m: Model,
                   started: list[Bookie], config: BookieConfig) -> None:
    def check() -> None:
        if inj.fired:
            raise Crashed

    async def add(b: Bookie, lid: int, eid: int) -> None:
        m.tried[(lid, eid)] = body(lid, eid)
        r = await b.handle(AddRequest(lid, eid, KEY, body(lid, eid)))
        if r.status == Status.OK:
            m.acked[(lid, eid)] = body(lid, eid)

    b = Bookie("b1", "/d", fs=fs, config=config, cookie_store=meta, rng=random.Random(5))
    started.append(b)
    try:
        await b.start()
    except SimulatedCrash:
        raise Crashed from None
    for e in range(40):
        await add(b, (1, 3, 5, 2)[e % 4], e)
        check()
    assert b.gc is not None
    m.delete_tried.update(GONE)
    try:  # the collector's run, with writes going on beside it
        await asyncio.gather(b.gc.run(force=True), *(add(b, 1, 100 + e) for e in range(5)))
    except Exception:
        check()
        raise
    check()
    await asyncio.gather(*(add(b, 2, 200 + e) for e in range(3)))
    check()
    try:
        await b.stop()
    except SimulatedCrash:
        raise Crashed from None


async def verify(fs: MemFileSystem, meta: MemoryMetadataStore, m: Model,
                 config: BookieConfig) -> list[tuple[Status, bytes | None]]:
    b = Bookie("b1", "/d", fs=fs, config=dataclasses.replace(config, gc_interval=0),
               cookie_store=meta, rng=random.Random(5))
    await b.start()
    try:
        b._check()
        answers = []
        for (lid, eid), data in sorted(m.tried.items()):
            r = await b.handle(ReadRequest(lid, eid))
            answers.append((r.status, r.body))
            if (lid, eid) in m.acked and lid in LIVE:
                assert (r.status, r.body) == (Status.OK, data), (lid, eid, r)
            else:
                assert r.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER) or (
                    r.status == Status.OK and r.body == data), (lid, eid, r)
        return answers
    finally:
        b.crash()


async def run_point(at: int | None, mode: str, config: BookieConfig) -> tuple[bool, int]:
    fs = MemFileSystem()
    meta = await metadata()
    inj = Injector(at)
    fs.fault_hook = inj
    m = Model()
    started: list[Bookie] = []
    try:
        await workload(fs, meta, inj, m, started, config)
    except Crashed:
        for b in started:
            b.crash()
    fs.fault_hook = None
    fs.crash(mode, random.Random(at or 0))
    first = await verify(fs, meta, m, config)
    fs.crash("drop")
    assert first == await verify(fs, meta, m, config)
    return inj.fired, inj.count


@CONFIGS
async def test_the_collectors_run_survives_a_crash_at_every_boundary(config):
    fired, total = await run_point(None, "drop", config)
    assert not fired and total >= 60, total
    for at in range(total):
        for mode in ("drop", "torn", "reorder"):
            fired, _ = await run_point(at, mode, config)
            assert fired


async def test_the_uncrashed_run_collected_and_compacted():
    fs = MemFileSystem()
    meta = await metadata()
    inj = Injector(None)
    m = Model()
    started: list[Bookie] = []
    await workload(fs, meta, inj, m, started, CONFIG)
    gc = started[0].gc
    assert gc is not None
    assert gc.stats.ledgers_removed == 2 and gc.stats.segments_compacted > 0
    for lid in GONE:
        b = Bookie("b1", "/d", fs=fs, config=CONFIG, cookie_store=meta)
        await b.start()
        assert (await b.handle(ReadRequest(lid, 2))).status == Status.NO_SUCH_LEDGER
        await b.stop()
