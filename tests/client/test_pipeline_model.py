"""The sans-IO write pipeline (pybk.client.pipeline) driven directly by hypothesis.

No loop, no transport, no store: a state machine pushes entries, carries out the pipeline's
actions, answers its batches in any order and any way (stored, refused, unreachable, fenced,
part of a batch stored and part not, answers split in parts, stale answers after the slot
changed hands), runs ensemble changes that succeed or fail, fails the pipeline, fires its
timer. After every step:

* the pipeline's own invariants (``_check``);
* confirmations come in entry-id order, contiguous from 0, each entry at most once;
* a confirmed entry was stored by at least Qa bookies of its write set *in the ensemble the
  pipeline writes to when it confirms it* (acks of a replaced bookie do not count);
* no waiter is both confirmed and failed, none twice;
* while an ensemble change runs nothing is confirmed.

At the end every outstanding batch is answered and every change finished: every waiter has
been settled exactly once (confirmed or failed) and nothing is pending: whatever failure was
injected, and wherever, no entry is left hanging.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pybk.client.pipeline import WritePipeline
from pybk.client.quorum import Quorums, plan_ensemble_change
from pybk.client.write_actions import (
    Action,
    ChangeEnsemble,
    Fail,
    Resolve,
    Send,
    SendLac,
)
from pybk.errors import (
    BKError,
    BookieUnavailableError,
    EntryExistsError,
    IOBookieError,
    LedgerFencedError,
    NotEnoughBookiesError,
    TimeoutError,
)

QUORUMS = [(3, 2, 2), (3, 3, 2), (4, 3, 2), (3, 2, 1), (2, 2, 2), (5, 3, 3), (1, 1, 1)]
RECOVERABLE = [IOBookieError, BookieUnavailableError, TimeoutError, EntryExistsError]


class Waiter:
    """One caller waiting on an entry (what a future is to the driver)."""

    def __init__(self, entry_id: int) -> None:
        self.entry_id = entry_id
        self.confirmed = 0
        self.failed = 0


class PipelineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.p: WritePipeline | None = None

    @initialize(quorum=st.sampled_from(QUORUMS), spares=st.integers(0, 3),
                recovery=st.booleans(), batch=st.sampled_from([1, 2, 3, 1024]),
                seed=st.integers(0, 2**16), immediate=st.booleans())
    def start(self, quorum: tuple[int, int, int], spares: int, recovery: bool, batch: int,
              seed: int, immediate: bool) -> None:
        e, qw, qa = quorum
        self.q = Quorums(e, qw, qa)
        ensemble = [f"b{i}" for i in range(e)]
        self.writable = [*ensemble, *(f"s{i}" for i in range(spares))]
        self.rng = random.Random(seed)
        self.p = WritePipeline(7, self.q, {0: ensemble}, recovery=recovery,
                               max_batch_entries=batch, max_batch_bytes=1 << 20,
                               explicit_lac_interval=0.5, immediate_lac=immediate)
        self.recovery = recovery
        self.waiters: list[Waiter] = []
        self.outstanding: list[Send] = []
        self.stored: dict[int, set[str]] = {}  # entry -> bookies that said "stored"
        self.confirmed: list[int] = []
        self.change_pending = False
        self.failed_bookies: set[str] = set()
        self.now = 0.0
        self.lacs_sent = 0

    # -- carrying out actions ---------------------------------------------------------------

    def run(self) -> None:
        p = self.p
        assert p is not None
        for action in p.actions():
            if isinstance(action, Send):
                assert action.entry_ids == sorted(action.entry_ids)
                assert len(action.bodies) == len(action.entry_ids)
                for eid, body in zip(action.entry_ids, action.bodies, strict=True):
                    assert body == b"e%d" % eid, "a replica got another entry's bytes"
                    assert self.q.has_entry(eid, action.slot)
                self.outstanding.append(action)
            elif isinstance(action, Resolve):
                assert not self.change_pending, "confirmed during an ensemble change"
                assert action.first == len(self.confirmed), (action.first, self.confirmed)
                for i, waiter in enumerate(action.waiters):
                    eid = action.first + i
                    self.confirmed.append(eid)
                    holders = {p.ensemble[s] for s in self.q.write_set(eid)}
                    assert len(holders & self.stored.get(eid, set())) >= self.q.ack_quorum, (
                        eid, p.ensemble, self.stored.get(eid))
                    if waiter is not None:
                        assert waiter.entry_id == eid
                        waiter.confirmed += 1
            elif isinstance(action, Fail):
                for waiter in action.waiters:
                    waiter.failed += 1
            elif isinstance(action, ChangeEnsemble):
                assert not self.change_pending
                self.change_pending = True
            else:
                assert isinstance(action, SendLac)
                assert action.lac == p.lac and p.pending == 0
                assert action.lac < len(self.confirmed)  # never past what Qa acknowledged
                assert action.bookies == p.ensemble
                self.lacs_sent += 1

    # -- rules --------------------------------------------------------------------------------

    @rule(n=st.integers(1, 4))
    def push(self, n: int) -> None:
        p = self.p
        assert p is not None
        for _ in range(n):
            if p.error is not None:
                try:
                    p.push(b"late", 0)
                except BKError:
                    pass
                else:
                    raise AssertionError("a failed pipeline took an entry")
                return
            eid = p.lap + 1
            waiter = Waiter(eid)
            assert p.push(b"e%d" % eid, p.length + 2, waiter) == eid
            self.waiters.append(waiter)

    @rule()
    def flush(self) -> None:
        self.run()

    @precondition(lambda self: self.outstanding)
    @rule(data=st.data(), kind=st.sampled_from(["ok", "ok", "ok", "error", "fatal", "mixed",
                                                "split", "lost"]))
    def answer(self, data: st.DataObject, kind: str) -> None:
        p = self.p
        assert p is not None
        send = self.outstanding.pop(data.draw(st.integers(0, len(self.outstanding) - 1)))
        if kind == "lost":  # never answered here: the transport's timeout answers later
            p.on_reply(send, TimeoutError("lost"))
        elif kind == "ok":
            self._stored(send, send.entry_ids)
            p.on_reply(send, None)
        elif kind == "error":
            cls = data.draw(st.sampled_from(RECOVERABLE))
            p.on_reply(send, cls("injected"))
        elif kind == "fatal":
            p.on_reply(send, LedgerFencedError("injected"))
        elif kind == "mixed":
            outcome: list[BKError | None] = [
                None if data.draw(st.booleans()) else IOBookieError("part") for _ in send.bodies]
            if all(o is None for o in outcome):
                outcome[-1] = IOBookieError("part")
            self._stored(send, [e for e, o in zip(send.entry_ids, outcome, strict=True)
                                if o is None])
            p.on_reply(send, outcome)
        else:  # split in two parts answering on their own (a hook, a v1 peer)
            cut = data.draw(st.integers(0, len(send.entry_ids)))
            first = send._replace(entry_ids=send.entry_ids[:cut], bodies=send.bodies[:cut])
            rest = send._replace(entry_ids=send.entry_ids[cut:], bodies=send.bodies[cut:])
            self._stored(send, first.entry_ids)
            if first.entry_ids:
                p.on_reply(first, None)
            if rest.entry_ids:
                self.outstanding.append(rest)
        self.run()

    def _stored(self, send: Send, entry_ids: list[int]) -> None:
        assert self.p is not None
        if send.bookie in self.p.ensemble or send.bookie in self.failed_bookies:
            for eid in entry_ids:
                self.stored.setdefault(eid, set()).add(send.bookie)

    @precondition(lambda self: self.change_pending)
    @rule(succeed=st.booleans())
    def change_step(self, succeed: bool) -> None:
        """One round of the driver's ensemble change loop (the metadata CAS, or recovery's
        local plan), succeeding or failing (the store failed, no spare)."""
        p = self.p
        assert p is not None
        failed = p.take_failed()
        if not failed or p.error is not None:
            p.change_done()
            self.change_pending = False
            self.run()
            return
        self.failed_bookies.update(failed.values())
        writable = [b for b in self.writable if b not in self.failed_bookies]
        try:
            if not succeed:
                raise IOBookieError("the metadata store failed")
            change = plan_ensemble_change(p.ensembles, p.lac, failed, writable, self.rng)
        except NotEnoughBookiesError:
            if self.recovery:
                try:
                    p.write_around(failed)
                except NotEnoughBookiesError as exc:
                    p.fail(exc)
            else:
                p.fail(NotEnoughBookiesError("no spare"))
        except BKError as exc:
            p.fail(exc)
        else:
            if change is not None:
                p.ensemble_changed(change.ensembles)
        self.run()

    @rule()
    def fail(self) -> None:
        assert self.p is not None
        self.p.fail(IOBookieError("the writer gave up"))
        self.run()

    @rule(dt=st.floats(0.0, 1.0))
    def timer(self, dt: float) -> None:
        assert self.p is not None
        self.now += dt
        self.p.on_timer(self.now)
        self.run()

    @rule()
    def quiet(self) -> None:
        """A loop iteration passed with no add (the driver calls this when ``lac_due``)."""
        assert self.p is not None
        due = self.p.lac_due
        before = self.lacs_sent
        self.p.on_quiet()
        self.run()
        assert self.lacs_sent - before == (1 if due else 0)
        assert not self.p.lac_due

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def sound(self) -> None:
        if self.p is None:
            return
        self.p._check()
        assert self.confirmed == list(range(len(self.confirmed)))
        assert self.p.lac == len(self.confirmed) - 1
        for waiter in self.waiters:
            assert waiter.confirmed + waiter.failed <= 1, vars(waiter)

    def teardown(self) -> None:
        """Answer everything (stored) and finish every change: every waiter settles once."""
        p = self.p
        if p is None:
            return
        for _ in range(10_000):
            self.run()
            if self.change_pending:
                self.change_step(True)
                continue
            if not self.outstanding:
                break
            send = self.outstanding.pop(0)
            self._stored(send, send.entry_ids)
            p.on_reply(send, None)
        self.run()
        assert not self.change_pending and not self.outstanding
        assert p.pending == 0, "an entry was left pending"
        for waiter in self.waiters:
            assert waiter.confirmed + waiter.failed == 1, (
                f"entry {waiter.entry_id} settled {waiter.confirmed + waiter.failed} times")
        self.sound()


TestPipeline = PipelineMachine.TestCase
TestPipeline.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                 derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def test_a_batch_goes_to_each_bookie_of_its_write_sets_as_one_send() -> None:
    """E3/Qw2: entries pushed together leave as one request per bookie, each holding the
    entries whose write set includes it, with the very same body objects (framed once)."""
    p = WritePipeline(1, Quorums(3, 2, 2), {0: ["a", "b", "c"]})
    bodies = [b"e%d" % i for i in range(6)]
    for body in bodies:
        p.push(body, 0)
    sends = {s.bookie: s for s in p.actions() if isinstance(s, Send)}
    assert {b: s.entry_ids for b, s in sends.items()} == {
        "a": [0, 2, 3, 5], "b": [0, 1, 3, 4], "c": [1, 2, 4, 5]}
    for s in sends.values():
        for eid, body in zip(s.entry_ids, s.bodies, strict=True):
            assert body is bodies[eid]
    assert p.actions() == []  # nothing left to send


def test_one_reply_confirms_a_whole_batch_in_one_resolve() -> None:
    p = WritePipeline(1, Quorums(2, 2, 2), {0: ["a", "b"]})
    waiters = [object() for _ in range(100)]
    for w in waiters:
        p.push(b"x", 1, w)
    sends = p.actions()
    assert len(sends) == 2
    for s in sends:
        assert isinstance(s, Send)
        p.on_reply(s, None)
    [resolve] = p.actions()
    assert isinstance(resolve, Resolve)
    assert (resolve.first, resolve.last, resolve.waiters) == (0, 99, waiters)


def test_batches_are_cut_at_the_limits() -> None:
    p = WritePipeline(1, Quorums(1, 1, 1), {0: ["a"]}, max_batch_entries=3,
                      max_batch_bytes=25)
    for i in range(8):
        p.push(b"x" * 10, 10 * (i + 1))
    sends = [s for s in p.actions() if isinstance(s, Send)]
    assert [s.entry_ids for s in sends] == [[0, 1], [2, 3], [4, 5], [6, 7]]


# -- the immediate LAC (pybk.client.lacflush) --------------------------------------------------

def _confirm(p: WritePipeline, entries: int) -> list[Action]:
    """Push ``entries`` and have every bookie store them; the actions after."""
    for i in range(entries):
        p.push(b"e%d" % i, i + 1)
    sends = [a for a in p.actions() if isinstance(a, Send)]
    for send in sends:
        p.on_reply(send, None)
    return p.actions()


def test_the_immediate_lac_is_due_once_confirmed_with_nothing_after_it() -> None:
    p = WritePipeline(7, Quorums(3, 3, 2), {0: ["b0", "b1", "b2"]}, immediate_lac=True)
    p.push(b"e0", 2)
    (s0, s1, s2) = [a for a in p.actions() if isinstance(a, Send)]
    p.on_reply(s0, None)
    assert not p.lac_due  # one ack of two: never before the Qa-th ack
    p.on_quiet()
    assert not [a for a in p.actions() if isinstance(a, SendLac)]
    p.on_reply(s1, None)
    assert [type(a) for a in p.actions()] == [Resolve]
    assert p.lac_due
    p.on_quiet()
    assert p.actions() == [SendLac(0, ["b0", "b1", "b2"])]
    assert not p.lac_due
    p.on_reply(s2, None)
    p.on_quiet()  # told already: nothing more
    assert p.actions() == []


def test_a_burst_of_confirmations_costs_one_lac_message() -> None:
    p = WritePipeline(7, Quorums(3, 2, 2), {0: ["b0", "b1", "b2"]}, immediate_lac=True)
    assert {type(a) for a in _confirm(p, 10)} == {Resolve}  # (as each bookie answers)
    p.on_quiet()
    assert p.actions() == [SendLac(9, ["b0", "b1", "b2"])]


def test_an_add_right_after_the_confirmation_carries_the_lac_instead() -> None:
    p = WritePipeline(7, Quorums(3, 2, 2), {0: ["b0", "b1", "b2"]}, immediate_lac=True)
    _confirm(p, 1)
    assert p.lac_due
    p.push(b"e1", 4)  # framed with LAC 0: its bookies learn it with the add
    assert not p.lac_due
    p.on_quiet()
    assert not [a for a in p.actions() if isinstance(a, SendLac)]


def test_no_immediate_lac_while_entries_after_it_are_pending() -> None:
    p = WritePipeline(7, Quorums(3, 3, 3), {0: ["b0", "b1", "b2"]}, immediate_lac=True)
    p.push(b"e0", 2)
    first = [a for a in p.actions() if isinstance(a, Send)]
    p.push(b"e1", 4)
    second = [a for a in p.actions() if isinstance(a, Send)]
    for send in first:
        p.on_reply(send, None)
    assert p.lac == 0 and not p.lac_due  # entry 1 follows: the burst ends first
    for send in second:
        p.on_reply(send, None)
    assert p.lac == 1 and p.lac_due


def test_the_knob_off_and_recovery_write_back_send_no_immediate_lac() -> None:
    off = WritePipeline(7, Quorums(3, 2, 2), {0: ["b0", "b1", "b2"]})
    _confirm(off, 3)
    assert not off.lac_due
    recovery = WritePipeline(7, Quorums(3, 2, 2), {0: ["b0", "b1", "b2"]}, recovery=True,
                             immediate_lac=True)
    _confirm(recovery, 3)
    assert not recovery.lac_due


def test_the_periodic_tick_sends_nothing_the_immediate_lac_told() -> None:
    p = WritePipeline(7, Quorums(3, 2, 2), {0: ["b0", "b1", "b2"]}, immediate_lac=True,
                      explicit_lac_interval=0.2)
    _confirm(p, 2)
    p.on_quiet()
    assert p.actions() == [SendLac(1, ["b0", "b1", "b2"])]
    p.on_timer(1.0)
    assert p.actions() == []


def test_a_failed_pipeline_sends_no_lac() -> None:
    p = WritePipeline(7, Quorums(3, 2, 2), {0: ["b0", "b1", "b2"]}, immediate_lac=True)
    _confirm(p, 2)
    p.fail(IOBookieError("gone"))
    assert not p.lac_due
    p.on_quiet()
    assert not [a for a in p.actions() if isinstance(a, SendLac)]


def test_the_lac_before_quorum_mutation_tells_a_lac_qa_never_acknowledged() -> None:
    p = WritePipeline(7, Quorums(3, 3, 2), {0: ["b0", "b1", "b2"]}, lac_before_quorum=True)
    p.push(b"e0", 2)
    s0 = next(a for a in p.actions() if isinstance(a, Send))
    p.on_reply(s0, None)
    assert p.lac == -1 and p.actions() == [SendLac(0, ["b0", "b1", "b2"])]
