"""Damaged data on a bookie (rule R2): a flipped bit or a latent read error is reported,
never returned and never answered as absent; a damaged copy is repaired by an identical
re-add; damage mid-log refuses the start unless allowed."""

from __future__ import annotations

import pytest

from pybk.bookie import Bookie
from pybk.errors import CorruptRecordError
from pybk.testing.mutations import NO_SUCH_ENTRY_ON_IO_ERROR, Mutations
from pybk.wire import BookieInfoRequest, ReadBatchRequest, ReadBatchResponse, Status


def _entry_offset(bookie: Bookie, lid: int, eid: int) -> tuple[str, int, int]:
    loc = bookie.store.index.ledgers[lid].location(eid)
    assert loc is not None
    return bookie.store.journal_path(loc.seg), loc.offset, loc.size


async def test_bit_flip_in_stored_entry_is_reported_never_returned_never_absent(harness):
    for e in range(3):
        await harness.add(1, e)
    path, off, size = _entry_offset(harness.bookie, 1, 1)
    for delta in (0, 5, 9 + 8, size - 1):  # header, crc, ids, body
        fs = harness.fs
        fs.flip_bit(path, off + delta, bit=3)
        status, body = await harness.read(1, 1)
        assert status == Status.CORRUPT and body is None
        fs.flip_bit(path, off + delta, bit=3)  # undo
    assert await harness.read(1, 1) == (Status.OK, harness.frame(1, 1))


async def test_bit_flip_with_mutation_answers_no_such_entry(harness):
    await harness.add(1, 0)
    path, off, size = _entry_offset(harness.bookie, 1, 0)
    harness.fs.flip_bit(path, off + size - 1)
    await harness.restart_with(mutations=Mutations(NO_SUCH_ENTRY_ON_IO_ERROR))
    assert (await harness.read(1, 0))[0] == Status.NO_SUCH_ENTRY
    await harness.restart_with(mutations=Mutations())
    assert (await harness.read(1, 0))[0] == Status.CORRUPT


async def test_latent_read_error_is_io_error_not_absent(harness):
    await harness.add(1, 0)
    path, off, size = _entry_offset(harness.bookie, 1, 0)
    harness.fs.fail_reads(path, off, size)
    status, body = await harness.read(1, 0)
    assert status == Status.IO_ERROR and body is None


async def test_batched_read_fails_only_the_entry_a_latent_error_hits(harness):
    """A batched read coalesces neighbouring records into one pread; a latent sector error
    in one record, or in the bytes between records, fails that record alone (or none)."""
    for e in range(4):
        await harness.add(1, e)  # one journal batch each: neighbours with headers between
    path, off1, size1 = _entry_offset(harness.bookie, 1, 1)
    _, off2, _ = _entry_offset(harness.bookie, 1, 2)
    assert off1 + size1 < off2  # (a batch header lies between two records)

    async def batch() -> list[tuple[int, Status]]:
        reply = await harness.bookie.handle(ReadBatchRequest(1, [0, 1, 2, 3]))
        assert isinstance(reply, ReadBatchResponse) and reply.status == Status.OK
        return [(e, status) for e, status, _body in reply.entries]

    harness.fs.fail_reads(path, off1 + size1, off2 - off1 - size1)  # between records 1, 2
    assert await batch() == [(e, Status.OK) for e in range(4)]
    harness.fs.fail_reads(path, off1, size1)  # record 1 itself
    assert await batch() == [(0, Status.OK), (1, Status.IO_ERROR), (2, Status.OK),
                             (3, Status.OK)]


async def test_corrupt_copy_is_repaired_by_identical_re_add(harness):
    await harness.add(1, 0)
    path, off, size = _entry_offset(harness.bookie, 1, 0)
    harness.fs.flip_bit(path, off + size - 1)
    assert await harness.add(1, 0) == Status.OK
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))


async def test_bit_flip_mid_log_refuses_start_naming_file_and_offset(harness):
    for e in range(4):
        await harness.add(1, e)  # one batch each
    path, off, _ = _entry_offset(harness.bookie, 1, 1)
    await harness.bookie.stop()
    harness.fs.flip_bit(path, off + 20)
    # the clean stop checkpointed everything: the checkpoint serves the index, reads catch it
    await harness.start()
    assert (await harness.read(1, 1))[0] == Status.CORRUPT
    assert await harness.read(1, 2) == (Status.OK, harness.frame(1, 2))
    # without the checkpoint, replay meets the bad batch followed by good ones: refuse
    await harness.bookie.stop()
    harness.fs.delete("/data/b1/index.ckpt")
    with pytest.raises(CorruptRecordError) as info:
        await harness.start()
    assert info.value.path == path and info.value.offset is not None
    assert path in str(info.value) and str(info.value.offset) in str(info.value)


async def test_allow_suspect_segments_starts_and_reports(harness):
    for e in range(4):
        await harness.add(1, e)
    path, off, _ = _entry_offset(harness.bookie, 1, 1)
    await harness.bookie.stop()
    harness.fs.flip_bit(path, off + 20)
    harness.fs.delete("/data/b1/index.ckpt")
    harness.config.allow_suspect_segments = True
    bookie = await harness.start()
    assert await harness.read(1, 0) == (Status.OK, harness.frame(1, 0))
    # after the bad point: the bookie cannot prove absence any more (limbo, rule R4)
    assert (await harness.read(1, 2))[0] == Status.UNKNOWN_LEDGER_STATE
    assert (await harness.read(7, 0))[0] == Status.UNKNOWN_LEDGER_STATE
    info = await bookie.handle(BookieInfoRequest())
    assert "suspect" in info.message and path in info.message
