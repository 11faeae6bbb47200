"""``Bookie.add_nowait``: the callback path gives the same answers as ``handle()``, exactly
once, and acknowledges only what is durable."""

from __future__ import annotations

import asyncio
import random

from pybk.bookie import Bookie, BookieConfig
from pybk.storage import MemFileSystem
from pybk.wire import AddRequest, AddResponse, FenceRequest, Response, Status

from .conftest import DATA_DIR, KEY, frame


async def nowait(bookie: Bookie, request: AddRequest) -> Response:
    """Drive add_nowait; fail if the reply comes more than once."""
    replies: list[Response] = []
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def reply(response: Response) -> None:
        replies.append(response)
        if not done.done():
            done.set_result(None)

    bookie.add_nowait(request, reply)
    await asyncio.wait_for(done, 5)
    for _ in range(5):  # a second reply would come within a few loop iterations
        await asyncio.sleep(0)
    assert len(replies) == 1, replies
    return replies[0]


async def test_same_answers_as_handle(harness):
    b = harness.bookie
    ok = await nowait(b, AddRequest(1, 0, KEY, frame(1, 0)))
    assert ok == AddResponse(Status.OK, 1, 0)
    assert await harness.read(1, 0) == (Status.OK, frame(1, 0))
    cases = [
        AddRequest(1, 0, KEY, frame(1, 0, b"other")),  # different bytes
        AddRequest(1, 1, b"wrong key", frame(1, 1)),
        AddRequest(1, 1, KEY, frame(1, 5)),  # framing disagrees
        AddRequest(1, 1, KEY, b"short"),
        AddRequest(1, 0, KEY, frame(1, 0)),  # identical re-add
    ]
    for req in cases:
        slow = await b.handle(req)
        fast = await nowait(b, req)
        assert (fast.status, fast.message) == (slow.status, slow.message), req
    assert (await b.handle(FenceRequest(1, KEY))).status == Status.OK
    fenced = await nowait(b, AddRequest(1, 2, KEY, frame(1, 2)))
    assert fenced.status == Status.FENCED
    recovery = await nowait(b, AddRequest(1, 2, KEY, frame(1, 2), recovery=True))
    assert recovery.status == Status.OK


async def test_reply_only_after_the_fsync(harness_cls):
    fs = MemFileSystem()
    fs.sync_delay = 0.01  # a slow (virtual or real) disk: the thread path
    h = harness_cls(fs=fs)
    b = await h.start()
    replies: list[Response] = []
    b.add_nowait(AddRequest(7, 0, KEY, frame(7, 0)), replies.append)
    for _ in range(3):
        await asyncio.sleep(0)
    assert replies == []  # written, not yet synced
    await asyncio.wait_for(b.store.journal.drain(), 5)
    assert [r.status for r in replies] == [Status.OK]
    b.crash()
    fs.crash("drop")
    b = await h.start()
    assert await h.read(7, 0) == (Status.OK, frame(7, 0))  # what was acked survived
    b.crash()


async def test_read_only_stopped_and_crashed_bookies(harness_cls):
    fs = MemFileSystem()
    fs.sync_delay = 0.01
    h = harness_cls(fs=fs)
    b = await h.start()
    pending: list[Response] = []
    b.add_nowait(AddRequest(1, 0, KEY, frame(1, 0)), pending.append)
    b.crash()  # the add was buffered, never synced
    assert [r.status for r in pending] == [Status.UNAVAILABLE]
    stopped = await nowait(b, AddRequest(1, 1, KEY, frame(1, 1)))
    assert stopped.status == Status.UNAVAILABLE

    b = Bookie("b1", DATA_DIR, fs=fs, rng=random.Random(1),
               config=BookieConfig(disk_check_interval=0, checkpoint_interval=0,
                                   disk_usage_threshold=0.0, disk_usage_low_water=0.0))
    await b.start()
    assert b.state == "read-only"
    ro = await nowait(b, AddRequest(2, 0, KEY, frame(2, 0)))
    assert ro.status == Status.READ_ONLY and "read-only" in ro.message
    rec = await nowait(b, AddRequest(2, 0, KEY, frame(2, 0), recovery=True))
    assert rec.status == Status.OK  # recovery adds still go through on a full disk
    await b.stop()


async def test_fsync_failure_answers_an_error_and_disables_writes(harness):
    b = harness.bookie
    harness.fs.fail_next_fsync()
    failed = await nowait(b, AddRequest(3, 0, KEY, frame(3, 0)))
    assert failed.status == Status.IO_ERROR and "fsync" in failed.message
    assert b.state == "read-only"
    again = await nowait(b, AddRequest(3, 1, KEY, frame(3, 1)))
    assert again.status == Status.READ_ONLY
    assert (await harness.read(3, 0))[0] != Status.OK


async def test_add_entry_and_add_raise_the_typed_errors_once(harness):
    """``Bookie.add_entry`` (callback) and ``Bookie.add`` (awaitable) are the hot-path forms:
    bad input gets the error class a caller can act on, exactly once, and nothing stored."""
    from pybk.errors import (
        BadRequestError,
        BookieStateError,
        EntryExistsError,
        LedgerFencedError,
        UnauthorizedError,
    )

    b = harness.bookie
    await b.add(4, 0, KEY, frame(4, 0))
    cases = [
        ((4, 0, KEY, frame(4, 0, b"other")), EntryExistsError),
        ((4, 1, b"wrong key", frame(4, 1)), UnauthorizedError),
        ((4, 1, KEY, frame(4, 5)), BadRequestError),
        ((4, 1, KEY, b"short"), BadRequestError),
    ]
    for args, cls in cases:
        got: list = []
        b.add_entry(*args, got.append)
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(got) == 1 and isinstance(got[0], cls), (args, got)
        try:
            await b.add(*args)
        except cls:
            pass
        else:
            raise AssertionError(f"{args} was accepted")
    assert await harness.read(4, 0) == (Status.OK, frame(4, 0))  # the original is intact
    assert (await harness.read(4, 1))[0] == Status.NO_SUCH_ENTRY
    assert (await b.handle(FenceRequest(4, KEY))).status == Status.OK
    try:
        await b.add(4, 1, KEY, frame(4, 1))
    except LedgerFencedError:
        pass
    else:
        raise AssertionError("a fenced ledger took a normal add")
    await b.add(4, 1, KEY, frame(4, 1), recovery=True)
    await b.stop()
    got = []
    b.add_entry(4, 2, KEY, frame(4, 2), got.append)
    assert len(got) == 1 and isinstance(got[0], BookieStateError)
