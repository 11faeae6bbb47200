"""The store's batch fast path (``admit_run``: a clean batch admitted in C-level passes)
writes exactly what the per-entry path writes, and every batch it cannot vouch for takes the
per-entry checks (so each bad entry still fails alone and nothing acknowledged is lost)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from pybk.errors import BadRequestError, EntryExistsError
from pybk.storage import MemFileSystem
from pybk.storage.addbatch import admit_run
from pybk.storage.records import encode_entry
from pybk.wire import AddOutcome

from ..storage_kit import KEY, body, open_store


def _add_batch(s: Any, lid: int, ids: list[int], bodies: list[bytes]) -> AddOutcome:
    async def go() -> AddOutcome:
        fut: asyncio.Future[AddOutcome] = asyncio.get_running_loop().create_future()
        s.add_batch(lid, ids, bodies, KEY, False, fut.set_result)
        return await fut
    return asyncio.get_event_loop().run_until_complete(go())


def _run(coro: Any) -> Any:
    return asyncio.get_event_loop().run_until_complete(coro)


@pytest.fixture
def s() -> Iterator[Any]:
    """A store on MemFileSystem, on an event loop of its own (closed after the test)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield _run(open_store(MemFileSystem()))
    finally:
        loop.close()


def test_fast_path_records_equal_the_per_entry_records(s: Any) -> None:
    ids = [0, 1, 3, 4, 6, 7, 9, 10, 12]  # striped: holes, ascending
    bodies = [body(5, e) for e in ids]
    st = s.index.ledger(5)
    run = admit_run(5, st, ids, bodies)
    assert run is not None
    data, got_ids, sizes, lac = run
    assert data == b"".join(encode_entry(b) for b in bodies)
    assert got_ids == ids and lac == max(e - 1 for e in ids)
    assert sizes == [len(encode_entry(b)) for b in bodies]
    assert not st.pending  # (the caller keeps the batch in st.runs while in flight)
    # the per-entry path makes the same bytes: a batch the fast path declines (one misframed
    # entry at its end), whose good entries are stored record by record
    ids6, bodies6 = [*ids, 13], [*(body(6, e) for e in ids), body(6, 99)]
    assert admit_run(6, s.index.ledger(6), ids6, bodies6) is None
    out = _add_batch(s, 6, ids6, bodies6)
    assert isinstance(out, list) and isinstance(out[-1], BadRequestError)
    assert out[:-1] == [None] * len(ids)
    st6 = s.index.ledger(6)
    for e in ids:
        loc = st6.location(e)
        assert loc is not None
        assert s.fs.pread(s.journal_path(loc.seg), loc.offset, loc.size) == encode_entry(
            body(6, e))


def test_batches_the_fast_path_declines_change_nothing(s: Any) -> None:
    st = s.index.ledger(5)
    cases = [
        ([1, 0], [body(5, 1), body(5, 0)]),  # not ascending
        ([0, 1], [body(5, 0), body(5, 2)]),  # misframed
        ([0, 1], [body(5, 0), body(9, 1)]),  # another ledger's entry
        ([0, 1], [body(5, 0), b"short"]),  # shorter than the header
        ([-1, 0], [body(5, -1), body(5, 0)]),  # negative id
    ]
    tail = list(range(10, 18))  # (padded past the fast path's smallest batch)
    cases = [(ids + tail, bodies + [body(5, e) for e in tail]) for ids, bodies in cases]
    cases.append((list(range(2, 8)), [body(5, e) for e in range(2, 8)]))  # too few
    for ids, bodies in cases:
        assert admit_run(5, st, ids, bodies) is None
        assert not st.pending
    st.pending[3] = body(5, 3)  # one in flight: a batch overlapping it is declined
    ids = list(range(2, 12))
    assert admit_run(5, st, ids, [body(5, e) for e in ids]) is None
    assert list(st.pending) == [3]


def test_a_declined_batch_still_refuses_each_bad_entry_alone_and_stores_the_rest(s: Any) -> None:
    assert _add_batch(s, 5, [0, 1, 2], [body(5, e) for e in (0, 1, 2)]) is None
    # entry 1 again with other bytes, entry 3 misframed, entry 4 fine
    out = _add_batch(s, 5, [1, 3, 4], [body(5, 1) + b"x", body(5, 9), body(5, 4)])
    assert isinstance(out, list)
    assert isinstance(out[0], EntryExistsError)
    assert isinstance(out[1], BadRequestError)
    assert out[2] is None
    assert [s.read(5, e) for e in (0, 1, 2, 4)] == [body(5, e) for e in (0, 1, 2, 4)]
    # a clean batch after it takes the fast path and lands too
    ids = list(range(5, 30, 2))
    assert _add_batch(s, 5, ids, [body(5, e) for e in ids]) is None
    assert [s.read(5, e) for e in ids] == [body(5, e) for e in ids]
    assert not s.index.ledger(5).pending


def test_adds_of_entries_of_a_fast_path_batch_in_flight_wait_for_it_or_are_refused(s: Any) -> None:

    async def go() -> None:
        first: asyncio.Future[AddOutcome] = asyncio.get_running_loop().create_future()
        s.add_batch(5, list(range(10)), [body(5, e) for e in range(10)], KEY, False,
                    first.set_result)
        st = s.index.ledger(5)
        assert len(st.runs) == 1 and not st.pending  # in flight as one batch
        assert st.pending_body(1) == body(5, 1) and st.pending_body(10) is None
        # the same entry again, identical: answered once the first is durable
        again: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        s.add_entry(5, 1, body(5, 1), KEY, False, again.set_result)
        # different bytes: refused at once
        try:
            s.add_entry(5, 2, body(5, 2) + b"x", KEY, False, lambda _e: None)
        except EntryExistsError:
            pass
        else:
            raise AssertionError("a different body of an entry in flight was taken")
        # an overlapping batch takes the per-entry checks: 2..9 wait, 10..19 are new
        second: asyncio.Future[AddOutcome] = asyncio.get_running_loop().create_future()
        s.add_batch(5, list(range(2, 20)), [body(5, e) for e in range(2, 20)], KEY, False,
                    second.set_result)
        assert await first is None
        assert await again is None
        assert await second is None
        assert not st.runs and not st.pending
        assert [s.read(5, e) for e in range(20)] == [body(5, e) for e in range(20)]
        s._check()

    _run(go())
