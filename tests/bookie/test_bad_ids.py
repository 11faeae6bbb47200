"""Ids and keys a bookie must refuse at the door: negative ledger or entry ids, an explicit
LAC below -1, a master key too long to record. Each is a bad request answered with a clear
error, and nothing is stored (the wire format carries signed 64-bit ids and a 32-bit key
length, so any of these can come from the network)."""

from __future__ import annotations

import pytest
from storage_kit import KEY as STORE_KEY
from storage_kit import fill, open_store

from pybk.errors import BadRequestError
from pybk.storage import MemFileSystem
from pybk.storage.records import encode_entry, encode_master_key
from pybk.storage.store import MAX_MASTER_KEY_SIZE
from pybk.wire import (
    AddRequest,
    DigestManager,
    FenceRequest,
    ReadRequest,
    Status,
    WriteLacRequest,
)

from .conftest import KEY, frame


def framed(ledger_id: int, entry_id: int) -> bytes:
    return DigestManager(ledger_id).frame(entry_id, entry_id - 1, 0, b"payload")


def frame_lac(ledger_id: int, lac: int) -> bytes:
    return DigestManager(ledger_id).frame_lac(lac)


@pytest.mark.parametrize("request_", [
    AddRequest(-1, 0, KEY, framed(-1, 0)),
    AddRequest(-2**63, 0, KEY, framed(-2**63, 0)),
    AddRequest(1, -5, KEY, framed(1, -5)),
    AddRequest(2, 0, b"k" * (MAX_MASTER_KEY_SIZE + 1), framed(2, 0)),
    FenceRequest(-3, KEY),
    FenceRequest(3, b"k" * 70_000),
    ReadRequest(-4, 0, fence=True, master_key=KEY),
    WriteLacRequest(-5, 0, KEY, frame_lac(-5, 0)),
    WriteLacRequest(5, -7, KEY, frame_lac(5, -7)),
], ids=["ledger-1", "ledger-min", "entry-5", "long-key-add", "fence-negative",
        "fence-long-key", "fencing-read-negative", "lac-negative-ledger", "lac-below-minus-one"])
async def test_bad_ids_and_keys_are_bad_requests_and_store_nothing(harness, request_):
    b = harness.bookie
    resp = await b.handle(request_)
    assert resp.status == Status.BAD_REQUEST, resp
    assert "negative" in resp.message or "master key" in resp.message or "LAC" in resp.message
    assert b.store is not None
    assert b.store.ledger_ids() == []  # no ledger state was made for it
    # and the bookie keeps taking good writes, and keeps them across a restart
    assert await harness.add(7, 0) == Status.OK
    b = await harness.crash_restart()
    assert b.store is not None and b.store.ledger_ids() == [7]
    assert await harness.read(7, 0) == (Status.OK, frame(7, 0))


async def test_a_key_of_the_largest_size_is_recorded_and_checkpointed(harness):
    key = b"k" * MAX_MASTER_KEY_SIZE
    assert await harness.add(8, 0, key=key) == Status.OK
    b = harness.bookie
    assert b.store is not None
    await b.store.checkpoint()  # (a key's length is 16 bits in a checkpoint)
    b = await harness.crash_restart()
    assert b.store is not None and b.store.report.checkpoint_loaded
    assert await harness.add(8, 1, key=key) == Status.OK
    assert await harness.add(8, 2) == Status.UNAUTHORIZED


async def test_deleting_a_negative_ledger_id_is_a_bad_request(harness):
    b = harness.bookie
    assert b.store is not None
    with pytest.raises(BadRequestError, match="never negative"):
        await b.store.delete_ledger(-1)
    assert not b.store.index.deleted


async def test_a_negative_ledger_written_before_the_door_check_compacts_and_stays_readable():
    """Earlier builds took negative ledger ids, and compaction mistook their records for the
    checkpoint marks (the one record of no ledger): it failed for good on any segment holding
    one ("still referenced after compaction"), so the disk was never reclaimed. Such records
    are in a data directory as plain entries; compaction must carry them like any other."""
    fs = MemFileSystem()
    s = await open_store(fs)
    await s.journal.append(encode_master_key(-1, STORE_KEY))
    for eid in range(30):  # what an earlier build wrote for add(-1, eid)
        await s.journal.append(encode_entry(framed(-1, eid)))
    await fill(s, 5, range(200))
    await s.close()
    for name in fs.listdir("/data"):  # (the index never saw them: rebuild from the segments)
        if name.startswith("index.ckpt"):
            fs.delete(f"/data/{name}")
    s = await open_store(fs)  # replay indexes ledger -1 like any other
    assert -1 in s.ledger_ids()
    await s.delete_ledger(5)
    result = await s.compact(0.9)
    assert result.segments_compacted, result
    for eid in range(30):
        assert s.read(-1, eid) == framed(-1, eid)
    await s.close()
    s = await open_store(fs)
    assert [s.read(-1, eid) for eid in range(30)] == [framed(-1, eid) for eid in range(30)]
    await s.close()
