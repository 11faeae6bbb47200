"""IdRanges, the deleted-ledger set: a set of ints as sorted, disjoint, non-adjacent ranges.
Checked against a plain set."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pybk.storage.idranges import IdRanges

ids = st.lists(st.integers(min_value=-5, max_value=60), max_size=80)


@given(ids)
def test_ranges_hold_exactly_what_was_added(added: list[int]) -> None:
    r = IdRanges()
    model: set[int] = set()
    for x in added:
        assert r.add(x) == (x not in model)
        model.add(x)
        r._check()
    assert len(r) == len(model)
    assert list(r) == sorted(model)
    for x in range(-7, 63):
        assert (x in r) == (x in model), x
    pairs = r.ranges()
    for (a1, a2), (b1, _b2) in itertools.pairwise(pairs):
        assert a1 <= a2 and a2 + 1 < b1  # disjoint, never adjacent (adjacent ones merge)
    assert IdRanges.from_ranges(pairs) == r


@given(ids, ids)
def test_first_missing_from_is_the_smallest_id_the_other_lacks(a: list[int],
                                                               b: list[int]) -> None:
    missing = set(a) - set(b)
    assert IdRanges(a).first_missing_from(IdRanges(b)) == (min(missing) if missing else None)


def test_consecutive_deletions_cost_one_range() -> None:
    r = IdRanges(range(100_000, 0, -1))  # any order
    assert r.ranges() == [(1, 100_000)] and len(r) == 100_000
    assert 0 not in r and 100_001 not in r and 5 in r and "5" not in r


@pytest.mark.parametrize("bad", [[(3, 2)], [(1, 2), (3, 4)], [(5, 6), (1, 2)], [(1, 4), (4, 9)]])
def test_from_ranges_refuses_what_ranges_never_gives(bad: list[tuple[int, int]]) -> None:
    with pytest.raises(ValueError, match="out of order"):
        IdRanges.from_ranges(bad)


def test_check_catches_broken_ranges() -> None:
    r = IdRanges([1, 2, 3, 7])
    r._check()
    r._ranges[4] = 5  # adjacent to 1-3: should have been merged
    with pytest.raises(AssertionError):
        r._check()


spans = st.lists(st.tuples(st.integers(-5, 60), st.integers(0, 12)), max_size=20)


@given(ids, spans)
def test_add_range_holds_what_adding_each_id_would(added: list[int],
                                                   spans_: list[tuple[int, int]]) -> None:
    """Whole ranges merge with the ones they overlap or touch, as adding their ids one by one
    would; and a range of any length costs its ranges, not its ids."""
    r = IdRanges()
    model: set[int] = set()
    for x in added:
        r.add(x)
        model.add(x)
    for first, length in spans_:
        r.add_range(first, first + length)
        model.update(range(first, first + length + 1))
        r._check()
    assert list(r) == sorted(model) and len(r) == len(model)
    huge = IdRanges()
    huge.add_range(10, 2**62)
    huge.add(5)
    huge.add_range(0, 9)
    assert huge.ranges() == [(0, 2**62)] and len(huge) == 2**62 + 1
    with pytest.raises(ValueError, match="empty"):
        huge.add_range(3, 2)
