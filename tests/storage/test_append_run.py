"""``EntryIndex.append_run`` (the batched write path's index update: consecutive ids, striped
ids whose holes repeat, any other ascending ids) leaves exactly the columns that putting the
same entries one by one leaves, or declines and changes nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pybk.storage.entryindex import MAX_GAP, EntryIndex


def _columns(e: EntryIndex) -> tuple[object, ...]:
    return (e.first, e.end, e.holes, list(e.segs), list(e.offs), list(e.sizes), e.sparse)


def _runs(first: int, count: int, e: int, qw: int, slot: int) -> list[int]:
    """The ids of ``first .. first + count - 1`` a bookie in ensemble slot ``slot`` gets."""
    return [i for i in range(first, first + count) if (slot - i) % e < qw]


@given(prior=st.integers(0, 40), start_gap=st.integers(0, 70), count=st.integers(1, 200),
       e=st.integers(1, 6), qw=st.integers(1, 6), slot=st.integers(0, 5),
       seg=st.integers(0, 9))
def test_striped_runs_match_one_by_one_puts(prior: int, start_gap: int, count: int, e: int,
                                            qw: int, slot: int, seg: int) -> None:
    qw = min(qw, e)
    slot %= e
    ids = _runs(prior + start_gap, count, e, qw, slot)
    _check_same(prior, ids, seg)


@given(prior=st.integers(0, 20),
       steps=st.lists(st.integers(1, MAX_GAP + 3), min_size=1, max_size=60),
       seg=st.integers(0, 9))
def test_any_ascending_ids_match_one_by_one_puts(prior: int, steps: list[int],
                                                 seg: int) -> None:
    ids = []
    cur = prior
    for step in steps:
        ids.append(cur)
        cur += step
    _check_same(prior, ids, seg)


def test_a_pattern_that_stops_repeating_is_not_taken_for_one() -> None:
    # 2 of every 3, then a longer hole: the repeating shape covers all but the end
    _check_same(0, [0, 1, 3, 4, 6, 7, 9, 10, 14], 3)
    _check_same(0, [0, 1, 3, 4, 6, 7, 9, 10, 12], 3)  # the last period holds one id
    _check_same(0, [0, 1, 3, 4, 6, 7, 9, 11, 12], 3)  # one id off the pattern


def _check_same(prior: int, ids: list[int], seg: int) -> None:
    offsets = [1000 + 50 * i for i in range(len(ids))]
    sizes = [40 + i % 7 for i in range(len(ids))]
    batched, single = EntryIndex(), EntryIndex()
    for e in (batched, single):
        for eid in range(prior):  # an earlier dense run (or none)
            e.put(eid, (1, 10 * eid, 5))
    before = _columns(batched)
    if batched.append_run(ids, seg, offsets, sizes):
        for eid, off, size in zip(ids, offsets, sizes, strict=True):
            single.put(eid, (seg, off, size))
        assert _columns(batched) == _columns(single)
        for eid, off, size in zip(ids, offsets, sizes, strict=True):
            assert batched.get(eid) == (seg, off, size)
    else:
        assert _columns(batched) == before
