"""Caller-chosen entry ids (pybk.client.adv.AdvOrder feeding the sans-IO WritePipeline) against
a model, driven by hypothesis: appends of any id in any order (duplicates included), bookie
answers in any order, bookie failures with ensemble changes.

The model is a set of offered ids and, per id, the bookies (of the ensemble it is confirmed
in) that stored it. After every step:

* a duplicate id is refused, and only a duplicate;
* confirmations come in id order, contiguous from 0, each id at most once, each the caller's
  own (its waiter);
* the LAC is the longest prefix 0..k of offered ids each stored on Qa bookies of its write set,
  once nothing can be confirmed further (no ensemble change running);
* no id is sent to a bookie before every smaller id was offered;
* the pipeline's own invariants.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pybk.client.adv import AdvOrder
from pybk.client.pipeline import WritePipeline
from pybk.client.quorum import Quorums
from pybk.client.write_actions import ChangeEnsemble, Fail, Resolve, Send, SendLac
from pybk.errors import BookieUnavailableError, DuplicateEntryIdError

QUORUMS = [(3, 2, 2), (3, 3, 2), (4, 3, 2), (3, 2, 1), (2, 2, 2)]


class AdvMachine(RuleBasedStateMachine):
    @initialize(q=st.sampled_from(QUORUMS))
    def setup(self, q: tuple[int, int, int]) -> None:
        e, qw, qa = q
        self.quorums = Quorums(e, qw, qa)
        self.spares = [f"s{i}" for i in range(3)]
        self.p = WritePipeline(1, self.quorums, {0: [f"b{i}" for i in range(e)]})
        self.order = AdvOrder()
        self.offered: set[int] = set()
        self.confirmed: list[int] = []
        self.outstanding: list[Send] = []
        #: per id, the bookies that stored it (any ensemble)
        self.stored: dict[int, set[str]] = {}

    def _carry_out(self) -> None:
        for action in self.p.actions():
            if isinstance(action, Send):
                assert all(i in self.offered for i in range(max(action.entry_ids) + 1))
                self.outstanding.append(action)
            elif isinstance(action, Resolve):
                for i, waiter in enumerate(action.waiters):
                    eid = action.first + i
                    assert waiter == ("w", eid)
                    assert eid == len(self.confirmed), (eid, self.confirmed)
                    self.confirmed.append(eid)
            elif isinstance(action, ChangeEnsemble):
                self._change()
            elif isinstance(action, Fail):
                raise AssertionError(f"the pipeline failed: {action.error}")
            else:
                assert isinstance(action, SendLac)

    def _change(self) -> None:
        while failed := self.p.take_failed():
            new = list(self.p.ensemble)
            for slot in failed:
                new[slot] = self.spares.pop()
            ensembles = dict(self.p.ensembles)
            ensembles[self.p.lac + 1] = tuple(new)
            self.p.ensemble_changed(ensembles)
        self.p.change_done()

    @rule(entry_id=st.integers(0, 12))
    def append(self, entry_id: int) -> None:
        if entry_id in self.offered:
            with pytest.raises(DuplicateEntryIdError):
                self.order.offer(entry_id, b"x", ("w", entry_id))
            return
        self.offered.add(entry_id)
        for eid, payload, waiter in self.order.offer(entry_id, b"x%d" % entry_id,
                                                     ("w", entry_id)):
            assert payload == b"x%d" % eid
            assert self.p.push(payload, eid + 1, waiter) == eid
        self._carry_out()

    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        if not self.outstanding:
            return
        send = self.outstanding.pop(data.draw(st.integers(0, len(self.outstanding) - 1)))
        if send.bookie in self.p.ensemble:
            for eid in send.entry_ids:
                self.stored.setdefault(eid, set()).add(send.bookie)
        self.p.on_reply(send, None)
        self._carry_out()

    @rule(data=st.data())
    def bookie_fails(self, data: st.DataObject) -> None:
        if not self.outstanding or not self.spares:
            return
        send = self.outstanding.pop(data.draw(st.integers(0, len(self.outstanding) - 1)))
        self.p.on_reply(send, BookieUnavailableError("down"))
        self._carry_out()

    @invariant()
    def lac_is_the_contiguous_acked_prefix(self) -> None:
        if not hasattr(self, "p"):
            return
        self.p._check()
        assert self.p.lac == len(self.confirmed) - 1
        assert self.order.next_id == self.p.lap + 1
        if self.p.changing:
            return
        ensemble_of = self.p.ensembles
        k = -1
        while k + 1 in self.offered:
            eid = k + 1
            first = max(f for f in ensemble_of if f <= eid)
            ens = ensemble_of[first]
            holders = {ens[s] for s in self.quorums.write_set(eid)} & self.stored.get(eid, set())
            if len(holders) < self.quorums.ack_quorum:
                break
            k = eid
        assert self.p.lac == k, (self.p.lac, k, sorted(self.offered))


AdvMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
test_adv_ids_against_the_model = AdvMachine.TestCase


def test_the_order_releases_runs_and_refuses_duplicates() -> None:
    order = AdvOrder()
    assert order.offer(2, b"c") == []
    assert order.offer(1, b"b") == []
    assert order.held == 2
    assert [e for e, _p, _w in order.offer(0, b"a")] == [0, 1, 2]
    for dup in (0, 2):
        with pytest.raises(DuplicateEntryIdError, match=f"entry id {dup} was added already"):
            order.offer(dup, b"z")
    assert order.offer(5, b"f", "w5") == []
    with pytest.raises(DuplicateEntryIdError):
        order.offer(5, b"g")
    assert order.take_held() == [(5, "w5")]
    assert order.held == 0
