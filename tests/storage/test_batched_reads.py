"""``LedgerStore.read_many``, the batched read's store side: neighbouring records are read
with one ``pread`` and checked in one hot loop, yet each entry is answered on its own: a
corrupt or unreadable record fails alone (never "absent", rule R2), an id the index does not
hold is absent, ids outside the index's dense run (sparse ids) are read too, the answer stops
at its byte budget, and a whole-ledger refusal is raised."""

from __future__ import annotations

import pytest
from storage_kit import body, fill, open_store

from pybk.errors import (
    CorruptRecordError,
    IOBookieError,
    NoSuchEntryError,
    NoSuchLedgerError,
    Status,
)
from pybk.storage import MemFileSystem
from pybk.storage.store import LedgerStore


def _where(s: LedgerStore, lid: int, eid: int) -> tuple[str, int, int]:
    loc = s.index.ledgers[lid].location(eid)
    assert loc is not None
    return s.journal_path(loc.seg), loc.offset, loc.size


async def test_every_entry_is_answered_in_order_with_its_body() -> None:
    s = await open_store(MemFileSystem())
    await fill(s, 1, range(40))
    ids = list(range(0, 40, 3))
    out, errors = s.read_many(1, ids, 1 << 20)
    assert errors == {}
    assert out == [(e, Status.OK, body(1, e)) for e in ids]


async def test_a_corrupt_record_fails_alone_and_its_neighbours_are_served() -> None:
    fs = MemFileSystem()
    s = await open_store(fs)
    await fill(s, 1, range(10))
    path, off, size = _where(s, 1, 4)
    fs.flip_bit(path, off + size - 1)  # the body's last byte: the record's CRC fails
    out, errors = s.read_many(1, list(range(10)), 1 << 20)
    assert [e for e, _s, _b in out] == list(range(10))
    assert out[4] == (4, Status.CORRUPT, None)
    assert isinstance(errors[4], CorruptRecordError) and set(errors) == {4}
    assert all(out[i] == (i, Status.OK, body(1, i)) for i in range(10) if i != 4)
    fs.flip_bit(path, off + size - 1)
    path, off, _size = _where(s, 1, 6)
    fs.flip_bit(path, off + 9 + 8)  # the entry id inside the record: a misplaced record
    out, errors = s.read_many(1, list(range(10)), 1 << 20)
    assert set(errors) == {6} and out[6] == (6, Status.CORRUPT, None)


async def test_an_unreadable_run_fails_as_io_errors_never_absent() -> None:
    fs = MemFileSystem()
    s = await open_store(fs)
    await fill(s, 1, range(6))
    path, off, size = _where(s, 1, 2)
    fs.fail_reads(path, off, size)
    out, errors = s.read_many(1, list(range(6)), 1 << 20)
    failed = {i for i, (_e, st, _b) in enumerate(out) if st != Status.OK}
    assert 2 in failed and failed == set(errors)
    assert all(out[i][1] == Status.IO_ERROR for i in failed)
    assert all(isinstance(errors[i], IOBookieError) for i in failed)
    assert all(out[i] == (i, Status.OK, body(1, i)) for i in range(6) if i not in failed)


async def test_absent_sparse_and_negative_ids() -> None:
    s = await open_store(MemFileSystem())
    await fill(s, 1, range(5))
    await fill(s, 1, range(100_000, 100_002))  # far past the dense run: kept sparse
    assert s.index.ledgers[1].entries.sparse
    ids = [-1, 0, 3, 7, 100_000, 100_001, 100_005]
    out, errors = s.read_many(1, ids, 1 << 20)
    assert [e for e, _s, _b in out] == ids
    assert [st for _e, st, _b in out] == [
        Status.NO_SUCH_ENTRY, Status.OK, Status.OK, Status.NO_SUCH_ENTRY, Status.OK,
        Status.OK, Status.NO_SUCH_ENTRY]
    assert set(errors) == {0, 3, 6}
    assert all(isinstance(errors[i], NoSuchEntryError) for i in errors)
    assert out[4][2] == body(1, 100_000) and out[1][2] == body(1, 0)


