"""Bookie requests through ``handle()``: adds and reads, what is durable when acknowledged
(group commit, crashes), bad and unknown requests, duplicate adds (R10). Each bad input gets
a clear status and loses nothing acknowledged."""

from __future__ import annotations

import asyncio

from pybk.bookie import WRITABLE
from pybk.testing.mutations import ACK_BEFORE_FSYNC, Mutations
from pybk.wire import (
    AuthRequest,
    BookieInfoRequest,
    DigestManager,
    ListEntriesRequest,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    Status,
)

# --------------------------------------------------------------------------- basics


async def test_add_then_read_back_identical_bytes(harness):
    bodies = {e: harness.frame(1, e) for e in range(5)}
    for e, body in bodies.items():
        assert await harness.add(1, e, body) == Status.OK
    for e, body in bodies.items():
        assert await harness.read(1, e) == (Status.OK, body)
    resp = await harness.bookie.handle(ReadRequest(1, -1))
    assert (resp.status, resp.entry_id, resp.body) == (Status.OK, 4, bodies[4])


async def test_absent_entry_and_ledger_are_told_apart(harness):
    await harness.add(1, 0)
    assert (await harness.read(1, 7))[0] == Status.NO_SUCH_ENTRY
    assert (await harness.read(2, 0))[0] == Status.NO_SUCH_LEDGER
    assert (await harness.read(2, -1))[0] == Status.NO_SUCH_LEDGER


async def test_add_with_mismatched_framing_is_a_bad_request(harness):
    assert await harness.add(1, 0, harness.frame(1, 5)) == Status.BAD_REQUEST
    assert await harness.add(1, 0, harness.frame(2, 0)) == Status.BAD_REQUEST
    assert await harness.add(1, 0, b"short") == Status.BAD_REQUEST
    assert (await harness.read(1, 0))[0] == Status.NO_SUCH_LEDGER


async def test_negative_entry_id_is_a_bad_request(harness):
    body = DigestManager(1).frame(-5, -1, 0, b"x")
    assert await harness.add(1, -5, body) == Status.BAD_REQUEST
    assert await harness.add(1, 0) == Status.OK  # nothing else disturbed


async def test_acked_adds_survive_a_crash_that_drops_unsynced_data(harness):
    for e in range(20):
        assert await harness.add(e % 3, e) == Status.OK
    await harness.crash_restart("drop")
    for e in range(20):
        assert await harness.read(e % 3, e) == (Status.OK, harness.frame(e % 3, e))


async def test_group_commit_shares_fsyncs_between_concurrent_adds(harness):
    before = harness.fs.counters["sync"]
    statuses = await asyncio.gather(*(harness.add(1, e) for e in range(200)))
    assert set(statuses) == {Status.OK}
    syncs = harness.fs.counters["sync"] - before
    assert 1 <= syncs <= 5, syncs


async def test_an_add_is_not_acknowledged_before_its_fsync(harness):
    fs = harness.fs
    order: list[str] = []
    fs.fault_hook = lambda op, path: order.append(op) if path.endswith(".seg") else None
    task = asyncio.ensure_future(harness.add(1, 0))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not task.done()  # written (maybe) but not synced yet
    assert await task == Status.OK
    assert order[-2:] == ["write", "sync"]


async def test_ack_before_fsync_mutation_loses_acked_entries(harness):
    await harness.restart_with(mutations=Mutations(ACK_BEFORE_FSYNC))
    harness.fs.sync_delay = 0.001
    assert await harness.add(1, 0) == Status.OK
    await harness.crash_restart("drop")  # the sync was still in flight
    assert (await harness.read(1, 0))[0] == Status.NO_SUCH_LEDGER


async def test_stopped_bookie_answers_unavailable(harness):
    await harness.bookie.stop()
    assert await harness.add(1, 0) == Status.UNAVAILABLE
    assert harness.bookie.state == "stopped"


async def test_auth_request_is_a_bad_request_for_a_bookie(harness):
    resp = await harness.bookie.handle(AuthRequest(b"token"))
    assert resp.status == Status.BAD_REQUEST


async def test_unexpected_exception_becomes_io_error_and_bookie_keeps_serving(harness,
                                                                           monkeypatch):
    await harness.add(1, 0)

    def boom(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr(harness.bookie.store, "ranges", boom)
    resp = await harness.bookie.handle(ListEntriesRequest(1))
    assert resp.status == Status.IO_ERROR and "kaput" in resp.message
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))


async def test_list_entries_reports_ranges(harness):
    for e in [0, 1, 2, 5, 6, 9]:
        await harness.add(3, e)
    resp = await harness.bookie.handle(ListEntriesRequest(3))
    assert resp.ranges == ((0, 2), (5, 6), (9, 9))
    assert (await harness.bookie.handle(ListEntriesRequest(4))).status == Status.NO_SUCH_LEDGER


async def test_bookie_info(harness):
    resp = await harness.bookie.handle(BookieInfoRequest())
    assert resp.status == Status.OK and resp.state == WRITABLE
    assert 0 < resp.free_bytes <= resp.total_bytes and resp.bookie_id == "b1"


async def test_a_batched_read_of_absent_ids_is_charged_and_stops_early(harness):
    """Issue 34, item 2: every id of a batched read counts against the byte budgets (its
    answer costs something even when the entry is absent), and the answer stops after
    READ_MAX_ABSENT ids not held."""
    from pybk.bookie.sizing import READ_ENTRY_COST
    from pybk.storage.reads import READ_MAX_ABSENT

    await harness.add(1, 0)
    request = ReadBatchRequest(1, [0, *range(10, 10 + 65536)])
    hint = harness.bookie.response_size_hint(request)
    assert hint >= READ_MAX_ABSENT * READ_ENTRY_COST  # was 0 beyond the one entry held
    assert hint <= (READ_MAX_ABSENT + 1) * READ_ENTRY_COST + 4096
    resp = await harness.bookie.handle(request)
    assert isinstance(resp, ReadBatchResponse) and resp.status == Status.OK
    assert len(resp.entries) == 1 + READ_MAX_ABSENT
    assert resp.entries[0][1] == Status.OK
    assert {st for _e, st, _b in resp.entries[1:]} == {Status.NO_SUCH_ENTRY}


# --------------------------------------------------------------------------- duplicates (R10)


async def test_duplicate_add_identical_ok_different_rejected(harness):
    body = harness.frame(1, 0)
    assert await harness.add(1, 0, body) == Status.OK
    assert await harness.add(1, 0, body) == Status.OK
    other = harness.frame(1, 0, b"other bytes")
    assert await harness.add(1, 0, other) == Status.ENTRY_EXISTS
    assert await harness.read(1, 0) == (Status.OK, body)


async def test_duplicate_of_a_pending_add_waits_for_the_original(harness):
    body = harness.frame(1, 0)
    first = asyncio.ensure_future(harness.add(1, 0, body))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(harness.add(1, 0, body))
    different = await harness.add(1, 0, harness.frame(1, 0, b"x"))
    assert different == Status.ENTRY_EXISTS
    assert await first == Status.OK and await second == Status.OK
    assert harness.fs.counters["write"] >= 1
