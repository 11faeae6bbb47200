"""The quorum write pipeline, sans-IO: events in, actions out (the h11 / aioquic style).

:class:`WritePipeline` holds every rule of BookKeeper's add path (``PendingAddOp``,
``sendAddSuccessCallbacks``, ``ensembleChangeLoop`` in BookKeeper's client) and nothing
else: no awaits, no transport, no metadata store, no clock. An async driver (:class:`pybk.
client.writer.AddPipeline`) feeds it events and does what it asks (docs/internals.md). The
actions are defined in :mod:`pybk.client.write_actions` (exported here too), the batch limits'
cut in :mod:`pybk.client.batching`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from pybk.client.batching import batch_spans
from pybk.client.lacflush import LacFlush
from pybk.client.quorum import Quorums
from pybk.client.write_actions import (
    Action,
    AddOutcome,
    ChangeEnsemble,
    Fail,
    Resolve,
    Send,
    SendLac,
)
from pybk.errors import (
    BKError,
    EntryTooLargeError,
    LedgerFencedError,
    NotEnoughBookiesError,
    QuotaExceededError,
    UnauthorizedError,
    fresh_copy,
)

__all__ = [
    "Action",
    "AddOutcome",
    "ChangeEnsemble",
    "Fail",
    "Resolve",
    "Send",
    "SendLac",
    "WritePipeline",
]

#: errors that end the pipeline instead of replacing the bookie that sent them
_FATAL = (LedgerFencedError, UnauthorizedError, EntryTooLargeError, QuotaExceededError)


#: from this many entries on, :meth:`WritePipeline._distribute` queues by stride slices
_SLICE_MIN: Final = 8


class WritePipeline:
    """Pipelined adds to one ledger, acknowledged at Qa in entry-id order. Sans-IO: see the
    module docstring.

    ``ensembles`` maps first entry id -> ensemble (the ledger's metadata); the pipeline writes
    to the last one. ``lac``/``length`` say where the ledger stands (recovery starts after
    the recovered LAC). ``explicit_lac_interval > 0`` makes :meth:`on_timer` ask for explicit
    LAC sends; ``immediate_lac`` makes :meth:`on_quiet` ask for one when the LAC moved and
    nothing after it carries it (:attr:`lac_due`)."""

    def __init__(
        self,
        ledger_id: int,
        quorums: Quorums,
        ensembles: Mapping[int, Sequence[str]],
        *,
        lac: int = -1,
        length: int = 0,
        recovery: bool = False,
        max_batch_entries: int = 1024,
        max_batch_bytes: int = 1 << 20,
        explicit_lac_interval: float = 0.0,
        immediate_lac: bool = False,
        ack_out_of_order: bool = False,
        count_stale_replies: bool = False,
        lac_before_quorum: bool = False,
    ) -> None:
        self.ledger_id = ledger_id
        self.quorums = quorums
        self.recovery = recovery
        self.ensembles: dict[int, tuple[str, ...]] = {k: tuple(v) for k, v in ensembles.items()}
        self.ensemble: list[str] = list(self.ensembles[max(self.ensembles)])
        #: last add confirmed / pushed; length with every pushed / confirmed entry
        self.lac = lac
        self.lap = lac
        self.length = length
        self.lac_length = length
        #: the pending entries lac+1 .. lap, as parallel lists from ``_base`` on (slots before
        #: ``_head`` are confirmed and dropped lazily): body, length after it, ack bitmask
        #: (bit i: ensemble slot i acked), waiter
        self._base = lac + 1
        self._head = 0
        self._bodies: list[bytes] = []
        self._lengths: list[int] = []
        self._acked: list[int] = []
        self._waiters: list[Any] = []
        #: entries from this id on were never sent (pushed while an ensemble change ran)
        self._unsent = lac + 1
        #: entries ``_queued .. _unsent - 1`` were pushed (no change running, no dead slot)
        #: but not yet put in the per-slot outboxes: :meth:`_distribute` does that for the
        #: lot with a few slices at the next event, not three appends per entry and slot
        self._queued = lac + 1
        #: per ensemble slot, the entries queued for it (ids, bodies, bytes): sent even if
        #: they are confirmed meanwhile (every replica of the write set gets the entry)
        e = quorums.ensemble_size
        self._outbox: list[list[int]] = [[] for _ in range(e)]
        self._outbodies: list[list[bytes]] = [[] for _ in range(e)]
        self._outbytes = [0] * e
        self._actions: list[Action] = []
        #: failures waiting for the driver's ensemble change: slot -> bookie
        self.failed: dict[int, str] = {}
        #: why each bookie was replaced (named in a NotEnoughBookiesError)
        self.failure_causes: dict[str, str] = {}
        self.changing = False
        self.error: BaseException | None = None
        self.ensemble_changes = 0
        self._epoch = 0
        self._slot_epoch = [0] * quorums.ensemble_size
        #: recovery only: slots written around (no spare bookie) and, per pending entry, the
        #: slots of its write set that are dead for it
        self.dead_slots: set[int] = set()
        self._dead_for: dict[int, int] = {}
        self.max_batch_entries = max_batch_entries
        self.max_batch_bytes = max_batch_bytes
        #: what the bookies were told of the LAC, and when to tell them more
        self.lac_flush = LacFlush(immediate=immediate_lac and not recovery,
                                  interval=explicit_lac_interval)
        self._lac_before_quorum = lac_before_quorum
        #: when :meth:`on_timer` wants to be called next (loop time), None: never
        self.next_timer: float | None = None
        self._ack_out_of_order = ack_out_of_order
        #: mutation (a broken build): replies from a slot's replaced bookie still count
        self._count_stale_replies = count_stale_replies
        e = quorums.ensemble_size
        #: write set of each entry id modulo E (the striping schedule, precomputed)
        self._write_sets = [quorums.write_set(i) for i in range(e)]
        self._qa = quorums.ack_quorum
        self._e = e

    # ================================================================== queries

    @property
    def pending(self) -> int:
        """Entries pushed and not yet confirmed (nor failed)."""
        return len(self._bodies) - self._head

    @property
    def idle(self) -> bool:
        """Nothing pending, no ensemble change in progress."""
        return not self.pending and not self.changing

    def acked_by(self, entry_id: int) -> frozenset[int]:
        """The ensemble slots that acked a pending entry (tests)."""
        mask = self._acked[entry_id - self._base]
        return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)

    def has_quorum(self, entry_id: int) -> bool:
        """Has a pending entry reached Qa (it may still wait for earlier ones)?"""
        return self._acked[entry_id - self._base].bit_count() >= self._qa

    @property
    def lac_due(self) -> bool:
        """Would :meth:`on_quiet` send the LAC now (it moved, and no pending entry nor entry
        framed since carries it)? The driver asks after each round of actions."""
        return self.error is None and self.lac_flush.due(self.lac, self.pending)

    # ================================================================== events

    def push(self, body: bytes, length: int, waiter: Any = None) -> int:
        """Queue the framed entry ``lap + 1`` (``length``: the ledger's length with it).
        Returns its id. Raises the pipeline's error (a fresh copy) once it has failed: a
        caller checks that *before* taking the id."""
        if self.error is not None:
            raise fresh_copy(self.error)
        entry_id = self.lap = self.lap + 1
        self.lac_flush.framed(self.lac)  # (the writer frames each entry with the LAC of now)
        self.length = length
        self._bodies.append(body)
        self._lengths.append(length)
        self._acked.append(0)
        self._waiters.append(waiter)
        if not self.changing:
            if self.dead_slots:
                self._queue(entry_id, body)
                self._queued = entry_id + 1
            self._unsent = entry_id + 1  # (else queued by _distribute, at the next event)
        return entry_id

    def on_reply(self, send: Send, outcome: AddOutcome) -> None:
        """A bookie answered ``send``. Stale replies (the slot changed hands since) and
        answers for entries no longer pending are ignored."""
        slot = send.slot
        if ((send.epoch < self._slot_epoch[slot] and not self._count_stale_replies)
                or self.error is not None):
            return
        if outcome is None:
            self._ack(slot, send.entry_ids)
            return
        if isinstance(outcome, BKError):
            self._bookie_failed(slot, send.bookie, outcome)
            return
        ok = [eid for eid, err in zip(send.entry_ids, outcome, strict=True) if err is None]
        first_error = next(err for err in outcome if err is not None)
        if ok:
            self._ack(slot, ok)
        self._bookie_failed(slot, send.bookie, first_error)

    def take_failed(self) -> dict[int, str]:
        """The failed slots the driver's ensemble change must replace now (those whose bookie
        is still the one that failed); empty once there is nothing (left) to do."""
        while self.failed and self.error is None:
            failed, self.failed = self.failed, {}
            failed = {i: b for i, b in failed.items() if self.ensemble[i] == b}
            if failed:
                return failed
        return {}

    def ensemble_changed(self, ensembles: Mapping[int, Sequence[str]]) -> None:
        """Adopt the last ensemble of ``ensembles`` (written to the metadata, or kept locally
        by recovery): in-flight entries of the replaced slots are resent to the new bookies
        (dropping those slots' earlier acks), entries queued during the change are sent."""
        self._distribute()
        self.ensembles = {k: tuple(v) for k, v in ensembles.items()}
        new = list(self.ensembles[max(self.ensembles)])
        replaced = [i for i in range(len(new)) if new[i] != self.ensemble[i]]
        if replaced:
            self.ensemble = new
            self.ensemble_changes += 1
            self._epoch += 1
            for slot in replaced:
                self._slot_epoch[slot] = self._epoch
                self._clear_outbox(slot)
            self.dead_slots.difference_update(replaced)
        self._resend(replaced)

    def write_around(self, failed: Mapping[int, str]) -> None:
        """Recovery without a spare bookie: keep ``failed`` slots out of the write sets while
        every pending write-back can still reach Qa on the others. Raises
        NotEnoughBookiesError (the caller then fails the pipeline) when one cannot."""
        self._distribute()
        self.dead_slots.update(failed)
        for slot in failed:  # queued for a dead bookie and not sent: never will be
            self._clear_outbox(slot)
        qw = self.quorums
        for i in range(self._head, len(self._bodies)):
            eid = self._base + i
            for slot in failed:
                if qw.has_entry(eid, slot) and self._mark_dead(i, eid, slot):
                    raise NotEnoughBookiesError(
                        f"ledger {self.ledger_id}: entry {eid} cannot reach {qw.ack_quorum} "
                        f"bookies and no replacement is available for {sorted(failed.values())}")
        self._resend([])

    def change_done(self) -> None:
        """The driver's ensemble change loop ended (changed, or failed the pipeline): adds
        may be confirmed again."""
        self._distribute()
        self.changing = False
        if self.error is None and self._unsent <= self.lap:
            self._resend([])  # (pushed after the last ensemble was adopted)
        self._complete()

    def fail(self, error: BaseException) -> None:
        """Fail the pipeline: every pending entry is settled with ``error`` (one :class:`Fail`
        action), and every later push raises a copy of it."""
        if self.error is None:
            self.error = error
        self._queued = self._unsent  # (outboxes are emptied below: nothing left to queue)
        waiters = [w for w in self._waiters[self._head:] if w is not None]
        self._base = self.lac + 1  # (the ids of the failed entries stay used: lap is kept)
        self._head = 0
        self._bodies, self._lengths, self._acked, self._waiters = [], [], [], []
        for slot in range(len(self.ensemble)):
            self._clear_outbox(slot)
        self._dead_for.clear()
        self._actions.append(Fail(error, waiters))

    def on_timer(self, now: float) -> None:
        """The explicit-LAC timer: when idle with entries confirmed past the last LAC told,
        ask for a :class:`SendLac` (BookKeeper's ExplicitLacFlushPolicy). As there, not
        while adds keep carrying the LAC on: the LAC is sent at the first tick after the
        adds stopped (a writer adding steadily sends none; one that stops sends its last
        LAC within two intervals)."""
        interval = self.lac_flush.interval
        if interval <= 0:
            self.next_timer = None
            return
        if self.error is None:
            lac = self.lac_flush.tick(self.lac, self.pending)
            if lac is not None:
                self._actions.append(SendLac(lac, list(self.ensemble)))
        self.next_timer = now + interval

    def on_quiet(self) -> None:
        """A loop iteration passed since :attr:`lac_due` was seen true: ask for a
        :class:`SendLac` if it still is (no add came meanwhile to carry the LAC)."""
        if self.error is None:
            lac = self.lac_flush.take(self.lac, self.pending)
            if lac is not None:
                self._actions.append(SendLac(lac, list(self.ensemble)))

    def stop_timer(self) -> None:
        """No more timer events (the handle is closing)."""
        self.next_timer = None
        self.lac_flush.interval = 0.0

    def actions(self) -> list[Action]:
        """What to do now, in order: one :class:`Send` per bookie with queued entries (split
        at the batch limits; the network first, so bookies get to work before callers are
        answered), then whatever earlier events decided."""
        out: list[Action] = []
        if self.error is None and not self.changing:
            self._distribute()
            self._sends(out)
        if self._actions:
            out += self._actions
            self._actions = []
        return out

    # ================================================================== internals

    def _queue(self, entry_id: int, body: bytes) -> None:
        outbox, outbodies, outbytes = self._outbox, self._outbodies, self._outbytes
        size = len(body)
        for slot in self._write_sets[entry_id % len(outbox)]:
            if slot in self.dead_slots:
                i = entry_id - self._base
                if self._mark_dead(i, entry_id, slot):
                    self._fail_unreachable(entry_id)
                    return
                continue
            outbox[slot].append(entry_id)
            outbodies[slot].append(body)
            outbytes[slot] += size

    def _distribute(self) -> None:
        """Put the entries ``_queued .. _unsent - 1`` (pushed with no change running and no
        dead slot: each goes to its whole write set) in the outboxes of their slots.

        Consecutive ids give each slot a fixed round robin over the Qw residue classes
        (mod E) it stores: class ``j`` holds the ids whose write set has the slot at place
        ``j``; as ids grow the slot's place steps down through Qw-1..0 and then skips E-Qw
        ids. So a slot's ids in order are the classes, sorted by their first id, taken in
        turn: one stride slice of the pending bodies per class, put in place by an extended
        slice assignment."""
        u0, u1 = self._queued, self._unsent - 1
        if u0 > u1:
            return
        self._queued = u1 + 1
        e, qw, base, bodies = self._e, self.quorums.write_quorum, self._base, self._bodies
        if u1 - u0 < _SLICE_MIN:  # a few entries (a lone writer's): one by one is cheaper
            for eid in range(u0, u1 + 1):
                self._queue(eid, bodies[eid - base])
            return
        for slot in range(e):
            firsts = sorted(f for j in range(qw) if (f := u0 + (slot - j - u0) % e) <= u1)
            if not firsts:
                continue
            if len(firsts) == 1:
                f = firsts[0]
                ids = list(range(f, u1 + 1, e))
                out = bodies[f - base:u1 - base + 1:e]
            else:
                count = sum(len(range(f, u1 + 1, e)) for f in firsts)
                ids = [0] * count
                out = [b""] * count
                for k, f in enumerate(firsts):
                    ids[k::qw] = range(f, u1 + 1, e)
                    out[k::qw] = bodies[f - base:u1 - base + 1:e]
            self._outbox[slot] += ids
            self._outbodies[slot] += out
            self._outbytes[slot] += sum(map(len, out))

    def _clear_outbox(self, slot: int) -> None:
        self._outbox[slot] = []
        self._outbodies[slot] = []
        self._outbytes[slot] = 0

    def _mark_dead(self, i: int, entry_id: int, slot: int) -> bool:
        """Count ``slot`` as failed for pending entry index ``i``; True when the entry can no
        longer reach Qa."""
        bit = 1 << slot
        self._acked[i] &= ~bit
        dead = self._dead_for.get(entry_id, 0) | bit
        self._dead_for[entry_id] = dead
        return dead.bit_count() > self.quorums.max_failures

    def _fail_unreachable(self, entry_id: int) -> None:
        self.fail(NotEnoughBookiesError(
            f"ledger {self.ledger_id}: entry {entry_id} cannot reach "
            f"{self.quorums.ack_quorum} live bookies of its write set"))

    def _sends(self, out: list[Action]) -> None:
        ensemble, epoch = self.ensemble, self._epoch
        max_n, max_bytes = self.max_batch_entries, self.max_batch_bytes
        for slot, ids in enumerate(self._outbox):
            if not ids:
                continue
            bodies = self._outbodies[slot]
            nbytes = self._outbytes[slot]
            self._clear_outbox(slot)
            if len(ids) <= max_n and nbytes <= max_bytes:
                out.append(Send(slot, ensemble[slot], epoch, ids, bodies))
                continue
            for start, end in batch_spans(bodies, max_n, max_bytes):
                out.append(Send(slot, ensemble[slot], epoch, ids[start:end],
                                bodies[start:end]))

    def _ack(self, slot: int, entry_ids: list[int]) -> None:
        bit = 1 << slot
        base, head, acked = self._base, self._head, self._acked
        if self._ack_out_of_order:
            self._ack_each(bit, entry_ids)
            return
        for eid in entry_ids:
            i = eid - base
            if i >= head:  # (else confirmed already)
                acked[i] |= bit
        if self._lac_before_quorum:
            self._early_lac()
        # only the head entry reaching Qa lets anything be confirmed (in order)
        if head < len(acked) and acked[head].bit_count() >= self._qa:
            self._complete()

    def _early_lac(self) -> None:
        """Mutation LAC_BEFORE_QUORUM: a deliberately broken build that tells the bookies a
        LAC covering entries one bookie stored, before the Qa-th ack."""
        acked, i = self._acked, self._head
        while i < len(acked) and acked[i]:
            i += 1
        lac = self._base + i - 1
        if lac > self.lac and lac > self.lac_flush.told:
            self.lac_flush.told = lac
            self._actions.append(SendLac(lac, list(self.ensemble)))

    def _ack_each(self, bit: int, entry_ids: list[int]) -> None:
        """:meth:`_ack` entry by entry, for the ACK_OUT_OF_ORDER mutation (an entry is
        answered the moment it reaches Qa)."""
        base, head, acked = self._base, self._head, self._acked
        qa = self._qa
        lac = self.lac
        complete_head = False
        for eid in entry_ids:
            i = eid - base
            if i < head:
                continue  # confirmed already
            a = acked[i]
            if a & bit:
                continue
            a |= bit
            acked[i] = a
            if a.bit_count() == qa:
                self._resolve_out_of_order(i, eid)
                if eid == lac + 1:
                    complete_head = True
        if complete_head:
            self._complete()

    def _resolve_out_of_order(self, i: int, entry_id: int) -> None:
        """Mutation ACK_OUT_OF_ORDER: a deliberately broken build that answers an entry as
        soon as it reaches Qa, ignoring earlier ones."""
        waiter = self._waiters[i]
        if waiter is not None:
            self._waiters[i] = None
            self._actions.append(Resolve(entry_id, entry_id, [waiter]))

    def _complete(self) -> None:
        """Confirm entries from the head while they have Qa (none during a change)."""
        if self.changing or self.error is not None:
            return
        acked, qa = self._acked, self._qa
        head = start = self._head
        n = len(acked)
        while head < n and acked[head].bit_count() >= qa:
            head += 1
        if head == start:
            return
        base = self._base
        first = base + start
        last = base + head - 1
        self.lac = last
        self.lac_length = self._lengths[head - 1]
        self._actions.append(Resolve(first, last, self._waiters[start:head]))
        if self._dead_for:
            for eid in range(first, last + 1):
                self._dead_for.pop(eid, None)
        if head == n:  # everything confirmed: start the lists afresh
            self._base = last + 1
            self._head = 0
            self._bodies, self._lengths, self._acked, self._waiters = [], [], [], []
        elif head >= 256 and head * 2 >= n:  # drop the confirmed prefix now and then
            del self._bodies[:head], self._lengths[:head], self._acked[:head]
            del self._waiters[:head]
            self._base += head
            self._head = 0
        else:
            self._head = head

    def _bookie_failed(self, slot: int, bookie: str, error: BKError) -> None:
        self._distribute()  # (entries pushed so far are queued before any change begins)
        if isinstance(error, _FATAL):
            self.fail(type(error)(
                f"ledger {self.ledger_id}: bookie {bookie} refused the add: {error}"))
            return
        if self.ensemble[slot] != bookie or slot in self.dead_slots:
            return
        self.failed[slot] = bookie
        self.failure_causes[bookie] = f"{type(error).__name__}: {error}"
        if not self.changing:
            self.changing = True
            self._actions.append(ChangeEnsemble())

    def _resend(self, replaced: list[int]) -> None:
        """After a change: queue the unsent entries, and every pending entry of a replaced
        slot for its new bookie (its old ack dropped)."""
        base, head, bodies = self._base, self._head, self._bodies
        unsent = self._unsent
        for slot in replaced:
            bit = ~(1 << slot)
            for i in range(head, len(bodies)):
                eid = base + i
                if eid >= unsent:
                    break
                if self.quorums.has_entry(eid, slot):
                    self._acked[i] &= bit
                    self._outbox[slot].append(eid)
                    self._outbodies[slot].append(bodies[i])
                    self._outbytes[slot] += len(bodies[i])
        for i in range(max(head, unsent - base), len(bodies)):
            self._queue(base + i, bodies[i])
            if self.error is not None:
                return
        self._unsent = self._queued = self.lap + 1

    # ================================================================== invariants

    def _check(self) -> None:
        """Assert the invariants (tests call this after every step)."""
        self._distribute()
        n = len(self._bodies)
        assert len(self._lengths) == len(self._acked) == len(self._waiters) == n
        assert 0 <= self._head <= n
        assert self._base + self._head == self.lac + 1, (self._base, self._head, self.lac)
        if self.error is None:
            assert self._base + n == self.lap + 1, (self._base, n, self.lap)
        assert max(self.ensembles) <= self.lac + 1
        assert list(self.ensembles[max(self.ensembles)]) == self.ensemble
        if self.error is not None:
            assert self.pending == 0 and not any(self._outbox)
        if not self.changing and self.error is None:
            # nothing left unconfirmed at the head that could be confirmed
            assert self._head == n or self._acked[self._head].bit_count() < self._qa
            assert self._unsent == self.lap + 1
        for slot, ids in enumerate(self._outbox):
            assert ids == sorted(ids)
            assert len(self._outbodies[slot]) == len(ids)
            assert self._outbytes[slot] == sum(map(len, self._outbodies[slot]))
            for eid in ids:
                assert self.quorums.has_entry(eid, slot)
        for i in range(self._head, n):
            assert self._acked[i] >> len(self.ensemble) == 0
        assert self._unsent <= self.lap + 1
        assert self._queued == self._unsent

