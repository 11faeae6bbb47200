"""Index checkpoints are encoded in steps from a snapshot, so a bookie keeps serving while a big
index is written out, and the checkpoint is still exactly the index at its position."""

from __future__ import annotations

import asyncio
import uuid

from pybk.storage import MemFileSystem
from pybk.storage.checkpoint import CheckpointEncoder, decode_checkpoint
from pybk.storage.index import Index, Position
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=11, version=4))
KEY = b"k" * 32


def test_the_checkpoint_is_the_index_when_the_encoder_was_made():
    idx = Index()
    for lid in (1, 2, 3):
        for eid in (5, 0, 3, 1, 2, 4):  # out of order: the checkpoint lists ids ascending
            idx.put_entry(lid, eid, (lid, 100 * eid, 10 + eid), eid - 1)
    idx.ledger(2).fenced = True
    idx.ledger(3).master_key = KEY
    pos = Position(7, 999, 12)
    encoder = CheckpointEncoder(idx, pos)
    expected = CheckpointEncoder(idx, pos).result()  # the same state, encoded in one go
    # the index moves on while the encoder works
    idx.put_entry(1, 6, (8, 10, 10), 5)
    idx.put_entry(3, 3, (8, 30, 13), 2)  # moved (compaction rewrites live entries)
    idx.ledger(3).entries.snapshot()  # someone orders the ids meanwhile (a listing)
    idx.delete_ledger(2)
    idx.put_entry(4, 0, (8, 20, 10), -1)
    idx.ledger(1).fenced = True
    steps = list(encoder.steps(entries_per_step=4))
    assert len(steps) >= 3  # it did yield between steps
    assert encoder.result() == expected
    cp = decode_checkpoint(expected, "cp")
    back, back_pos = cp.build_index(), cp.position
    assert back_pos == pos and sorted(back.ledgers) == [1, 2, 3]
    assert list(back.ledgers[1].entries) == [0, 1, 2, 3, 4, 5]
    assert back.ledgers[2].fenced and not back.is_deleted(2)
    assert back.ledgers[3].master_key == KEY
    back._check()


async def test_a_store_keeps_serving_while_a_big_checkpoint_is_encoded(monkeypatch):
    fs = MemFileSystem()
    s = LedgerStore(fs, "/data", IID, StoreConfig())
    await s.open()
    # many ledgers (Python work per ledger; a ledger's dense columns are copied at C speed):
    # more than two encoding steps
    dms = [DigestManager(lid) for lid in range(2000)]
    for eid in range(20):
        for lid, dm in enumerate(dms):
            s.add_entry(lid, eid, dm.frame(eid, eid - 1, 0, b"x"), KEY, False,
                        lambda _e: None)
    await asyncio.wait_for(s.journal.drain(), 30)
    turns = 0

    async def other_work() -> None:
        nonlocal turns
        while not checkpoint.done():
            turns += 1
            await asyncio.sleep(0)

    seen: list[int] = []  # the other task's progress at each encoding step
    steps = CheckpointEncoder.steps

    def watched_steps(self, entries_per_step: int = 16384):  # type: ignore[no-untyped-def]
        for done in steps(self, entries_per_step):
            seen.append(turns)
            yield done

    monkeypatch.setattr(CheckpointEncoder, "steps", watched_steps)
    checkpoint = asyncio.ensure_future(s.checkpoint())
    await asyncio.wait_for(asyncio.gather(checkpoint, other_work()), 30)
    assert len(seen) >= 2 and seen[-1] > seen[0]  # other work ran between encoding steps
    # and what it wrote is the whole index at its position
    again = LedgerStore(fs, "/data", IID, StoreConfig())
    await s.close()
    await again.open()
    assert again.read(1999, 19) == dms[1999].frame(19, 18, 0, b"x")
    assert sum(len(st.entries) for st in again.index.ledgers.values()) == 40_000
    await again.close()
