"""Durable cursors in the log workload: a consumer under all faults, and the cursor invariants
(``Workload(log_cursors=1)``; the swarm draws it in a quarter of the seeds that run logs).

A **cursor consumer** subscribes to the log's cursor ``simcur`` and receives records; it
acknowledges most (shuffled single acknowledgements, or cumulatively), nacks some and leaves
some unacknowledged until it restarts, which it does on its own (a crash or a clean close);
the writer faults aim at it too. In the liveness phase a last consumer reads to the end.
What the cursor promises (docs/logs.md, "Durable cursors"), checked on the history:

* **CU1** an acknowledgement that returned is never redelivered, whatever crashes later;
* **CU2** nothing unacknowledged is skipped: each consumer instance hands out every record up
  to the last it handed out that no acknowledgement asked for before it subscribed covers,
  unless a truncation took it first;
* **CU3** a mark-delete position a consumer sees is never past a record no acknowledgement
  asked for covers (unless truncated).

Design notes: docs/internals.md, "pybk/sim/cursors.py".
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections import defaultdict
from typing import Any

from pybk.runtime.eventloop import within
from pybk.sim.checker import Collector, Violation
from pybk.sim.history import INFO, OK, Event, History
from pybk.sim.workload import Process, ProcessEnv

__all__ = ["CURSOR", "CursorConsumerProc", "check_cursors"]

CURSOR = "simcur"
_Pos = tuple[int, int, int]
#: a receive or acknowledgement's bound (virtual seconds)
_BOUND = 5.0


def _pos(p: Any) -> _Pos:
    return (int(p[0]), int(p[1]), int(p[2]))


class CursorConsumerProc(Process):
    """Consumes the log through the durable cursor (see the module docstring). ``ext`` is
    the log workload: its ``namespace``, ``log_name``, ``consumers`` (instances started) and
    ``cursor_floor`` (the mark-delete position after the last acknowledgement that
    returned: the log writer truncates no further)."""

    is_writer = True  # (the writer faults, pause and crash, aim at it too)
    prefix = "cc"

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv, ext: Any) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)
        self.instance = -1
        #: positions handed out by the current instance and not yet acked or nacked
        self.held: list[Any] = []
        #: whether each instance shares its cursor between two consumers, drawn from a
        #: stream of its own (the consumer's own draws stay as they were)
        self._shared = ext.run.rng_for(f"{name}-shared") if hasattr(ext, "run") else None
        #: the shared consumers of the current instance (none: the cursor alone), and which
        #: one received each position held
        self.parts: list[Any] = []
        self.holder: dict[Any, Any] = {}

    async def subscribe(self) -> Any:
        ns = self.client.namespace(self.ext.namespace, clock=self.env.wall_clock,
                                   tiers=self.tiers())
        log = await ns.open_log(self.ext.log_name)
        cur = await log.subscribe(CURSOR, start="earliest", label=self.name,
                                  redelivery_delay=self.rng.choice((0.2, 1.0)))
        self.ext.consumers += 1
        self.instance = self.ext.consumers
        self.held = []
        self.holder = {}
        self.parts = []
        if self._shared is not None and self._shared.random() < 0.5:
            self.parts = [cur.consumer(f"{self.name}-a"), cur.consumer(f"{self.name}-b")]
            self.cover("cursor_shared_consumers")
        md = await cur.mark_delete_position()
        self.h.cursor_open(self.name, CURSOR, self.instance, OK,
                           None if md is None else _pos(md))
        return cur

    async def run(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        while not self.stopping:
            try:
                cur = await within(self.subscribe(), 10.0)
            except Exception as exc:
                if not self.expected(exc, "subscribe"):
                    return
                self.h.cursor_open(self.name, CURSOR, -1, INFO, why=type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            why = "stopped"
            try:
                why = await self._consume(cur)
            except Exception as exc:
                if not self.expected(exc, "cursor consumer"):
                    return
                why = type(exc).__name__
            if why == "close":
                try:
                    await within(cur.close(), 10.0)
                except Exception as exc:
                    if not self.expected(exc, "cursor close"):
                        return
                    await cur.abort()
            else:
                await cur.abort()
            self.h.cursor_end(self.name, CURSOR, self.instance, why)
            await asyncio.sleep(self.rng.uniform(0.1, 0.5))

    async def _consume(self, cur: Any) -> str:
        """Receive and acknowledge until a restart is drawn: ``crash`` or ``close``."""
        batch = self.rng.randint(1, 4)
        turn = 0
        while not self.stopping:
            part = self.parts[turn % len(self.parts)] if self.parts else None
            turn += 1
            try:
                rec = await within((part or cur).receive(), _BOUND)
            except TimeoutError:
                continue
            if rec is None:
                return "end"
            self.ops += 1
            self.h.cursor_deliver(self.name, CURSOR, self.instance, _pos(rec.position),
                                  rec.data)
            roll = self.rng.random()
            if roll < 0.1:
                self.h.cursor_ack(self.name, CURSOR, self.instance, _pos(rec.position), "nack")
                (part or cur).nack(rec.position)
            elif roll >= 0.2:  # (0.1..0.2: left unacknowledged until the next restart)
                self.held.append(rec.position)
                if part is not None:
                    self.holder[rec.position] = part
            if part is not None and turn % 7 == 0:
                self._replace(cur, part)
            if len(self.held) >= batch:
                await self._ack(cur)
                batch = self.rng.randint(1, 4)
            roll = self.rng.random()
            if roll < 0.02:
                return "crash"
            if roll < 0.03:
                return "close"
        return "stopped"

    def _replace(self, cur: Any, part: Any) -> None:
        """A shared consumer closes (its unsettled records go back to the cursor, for the
        other) and a new one takes its place."""
        back = [p for p in self.held if self.holder.get(p) is part]
        part.close()
        for pos in back:
            self.held.remove(pos)
            del self.holder[pos]
            self.h.cursor_ack(self.name, CURSOR, self.instance, _pos(pos), "nack")
        self.parts[self.parts.index(part)] = cur.consumer(f"{part.name}+")
        self.cover("cursor_shared_consumer_closed")

    async def _ack(self, cur: Any) -> None:
        held, self.held = self.held, []
        if self.rng.random() < 0.25:
            todo = [(max(held), "cumulative")]
        else:
            self.rng.shuffle(held)
            todo = [(p, "ack") for p in held]
        for pos, how in todo:
            self.h.cursor_ack(self.name, CURSOR, self.instance, _pos(pos), how)
            part = self.holder.pop(pos, None) if how == "ack" else None
            call = (part or cur).ack(pos) if how == "ack" else cur.ack_cumulative(pos)
            try:
                await within(call, _BOUND)
            except BaseException as exc:
                self.h.cursor_ack_done(self.name, CURSOR, self.instance, _pos(pos), how, INFO,
                                       why=type(exc).__name__)
                raise
            md = await cur.mark_delete_position()
            self.h.cursor_ack_done(self.name, CURSOR, self.instance, _pos(pos), how, OK,
                                   None if md is None else _pos(md))
            if md is not None:
                self.ext.cursor_floor = md

    async def read_to(self, last: Any) -> None:
        """Liveness: take the cursor over and receive up to ``last`` (the log's last record),
        acknowledging as it goes; closes the cursor."""
        cur = await self.subscribe()
        try:
            while last is not None:
                rec = await cur.receive()
                if rec is None:
                    break
                self.h.cursor_deliver(self.name, CURSOR, self.instance, _pos(rec.position),
                                      rec.data)
                self.h.cursor_ack(self.name, CURSOR, self.instance, _pos(rec.position), "ack")
                await cur.ack(rec.position)
                md = await cur.mark_delete_position()
                self.h.cursor_ack_done(self.name, CURSOR, self.instance, _pos(rec.position),
                                       "ack", OK, None if md is None else _pos(md))
                if rec.position >= last:
                    break
        finally:
            await cur.close()
            self.h.cursor_end(self.name, CURSOR, self.instance, "final")


# -- the invariants --------------------------------------------------------------------------


class _Acks:
    """Acknowledgements asked for (or returned) so far, as a coverage question."""

    def __init__(self) -> None:
        self.single: set[_Pos] = set()
        self.cumulative: _Pos | None = None

    def add(self, pos: _Pos, how: str) -> None:
        if how == "cumulative":
            if self.cumulative is None or pos > self.cumulative:
                self.cumulative = pos
        elif how == "ack":
            self.single.add(pos)

    def covers(self, pos: _Pos) -> bool:
        return pos in self.single or (self.cumulative is not None and pos <= self.cumulative)


def check_cursors(history: History, in_log: dict[_Pos, Event],
                  truncations: list[Event], max_per_invariant: int = 5) -> list[Violation]:
    """CU1..CU3 (see the module docstring) over ``history``; ``in_log``: the records the
    log holds (acknowledged appends and whatever any reader returned) by position;
    ``truncations``: the stored truncation events."""
    v = Collector(max_per_invariant)
    out = v.out

    events = history.of_kind("cursor_open", "cursor_deliver", "cursor_ack", "cursor_ack_done")
    if not events:
        return out
    tb_sorted = sorted(truncations, key=lambda e: e.index)
    in_log = dict(in_log)
    for ev in events:
        if ev.kind == "cursor_deliver" and ev.pos is not None:
            in_log.setdefault(ev.pos, ev)

    def truncated_before(pos: _Pos, index: int) -> bool:
        for ev in tb_sorted:
            if ev.index >= index:
                return False
            if ev.pos is not None and pos < ev.pos:
                return True
        return False

    asked = _Acks()  # every acknowledgement asked for so far
    returned = _Acks()  # every acknowledgement that returned so far
    returned_at: dict[_Pos, Event] = {}
    cumulative_ev: Event | None = None
    #: instance -> (the acknowledgements asked for before it subscribed, its deliveries)
    before: dict[int, _Acks] = {}
    delivered: dict[int, list[Event]] = defaultdict(list)
    known = sorted(in_log)
    md_checked: list[int] = [0]  # known[:n] already checked against a mark-delete position

    def check_md(md: _Pos, ev: Event) -> None:
        """(Incremental: acknowledgements asked for only grow, so what passed stays good.)"""
        top = bisect_right(known, md)
        for p in known[md_checked[0]:top]:
            if not asked.covers(p) and not truncated_before(p, ev.index):
                v("CU3", f"{ev.process} #{ev.value}: mark-delete position {md} is past {p}, "
                  "which no acknowledgement covered", in_log[p], ev)
                break
        md_checked[0] = max(md_checked[0], top)

    for ev in events:
        assert ev.pos is not None or ev.kind == "cursor_open"
        if ev.kind == "cursor_open" and ev.outcome == OK:
            snap = _Acks()
            snap.single = set(asked.single)
            snap.cumulative = asked.cumulative
            before[ev.value] = snap
            if ev.pos is not None:
                check_md(ev.pos, ev)
        elif ev.kind == "cursor_deliver":
            assert ev.pos is not None
            delivered[ev.value].append(ev)
            if returned.covers(ev.pos):
                ack = returned_at.get(ev.pos) or cumulative_ev
                v("CU1", f"{ev.process} #{ev.value} was handed {ev.pos} again after its "
                  "acknowledgement returned", ack, ev)
        elif ev.kind == "cursor_ack":
            assert ev.pos is not None
            asked.add(ev.pos, ev.outcome)
        elif ev.kind == "cursor_ack_done" and ev.outcome == OK:
            assert ev.pos is not None
            how, md = ev.detail.split("|")[1:3]
            returned.add(ev.pos, how)
            if how == "cumulative":
                cumulative_ev = ev
            else:
                returned_at[ev.pos] = ev
            if md != "-":
                check_md(_pos(md.split(":")), ev)

    for instance, evs in delivered.items():
        prior = before.get(instance)
        if prior is None:
            continue
        got = {e.pos for e in evs}
        hi = max(e.pos for e in evs if e.pos is not None)
        for p in known:
            if p > hi:
                break
            if p in got or prior.covers(p):
                continue
            reveal = next(e for e in evs if e.pos is not None and e.pos > p)
            if truncated_before(p, reveal.index):
                continue
            v("CU2", f"{reveal.process} #{instance} skipped {p}, which no acknowledgement "
              f"covered (handed out {reveal.pos} after it)", in_log[p], reveal)
            break
    return out
