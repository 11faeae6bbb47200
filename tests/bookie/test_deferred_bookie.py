"""A bookie's side of deferred sync (pybk.bookie.deferred): a flagged add is answered once the
journal took it, before its fsync; FORCE answers once those adds are synced, with the last
entry held; a refusal is still the answer; a failed sync makes FORCE fail."""

from __future__ import annotations

import asyncio
from typing import Any

from pybk.bookie import Bookie
from pybk.storage import MemFileSystem
from pybk.wire import (
    AddRequest,
    DigestManager,
    ForceRequest,
    ForceResponse,
    Status,
    master_key,
)

KEY = master_key(b"")


async def _bookie() -> tuple[Bookie, MemFileSystem]:
    fs = MemFileSystem()
    fs.makedirs("/b")
    bookie = Bookie("b1", "/b", fs=fs)
    await bookie.start()
    fs.sync_delay = 0.05  # (after the start: every fsync of the adds takes this long)
    return bookie, fs


def _add(entry: int, *, deferred: bool = True, key: bytes = KEY) -> AddRequest:
    body = DigestManager(1).frame(entry, entry - 1, entry + 1, b"x")
    return AddRequest(1, entry, key, body, deferred_sync=deferred)


def _collect() -> tuple[list[Any], Any]:
    got: list[Any] = []
    return got, got.append


async def test_a_deferred_add_is_answered_before_its_fsync_and_force_waits_for_it() -> None:
    bookie, _fs = await _bookie()
    try:
        got, on_done = _collect()
        bookie.add_request(_add(0), on_done)
        assert got == [None]  # answered at once: the journal has it, not synced yet
        assert bookie.deferred.pending(1) == 1
        synced, on_synced = _collect()
        bookie.add_request(_add(1, deferred=False), on_synced)
        assert synced == []  # an ordinary add waits for the fsync
        force = await bookie.handle(ForceRequest(1, KEY))
        assert isinstance(force, ForceResponse) and force.status == Status.OK
        assert force.lac == 1 and bookie.deferred.pending(1) == 0
        assert synced == [None]
        again = await bookie.handle(ForceRequest(1, KEY))  # nothing left: at once
        assert isinstance(again, ForceResponse) and again.lac == 1
        unknown = await bookie.handle(ForceRequest(99, KEY))
        assert isinstance(unknown, ForceResponse) and unknown.lac == -1
    finally:
        await bookie.stop()


async def test_a_refusal_is_still_the_answer() -> None:
    bookie, _fs = await _bookie()
    try:
        _got, on_done = _collect()
        bookie.add_request(_add(0), on_done)
        bad, on_bad = _collect()
        bookie.add_request(_add(1, key=b"wrong"), on_bad)
        assert len(bad) == 1 and bad[0] is not None
        assert type(bad[0]).__name__ == "UnauthorizedError"
        assert bookie.deferred.pending(1) == 1  # only the good one is waited for
        assert (await bookie.handle(ForceRequest(1, KEY))).status == Status.OK
    finally:
        await bookie.stop()


async def test_a_failed_sync_fails_the_force() -> None:
    bookie, fs = await _bookie()
    try:
        fs.fail_next_fsync()
        got, on_done = _collect()
        bookie.add_request(_add(0), on_done)
        assert got == [None]  # answered before the sync that is going to fail
        force = await asyncio.wait_for(bookie.handle(ForceRequest(1, KEY)), 10)
        assert force.status != Status.OK
    finally:
        await bookie.stop()


async def test_force_answers_on_the_db_storage_engine_too() -> None:
    from pybk.bookie.config import BookieConfig

    fs = MemFileSystem()
    fs.makedirs("/b")
    bookie = Bookie("b1", "/b", fs=fs, config=BookieConfig(storage="db"))
    await bookie.start()
    try:
        got, on_done = _collect()
        bookie.add_request(_add(0), on_done)
        bookie.add_request(_add(1), on_done)
        force = await bookie.handle(ForceRequest(1, KEY))
        assert isinstance(force, ForceResponse) and force.status == Status.OK
        assert force.lac == 1 and got == [None, None]
        unknown = await bookie.handle(ForceRequest(99, KEY))
        assert isinstance(unknown, ForceResponse) and unknown.lac == -1
    finally:
        await bookie.stop()
