"""Exhaustive/property tests of the sans-IO quorum rules (pybk.client.quorum)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.client.quorum import (
    AckSet,
    Answer,
    CoverageSet,
    EntryState,
    Quorums,
    RecoveryReadDecision,
    choose_ensemble,
    plan_ensemble_change,
    validate_quorums,
)
from pybk.errors import NotEnoughBookiesError

SETTINGS = settings(derandomize=True, deadline=None, max_examples=300)


@st.composite
def quorums(draw: st.DrawFn, max_e: int = 6) -> Quorums:
    e = draw(st.integers(1, max_e))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    return Quorums(e, w, a)


def all_quorums(max_e: int = 5) -> list[Quorums]:
    return [
        Quorums(e, w, a)
        for e in range(1, max_e + 1)
        for w in range(1, e + 1)
        for a in range(1, w + 1)
    ]


def test_validate_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="ack_quorum"):
        validate_quorums(3, 2, 0)
    with pytest.raises(ValueError, match=r"write_quorum \(2\) must be >= ack_quorum \(3\)"):
        validate_quorums(3, 2, 3)
    with pytest.raises(ValueError, match=r"ensemble_size \(2\) must be >= write_quorum \(3\)"):
        validate_quorums(2, 3, 1)
    with pytest.raises(TypeError, match="ensemble_size"):
        validate_quorums("3", 2, 2)  # type: ignore[arg-type]
    validate_quorums(1, 1, 1)


def test_write_sets_match_bookkeeper_example() -> None:
    q = Quorums(4, 3, 2)
    assert [q.write_set(e) for e in range(5)] == [
        [0, 1, 2], [1, 2, 3], [2, 3, 0], [3, 0, 1], [0, 1, 2],
    ]


@pytest.mark.parametrize("q", all_quorums(), ids=str)
def test_write_set_striping(q: Quorums) -> None:
    e = q.ensemble_size
    counts = [0] * e
    for entry in range(e):
        ws = q.write_set(entry)
        assert len(set(ws)) == q.write_quorum
        assert ws[0] == entry % e
        for i in range(e):
            assert q.has_entry(entry, i) == (i in ws)
        for i in ws:
            counts[i] += 1
        assert q.write_set(entry + e) == ws  # only E distinct write sets
    assert counts == [q.write_quorum] * e


@given(q=quorums(), events=st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=12))
@SETTINGS
def test_ack_set_rules(q: Quorums, events: list[tuple[bool, int]]) -> None:
    acks = AckSet(q)
    acked: set[int] = set()
    failed: set[int] = set()
    for ok, raw in events:
        index = raw % q.write_quorum
        if ok:
            reached = acks.ack(index)
            acked.add(index)
            failed.discard(index)
            assert reached == (len(acked) >= q.ack_quorum)
        else:
            lost = acks.fail(index)
            failed.add(index)
            acked.discard(index)
            assert lost == (len(failed) > q.write_quorum - q.ack_quorum)
        assert acks.complete == (len(acked) >= q.ack_quorum)
        assert acks.acked == frozenset(acked)


@pytest.mark.parametrize("q", all_quorums(), ids=str)
def test_coverage_exhaustive(q: Quorums) -> None:
    """Covered <=> no write set has Qa bookies that are all unknown, i.e. an entry acked by
    any Qa bookies of any write set was seen (and they were fenced) by at least one."""
    e = q.ensemble_size
    for answers in itertools.product(list(Answer), repeat=e):
        cov = CoverageSet(q)
        for i, a in enumerate(answers):
            cov.answer(i, a)
        hidden_quorum_possible = any(
            all(answers[i] is Answer.UNKNOWN for i in subset)
            for entry in range(e)
            for subset in itertools.combinations(q.write_set(entry), q.ack_quorum)
        )
        assert cov.covered() == (not hidden_quorum_possible), answers


@given(
    q=quorums(),
    holders=st.sets(st.integers(0, 5)),
    order=st.permutations(list(range(6))),
    lies=st.sets(st.integers(0, 5)),
    errors=st.sets(st.integers(0, 5)),
)
@SETTINGS
def test_recovery_read_never_calls_an_acked_entry_absent(
    q: Quorums, holders: set[int], order: list[int], lies: set[int], errors: set[int]
) -> None:
    """Bookies answer truthfully (holders: OK or an error; others: ABSENT or an error).
    If Qa bookies of the write set hold the entry, no reply order makes it ABSENT; if any
    OK arrives it EXISTS; if all answer and none holds it, it is ABSENT or UNKNOWN only
    because of errors."""
    ws = list(range(q.write_quorum))
    holders = {h for h in holders if h in ws}
    errors = {x for x in errors if x in ws}
    decision = RecoveryReadDecision(q)
    states = []
    for index in [i for i in order if i in ws]:
        if index in errors:
            answer = Answer.UNKNOWN
        elif index in holders:
            answer = Answer.OK
        else:
            answer = Answer.ABSENT
        states.append(decision.answer(index, answer))
        if states[-1] in (EntryState.EXISTS, EntryState.ABSENT):
            break
    final = states[-1] if states else EntryState.PENDING
    if len(holders) >= q.ack_quorum:
        assert EntryState.ABSENT not in states
    if holders - errors:
        assert final is not EntryState.ABSENT or len(ws) - len(holders) >= q.absent_threshold
    if not holders and not errors:
        assert final is EntryState.ABSENT
    if final is EntryState.UNKNOWN:
        assert errors
    del lies


@pytest.mark.parametrize("q", all_quorums(4), ids=str)
def test_recovery_decision_thresholds(q: Quorums) -> None:
    d = RecoveryReadDecision(q)
    for i in range(q.absent_threshold - 1):
        assert d.answer(i, Answer.ABSENT) is EntryState.PENDING
    assert d.answer(q.absent_threshold - 1, Answer.ABSENT) is EntryState.ABSENT
    d = RecoveryReadDecision(q)
    for i in range(q.write_quorum):
        state = d.answer(i, Answer.UNKNOWN if i < q.ack_quorum else Answer.ABSENT)
    assert state is EntryState.UNKNOWN
    d = RecoveryReadDecision(q)
    d.answer(0, Answer.UNKNOWN)
    assert d.answer(1 % q.write_quorum, Answer.OK) is EntryState.EXISTS


def test_choose_ensemble() -> None:
    rng = random.Random(1)
    got = choose_ensemble(["b3", "b1", "b2", "b4"], 3, rng, exclude=["b4"])
    assert sorted(got) == ["b1", "b2", "b3"]
    with pytest.raises(NotEnoughBookiesError, match="need 3 writable bookies, have 2"):
        choose_ensemble(["b1", "b2", "b1"], 3, rng)
    a = choose_ensemble([f"b{i}" for i in range(9)], 4, random.Random(7))
    b = choose_ensemble([f"b{i}" for i in range(9)], 4, random.Random(7))
    assert a == b  # deterministic for a seeded rng


@given(
    e=st.integers(1, 5),
    extra=st.integers(0, 4),
    lac_step=st.integers(-1, 6),
    nfragments=st.integers(1, 3),
    failed_slots=st.sets(st.integers(0, 4), min_size=1),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_plan_ensemble_change(
    e: int, extra: int, lac_step: int, nfragments: int, failed_slots: set[int], seed: int
) -> None:
    pool = [f"b{i:02d}" for i in range(e + extra + 3)]
    ensembles = {}
    start = 0
    for k in range(nfragments):
        ensembles[start] = tuple(pool[k : k + e])
        start += 3
    last_start = max(ensembles)
    lac = max(last_start - 1, last_start - 1 + lac_step)
    last = ensembles[last_start]
    failed = {i: last[i] for i in failed_slots if i < e}
    if not failed:
        failed = {0: last[0]}
    writable = pool[: e + extra]
    rng = random.Random(seed)
    candidates = [b for b in writable if b not in last and b not in failed.values()]
    if len(candidates) < len(failed):
        with pytest.raises(NotEnoughBookiesError):
            plan_ensemble_change(ensembles, lac, failed, writable, rng)
        return
    change = plan_ensemble_change(ensembles, lac, failed, writable, rng)
    assert change is not None
    new = change.ensembles
    assert change.start == lac + 1
    assert max(new) == lac + 1
    for k, v in ensembles.items():
        if k != lac + 1:
            assert new[k] == v  # earlier fragments never change
    if last_start == lac + 1:
        assert len(new) == len(ensembles)  # replaced in place
    else:
        assert len(new) == len(ensembles) + 1
    fresh = new[lac + 1]
    for i in range(e):
        if i in failed:
            assert fresh[i] == change.replaced[i]
            assert fresh[i] not in last and fresh[i] in writable
        else:
            assert fresh[i] == last[i]
    assert len(set(fresh)) == e
    # a second application for the same failures is a no-op (someone already replaced them)
    assert plan_ensemble_change(new, lac, failed, writable, rng) is None


def test_plan_ensemble_change_examples() -> None:
    ens = {0: ("b1", "b2", "b3")}
    rng = random.Random(0)
    # nothing confirmed: ensemble 0 replaced in place (HandleFailuresTest)
    change = plan_ensemble_change(ens, -1, {1: "b2"}, ["b1", "b2", "b3", "b4"], rng)
    assert change is not None and change.ensembles == {0: ("b1", "b4", "b3")}
    # entries up to 4 confirmed: a new fragment at 5
    change = plan_ensemble_change(ens, 4, {1: "b2"}, ["b1", "b2", "b3", "b4"], rng)
    assert change is not None
    assert change.ensembles == {0: ("b1", "b2", "b3"), 5: ("b1", "b4", "b3")}
    with pytest.raises(AssertionError):
        plan_ensemble_change({0: ("b1",), 7: ("b2",)}, 3, {0: "b2"}, ["b3"], rng)
