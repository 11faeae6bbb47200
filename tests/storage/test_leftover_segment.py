"""A journal segment cut off while being created never stops a bookie from starting.

Found by the simulator (seed 0 of the default sweep): a start-up whose new-segment header
fsync failed left a header-sized file behind; the next start used a later segment, and after a
torn crash the leftover sat *before* live segments, where it was taken for corruption. A file
no longer than a segment header holds no record, so nothing acknowledged can be in it.
"""

from __future__ import annotations

import random

import pytest

from pybk.bookie import Bookie
from pybk.storage import MemFileSystem
from pybk.wire import AddRequest, DigestManager, ReadRequest, Status, master_key

KEY = master_key(b"")


async def _add(bookie: Bookie, ledger: int, entry: int) -> bytes:
    body = DigestManager(ledger).frame(entry, entry - 1, entry + 1, b"e%d" % entry)
    resp = await bookie.handle(AddRequest(ledger, entry, KEY, body))
    assert resp.status == Status.OK, resp
    return body


@pytest.mark.parametrize("seed", range(8))
async def test_failed_start_leftover_then_torn_crash(seed: int) -> None:
    fs = MemFileSystem()
    fs.makedirs("/b")
    acked: dict[int, bytes] = {}
    first = Bookie("b", "/b", fs=fs)
    await first.start()
    for e in range(5):
        acked[e] = await _add(first, 1, e)
    first.crash()
    fs.crash("drop")

    fs.fail_next_fsync()  # the new segment's header sync fails: start-up aborts
    with pytest.raises(OSError):
        await Bookie("b", "/b", fs=fs).start()

    second = Bookie("b", "/b", fs=fs)  # no crash in between: the leftover is still there
    await second.start()
    for e in range(5, 10):
        acked[e] = await _add(second, 1, e)
    second.crash()
    fs.crash("torn", random.Random(seed))

    third = Bookie("b", "/b", fs=fs)
    await third.start()  # must not take the leftover for corruption
    for e, body in acked.items():
        resp = await third.handle(ReadRequest(1, e))
        assert resp.status == Status.OK and resp.body == body, (e, resp)
    await third.stop()
