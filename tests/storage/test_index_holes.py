"""The dense index columns take at most a bounded number of holes per entry held (issue 34,
item 3): entries spaced 65 apart used to leave 64 empty 16-byte slots each (48 MB sent ->
1 GiB held, the same after a restart). Past the bound, ids go to the sparse map; striped
ledgers (a hole every few ids) stay dense."""

from __future__ import annotations

import pytest

from pybk.storage.entryindex import MAX_GAP, EntryIndex


@pytest.mark.parametrize("spacing", [2, 4, 17, 65])
def test_holes_per_entry_are_bounded_by_one_at_a_time(spacing: int) -> None:
    idx = EntryIndex()
    n = 5000
    for k in range(n):
        idx.put(k * spacing, (0, k * 100, 50))
    assert len(idx) == n
    assert len(idx.sizes) <= 17 * n + MAX_GAP  # was 65 slots an entry at spacing 65
    assert all(idx.get(k * spacing) == (0, k * 100, 50) for k in range(0, n, 97))


def test_batched_appends_obey_the_same_bound() -> None:
    idx = EntryIndex()
    for start in range(0, 65 * 5000, 65 * 50):
        ids = list(range(start, start + 65 * 50, 65))
        if not idx.append_run(ids, 0, [i * 10 for i in ids], [50] * len(ids)):
            for i in ids:
                idx.put(i, (0, i * 10, 50))
    assert len(idx) == 5000 and len(idx.sizes) <= 17 * 5000 + MAX_GAP


def test_a_striped_ledger_stays_dense() -> None:
    idx = EntryIndex()
    ids = [e for e in range(30000) if e % 5 in (0, 1)]  # E=5, Qw=2: this bookie's ids
    for start in range(0, len(ids), 100):
        run = ids[start:start + 100]
        assert idx.append_run(run, 0, [i * 10 for i in run], [50] * len(run))
    assert idx.sparse is None and len(idx) == len(ids)
