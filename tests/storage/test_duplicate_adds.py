"""An add of an entry the bookie already holds is checked against the index first: a body of
another length is refused with no disk access, so a batch of small bodies claiming a large
held entry cannot make the bookie read that entry back once per claim (issue 34, item 1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from storage_kit import KEY, open_store

from pybk.errors import EntryExistsError
from pybk.storage import MemFileSystem
from pybk.wire import AddOutcome, DigestManager

LID = 3


def _frame(eid: int, payload: bytes) -> bytes:
    return DigestManager(LID).frame(eid, eid - 1, 0, payload)


class _CountingFs(MemFileSystem):
    """A MemFileSystem that counts the bytes read with pread."""

    read_bytes = 0

    def pread(self, path: str, offset: int, size: int) -> bytes:
        self.read_bytes += size
        return super().pread(path, offset, size)


async def _batch(s: Any, ids: list[int], bodies: list[bytes]) -> AddOutcome:
    fut: asyncio.Future[AddOutcome] = asyncio.get_running_loop().create_future()
    s.add_batch(LID, ids, bodies, KEY, False, fut.set_result)
    return await fut


async def test_small_bodies_claiming_a_large_held_entry_read_nothing_back() -> None:
    fs = _CountingFs()
    s = await open_store(fs)
    big = _frame(0, b"x" * (1 << 20))
    await s.add(LID, 0, big, KEY)
    claims = 2000
    fs.read_bytes = 0
    outcome = await _batch(s, [0] * claims, [_frame(0, b"y" * 4)] * claims)
    assert isinstance(outcome, list) and len(outcome) == claims
    assert all(isinstance(o, EntryExistsError) for o in outcome)
    assert fs.read_bytes == 0  # was 2000 MiB: the held entry read back for each claim
    fs.read_bytes = 0
    with pytest.raises(EntryExistsError):
        s.add_entry(LID, 0, _frame(0, b"z"), KEY, False, lambda _e: None)
    assert fs.read_bytes == 0


async def test_a_body_of_the_stored_length_is_still_compared_byte_for_byte() -> None:
    fs = _CountingFs()
    s = await open_store(fs)
    body = _frame(0, b"a" * 100)
    await s.add(LID, 0, body, KEY)
    other = _frame(0, b"b" * 100)
    fs.read_bytes = 0
    outcome = await _batch(s, [0, 0], [body, other])
    assert isinstance(outcome, list)
    assert outcome[0] is None and isinstance(outcome[1], EntryExistsError)
    assert fs.read_bytes <= 2 * (len(body) + 64)  # at most what the request carried
    await s.add(LID, 0, body, KEY)  # identical: a durable no-op
    with pytest.raises(EntryExistsError):
        await s.add(LID, 0, other, KEY)