async def test_the_answer_stops_at_its_budget_with_at_least_one_entry() -> None:
    s = await open_store(MemFileSystem())
    await fill(s, 1, range(20))
    size = _where(s, 1, 0)[2]
    out, _ = s.read_many(1, list(range(20)), 5 * size)
    assert 1 <= len(out) <= 6 and [e for e, _s, _b in out] == list(range(len(out)))
    out, _ = s.read_many(1, list(range(20)), 1)
    assert len(out) == 1 and out[0] == (0, Status.OK, body(1, 0))


async def test_an_unknown_ledger_is_refused_as_a_whole() -> None:
    s = await open_store(MemFileSystem())
    with pytest.raises(NoSuchLedgerError):
        s.read_many(9, [0, 1], 1 << 20)


async def test_a_hole_inside_one_stretch_is_absent_and_the_rest_read_with_it() -> None:
    s = await open_store(MemFileSystem())
    await fill(s, 1, range(5))
    await fill(s, 1, range(6, 12))  # 5 never written: a hole in the dense run
    out, errors = s.read_many(1, list(range(12)), 1 << 20)
    assert [e for e, _s, _b in out] == list(range(12))
    assert out[5] == (5, Status.NO_SUCH_ENTRY, None) and set(errors) == {5}
    assert all(out[i] == (i, Status.OK, body(1, i)) for i in range(12) if i != 5)


async def test_an_unreadable_record_inside_one_stretch_fails_alone() -> None:
    fs = MemFileSystem()
    s = await open_store(fs)
    await fill(s, 1, range(8))
    path, off, size = _where(s, 1, 3)
    fs.fail_reads(path, off, size)
    out, errors = s.read_many(1, list(range(8)), 1 << 20)
    assert set(errors) == {3} and out[3] == (3, Status.IO_ERROR, None)
    assert all(out[i] == (i, Status.OK, body(1, i)) for i in range(8) if i != 3)


async def test_an_unreadable_stretch_is_tried_once_then_entry_by_entry() -> None:
    """A failing ``pread`` of a whole stretch is not repeated for each entry after it (a
    latent sector error can take a disk long to report): one failure for the stretch, one
    for the bad record read alone."""
    fs = MemFileSystem()
    s = await open_store(fs)
    await fill(s, 1, range(40))
    path, off, size = _where(s, 1, 3)
    fs.fail_reads(path, off, size)
    failed: list[int] = []
    pread = fs.pread

    def counting(p: str, offset: int, n: int) -> bytes:
        try:
            return pread(p, offset, n)
        except OSError:
            failed.append(offset)
            raise

    fs.pread = counting  # type: ignore[method-assign]
    out, errors = s.read_many(1, list(range(40)), 1 << 20)
    assert set(errors) == {3} and len(out) == 40
    assert len(failed) == 2, failed


async def test_absent_ids_cost_a_lookup_each_and_leave_no_garbage() -> None:
    """A request of 65,536 ids the bookie does not hold (issue 34, item 2): the answer stops
    after READ_MAX_ABSENT of them (the reader asks for the rest again), and answering them
    raises nothing, so no reference cycle per id is left for the collector."""
    import gc

    from pybk.storage.reads import READ_MAX_ABSENT

    s = await open_store(MemFileSystem())
    await fill(s, 1, range(3))
    ids = list(range(1000, 1000 + 65536))
    gc.collect()
    gc.disable()
    try:
        out, errors = s.read_many(1, ids, 1 << 20)
        assert len(out) == READ_MAX_ABSENT and len(errors) == READ_MAX_ABSENT
        assert all(st == Status.NO_SUCH_ENTRY and b is None for _e, st, b in out)
        assert [e for e, _s, _b in out] == ids[:READ_MAX_ABSENT]
        del out, errors
        assert gc.collect() < 50  # was 7 objects of cyclic garbage per absent id
    finally:
        gc.enable()
    out, _errors = s.read_many(1, [0, 5, 1, 6, 2], 1 << 20, max_absent=1)
    assert [e for e, _s, _b in out] == [0, 5]  # held ids before the limit are answered
