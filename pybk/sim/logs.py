"""The log workload: writers and tailing readers of a :mod:`pybk.logs` log under all faults,
and the log invariants.

One log (``sim/simlog``) is made with the seed's topology, small rolls, sometimes zstd and a
retention by age (whose wall clock jumps with the ``clock_jump`` fault). A **log writer**
appends unique records (one at a time and in ``append_many`` batches), flushes, truncates now
and then, and reopens the log when its writer fails; crashing it (``crash_writer``) or aiming
a recovery at the log (``recovery_timeout``) makes a new writer process take the log over,
fencing the old one. **Log readers** follow the tail from the oldest record or from where
they stopped, and start again after an error. In the liveness phase a last writer takes the
log over (recovering what the others left) and appends, and a last reader reads the whole log.

Design notes: docs/internals.md, "pybk/sim/logs.py".
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from collections.abc import Coroutine
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from pybk.runtime.eventloop import gather, within
from pybk.sim.checker import Collector, Violation
from pybk.sim.cursors import CursorConsumerProc, check_cursors
from pybk.sim.history import FAIL, INFO, OK, Event, History
from pybk.sim.loop import sleep
from pybk.sim.offload_service import OffloadServiceProc
from pybk.sim.tier import SimObjectStore, TierWatch, check_tier
from pybk.sim.tier_sweep import SweepWatch, TierSweepProc
from pybk.sim.workload import Process, ProcessEnv

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["LOG_NAME", "NAMESPACE", "LogReaderProc", "LogWorkload", "LogWriterProc",
           "check_logs"]

#: the truncation point in a log's stored metadata (docs/logs.md: JSON after a header)
_TRUNCATED_BEFORE = re.compile(rb'"truncated_before":\s*\[\s*(\d+),\s*(\d+),\s*(\d+)\s*\]')

NAMESPACE = "sim"
LOG_NAME = "simlog"
_Pos = tuple[int, int, int]


def _pos(p: Any) -> _Pos:
    return (int(p[0]), int(p[1]), int(p[2]))


class LogWorkload:
    """The log extension of a run (see the module docstring)."""

    name = "logs"
    namespace = NAMESPACE
    log_name = LOG_NAME

    @classmethod
    def for_run(cls, run: SimRun) -> LogWorkload | None:
        return cls(run) if run.workload.log_writers > 0 else None

    def __init__(self, run: SimRun) -> None:
        self.run = run
        #: the writer process that should hold the log (the others stop once fenced)
        self.active = ""
        self.readers = 0  # reader instances started (their numbers)
        self._last_tb: _Pos | None = None
        self.consumers = 0  # cursor consumer instances started (pybk.sim.cursors)
        #: the cursor's mark-delete position after its last acknowledgement that returned
        self.cursor_floor: Any = None
        #: the simulated object store the log offloads to (Workload.log_offload), its watch
        self.tier: SimObjectStore | None = None
        self.tier_watch: TierWatch | None = None
        self.sweep_watch: SweepWatch | None = None  # (Workload.log_tier_sweep)
        #: an offload service runs beside the writer (half the offload seeds, pybk.sim.
        #: offload_service)
        self.offload_service = False

    async def start(self) -> None:
        run = self.run
        from pybk.logs.meta import log_key

        self._key = log_key(NAMESPACE, LOG_NAME)
        run.cluster.on_meta_applied.append(self._meta_applied)
        rng = run.rng_for("log-config")
        e, qw, qa = run.topology
        offload: dict[str, Any] = {}
        if run.workload.log_offload:
            offload = self._start_tier()
        admin = run.cluster.client("log-admin")
        ns = admin.namespace(NAMESPACE, clock=run.wall_clock, tiers=run.env.tiers)
        knobs: dict[str, Any] = {
            "ensemble_size": e, "write_quorum": qw, "ack_quorum": qa,
            "roll_entries": rng.choice((8, 20, 50)), "roll_bytes": None,
            "compression": rng.choice(("none", "zstd")),
            "retention_seconds": rng.choice((None, None, 30.0))}
        await ns.create_log(LOG_NAME, **(knobs | offload))
        for _ in range(run.workload.log_writers):
            run.spawn(LogWriterProc, "lw", self)
        for _ in range(run.workload.log_readers):
            run.spawn(LogReaderProc, "lr", self)
        if run.workload.log_cursors:
            run.cover("workload_log_cursors")
        for _ in range(run.workload.log_cursors):
            run.spawn(CursorConsumerProc, "cc", self)
        if self.sweep_watch is not None:
            run.spawn(TierSweepProc, "ts", self)
        if self.offload_service:
            run.spawn(OffloadServiceProc, "os", self)

    def _start_tier(self) -> dict[str, Any]:
        """The simulated object store (pybk.sim.tier) every process's namespace opens, its
        watch, and the log's offload settings (drawn from a stream of their own)."""
        run = self.run
        run.cover("workload_log_offload")
        sweeps = run.workload.log_tier_sweep
        self.tier = store = SimObjectStore(
            run.rng_for("tier"), run.count_fault, run.cover, clock=run.wall_clock,
            torn=run.rng_for("tier-torn") if sweeps else None)
        run.on_liveness.append(store.disarm)
        store.dead = run.cluster.network.is_dead
        run.env.tiers = store.open
        self.tier_watch = TierWatch(run, store, self._key, NAMESPACE, LOG_NAME)
        run.cluster.on_meta_applied.append(self.tier_watch.meta_applied)
        if sweeps:
            run.cover("workload_log_tier_sweep")
            self.sweep_watch = SweepWatch(run, store, self._key, NAMESPACE, LOG_NAME)
        self.offload_service = run.rng_for("offload-service").random() < 0.5
        if self.offload_service:
            run.cover("workload_offload_service")
        rng = run.rng_for("log-offload")
        # (small segments: many of them complete, and go to the tier, in a run)
        return {"roll_bytes": rng.choice((300, 1000)), "offload_url": "sim://tier",
                "offload_threshold_bytes": rng.choice((1, 1, 2000)),
                "offload_deletion_lag": rng.choice((0.0, 1.0, 5.0))}

    def _meta_applied(self, op: str, key: object) -> Any:
        if op == "write_value" and key == self._key:
            return self._note_truncation()
        return None

    async def _note_truncation(self) -> None:
        """The log's truncation point as stored (seen from outside: every truncation, the
        writers' retention included). Read from the stored JSON by its field alone: the
        record's segment list grows with the log, and this runs on every change."""
        try:
            value = await self.run.cluster.admin.read_value(self._key)
        except Exception:  # (deleted meanwhile, never here: the log lives for the run)
            return
        found = _TRUNCATED_BEFORE.search(value.value)
        if found is None:
            return
        tb = (int(found[1]), int(found[2]), int(found[3]))
        if tb != self._last_tb:
            self._last_tb = tb
            self.run.history.log_truncate("meta", LOG_NAME, tb, "stored")

    def claim(self, name: str) -> None:
        self.active = name

    async def trigger_recovery(self, target: str) -> bool:
        """A recovery aimed at the log: a new writer process takes it over."""
        if target != f"log:{LOG_NAME}":
            return False
        self.run.spawn(LogWriterProc, "lw", self)
        return True

    async def settle(self) -> None:
        """Liveness: a last writer takes the log over and appends, a last reader reads the
        whole log; both within the run's liveness bound."""
        run = self.run
        loop = asyncio.get_running_loop()
        client = run.cluster.client("log-final")
        env = run.env
        proc = LogWriterProc("log-final-w", client, run.rng_for("log-final-w"), env, self)
        run.processes.append(proc)
        self.claim(proc.name)
        start = loop.time()
        if not await self._live("log writer takes over and appends", proc,
                                proc.final_writes(), "liveness: log takeover", start):
            return
        reader = LogReaderProc("log-final-r", client, run.rng_for("log-final-r"), env, self)
        run.processes.append(reader)
        if not await self._live("the whole log reads back", reader,
                                reader.read_all(proc.last), "liveness: final log read", start):
            return
        if run.workload.log_cursors:
            await self._settle_cursor(proc.last, start)
        if self.tier_watch is not None:
            await self.tier_watch.final_check()
        if self.sweep_watch is not None:
            await self._live("a last sweep of the tier", proc,
                             self.sweep_watch.final_sweep(run.cluster.client("log-final-s")),
                             "liveness: last tier sweep", start)

    async def _settle_cursor(self, last: Any, start: float) -> None:
        """Liveness: a last consumer takes the cursor over and reads to the log's end."""
        run = self.run
        client = run.cluster.client("log-final-c")
        consumer = CursorConsumerProc("log-final-c", client, run.rng_for("log-final-c"),
                                      run.env, self)
        run.processes.append(consumer)
        await self._live("the cursor reads to the end", consumer, consumer.read_to(last),
                         "liveness: final cursor read", start)

    async def _live(self, what: str, proc: Any, work: Coroutine[Any, Any, Any], where: str,
                    start: float) -> bool:
        """Await ``work`` within the liveness bound and record ``what`` as met or not."""
        history = self.run.history
        try:
            await within(work, self.run.liveness_bound)
        except Exception as exc:
            proc.expected(exc, where)
            history.liveness(what, False, f"{type(exc).__name__}: {exc}")
            return False
        history.liveness(what, True, f"{asyncio.get_running_loop().time() - start:.3f}s")
        return True

    def check(self) -> list[Violation]:
        return check_logs(self.run.history) + check_tier(self.run.history)

    async def close(self) -> None:
        """Nothing to stop: the log's processes are the run's, cancelled with it."""


class LogWriterProc(Process):
    """Appends unique records to the log; reopens (takes over) when its writer fails; stops
    for good once another writer process holds the log."""

    is_writer = True
    prefix = "lw"

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv,
                 ext: LogWorkload) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)
        self.writer: Any = None
        self.seq = 0
        self.last: Any = None  # the last position this process saw acknowledged

    def recovery_target(self) -> tuple[str, list[str]] | None:
        lh = getattr(self.writer, "_lh", None)  # (read only: where the segment's entries go)
        if lh is None or self.writer.error is not None:
            return None
        return f"log:{LOG_NAME}", list(lh.metadata.last_ensemble)

    async def _open(self) -> Any:
        ns = self.client.namespace(NAMESPACE, clock=self.env.wall_clock, tiers=self.tiers())
        log = await ns.open_log(LOG_NAME)
        w = await log.writer(label=self.name)
        self.h.log_writer_open(self.name, LOG_NAME, w.epoch, OK)
        self.writer = w
        return w

    async def run(self) -> None:
        self.ext.claim(self.name)
        while not self.stopping and self.ext.active == self.name:
            try:
                w = await self._open()
            except Exception as exc:
                if not self.expected(exc, "open log writer"):
                    return
                self.h.log_writer_open(self.name, LOG_NAME, -1, INFO, type(exc).__name__)
                await asyncio.sleep(0.5)
                continue
            try:
                await self._write(w)
            except Exception as exc:
                if not self.expected(exc, "log writer"):
                    return
                self.log(f"log writer failed: {type(exc).__name__}: {exc}")
            finally:  # (records appended with nothing in flight: sent at once, unbatched)
                if w.stats["lone_sends"]:
                    self.ext.run.coverage["log_records_sent_alone"] += w.stats["lone_sends"]
            if w.error is not None and not self.stopping:
                self.log(f"log writer failed: {type(w.error).__name__}: {w.error}")
                await w.abort()
            await asyncio.sleep(0.2)

    def _payload(self) -> bytes:
        self.seq += 1
        return f"{self.name}:{self.seq}".encode()

    def _append(self, w: Any, payloads: list[bytes]) -> asyncio.Future[Any] | None:
        for p in payloads:
            self.h.log_append(self.name, LOG_NAME, p)
            self.ops += 1
        try:
            if len(payloads) > 1:
                fut = w.append_many(payloads)
            else:  # (one in three as the synchronous WAL appends: sent at once when alone)
                fut = w.append_now(payloads[0]) if self.seq % 3 == 0 else w.append(payloads[0])
        except Exception as exc:  # refused before anything was queued: it did not happen
            self.expected(exc, "log append")
            for p in payloads:
                self.h.log_append_done(self.name, LOG_NAME, p, FAIL, None, type(exc).__name__)
            return None
        fut.add_done_callback(lambda f: self._done(payloads, f))
        return fut  # type: ignore[no-any-return]

    def _done(self, payloads: list[bytes], fut: asyncio.Future[Any]) -> None:
        exc: BaseException | None
        if fut.cancelled():
            exc = asyncio.CancelledError()
        else:
            exc = fut.exception()
            if exc is not None:
                self.expected(exc, "log append")
        if exc is not None:
            for p in payloads:
                self.h.log_append_done(self.name, LOG_NAME, p, INFO, None, type(exc).__name__)
            return
        result = fut.result()
        positions = [result] if len(payloads) == 1 else list(result)
        for p, pos in zip(payloads, positions, strict=True):
            self.h.log_append_done(self.name, LOG_NAME, p, OK, _pos(pos))
        self.last = positions[-1]

    async def _write(self, w: Any) -> None:
        futs: list[asyncio.Future[Any]] = []
        # (a writer process that another took the log from keeps writing until it is fenced:
        # a zombie, as a paused or partitioned process would be)
        while not self.stopping and w.error is None:
            roll = self.rng.random()
            if roll < 0.25:
                payloads = [self._payload() for _ in range(self.rng.randint(2, 6))]
            else:
                payloads = [self._payload()]
            fut = self._append(w, payloads)
            if fut is None:
                return
            futs.append(fut)
            futs = [f for f in futs if not f.done()]
            if len(futs) >= 16:
                await asyncio.wait(futs[:1], timeout=5.0)
            if roll > 0.97:
                await asyncio.wait([asyncio.ensure_future(w.flush())], timeout=5.0)
            elif roll > 0.95 and self.w.log_truncates and self.last is not None:
                await self._truncate(w)
            await sleep(self.rng.expovariate(self.w.log_rate))
        if futs:
            await asyncio.wait(futs, timeout=10.0)

    async def _truncate(self, w: Any) -> None:
        before = self.last if self.rng.random() < 0.5 else self.last.next_slot()
        if self.w.log_cursors:  # (retention after consumption: not past the cursor)
            floor = self.ext.cursor_floor
            if floor is None:
                return
            before = min(before, floor.next_slot())
        try:
            await within(w.truncate(before), 10.0)
        except Exception as exc:
            self.expected(exc, "log truncate")
            self.h.log_truncate(self.name, LOG_NAME, _pos(before), INFO)
            return
        self.h.log_truncate(self.name, LOG_NAME, _pos(before), OK)

    async def final_writes(self) -> None:
        """Liveness: take the log over, append a few records, close (completing the
        segment)."""
        w = await self._open()
        futs = [fut for fut in (self._append(w, [self._payload()]) for _ in range(3))
                if fut is not None]
        await gather(*futs)
        await w.close()
        self.last = w.last_position


class LogReaderProc(Process):
    """Follows the log's tail; starts again (from where it stopped, or from the oldest
    record) after an error."""

    prefix = "lr"
    winds_down = False

    def __init__(self, name: str, client: Any, rng: Any, env: ProcessEnv,
                 ext: LogWorkload) -> None:
        super().__init__(name, client, rng, env)
        self.ext = ext
        self.respawn_args = (ext,)

    async def run(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        nxt: Any = None
        while not self.stopping:
            try:
                nxt = await self._follow(nxt, None)
            except Exception as exc:
                if not self.expected(exc, "log reader"):
                    return
                if type(exc).__name__ == "AlreadyTruncatedError":
                    nxt = None
            if self.rng.random() < 0.1:
                nxt = None  # a new reader from the oldest record
            await asyncio.sleep(self.rng.uniform(0.1, 0.5))

    async def _follow(self, start: Any, stop_at: Any) -> Any:
        """One reader instance from ``start`` (None: the oldest), up to ``stop_at`` (None:
        following the tail); the position to start the next one from."""
        ns = self.client.namespace(NAMESPACE, clock=self.env.wall_clock, tiers=self.tiers())
        log = await ns.open_log(LOG_NAME)
        self.ext.readers += 1
        rid = self.ext.readers
        self.h.log_reader_start(self.name, LOG_NAME, rid, None if start is None else _pos(start))
        reader = log.reader(start=start, stop_at=stop_at)
        nxt = start
        why = "stopped"
        try:
            while not self.stopping:
                batch = await reader.read_batch(64)
                if not batch:
                    why = "end"
                    break
                for rec in batch:
                    self.ops += 1
                    self.h.log_read(self.name, LOG_NAME, rid, _pos(rec.position), rec.data)
                    nxt = rec.position.next_slot()
        except BaseException as exc:
            why = type(exc).__name__
            raise
        finally:
            self.h.log_reader_end(self.name, LOG_NAME, rid, why)
            await reader.aclose()
        return nxt

    async def read_all(self, last: Any) -> None:
        """Liveness: the whole log, from the oldest record kept up to ``last``."""
        if last is None:
            return
        await self._follow(None, last)


# -- the invariants --------------------------------------------------------------------------


def check_logs(history: History, max_per_invariant: int = 5) -> list[Violation]:
    """The log invariants LG1..LG5 (see the module docstring) over ``history``."""
    v = Collector(max_per_invariant)
    out = v.out

    appended: dict[bytes, Event] = {}
    done: dict[bytes, Event] = {}
    epoch_of_append: dict[bytes, int] = {}
    epoch_now: dict[str, int] = {}
    reads: dict[tuple[str, int], list[Event]] = defaultdict(list)
    starts: dict[tuple[str, int], Event] = {}
    truncations: list[Event] = []
    events = history.of_kind("log_open", "log_append", "log_append_done", "log_reader",
                             "log_read", "log_truncate")
    if not events:
        return out
    for ev in events:
        if ev.kind == "log_open" and ev.outcome == OK:
            epoch_now[ev.process] = ev.value
        elif ev.kind == "log_append":
            assert ev.payload is not None
            appended[ev.payload] = ev
            epoch_of_append[ev.payload] = epoch_now.get(ev.process, -1)
        elif ev.kind == "log_append_done":
            assert ev.payload is not None
            done[ev.payload] = ev
        elif ev.kind == "log_reader":
            starts[(ev.process, ev.value)] = ev
        elif ev.kind == "log_read":
            reads[(ev.process, ev.value)].append(ev)
        elif ev.kind == "log_truncate" and ev.outcome in (OK, "stored"):
            truncations.append(ev)

    acked = {p: d for p, d in done.items() if d.outcome == OK and d.pos is not None}
    # LG5: what readers return was appended, where its append said, and one record per place
    at_pos: dict[_Pos, tuple[bytes, Event]] = {}
    pos_of: dict[bytes, tuple[_Pos, Event]] = {}
    for evs in reads.values():
        for ev in evs:
            assert ev.payload is not None and ev.pos is not None
            inv = appended.get(ev.payload)
            if inv is None:
                v("LG5", f"{ev.process} read a record nobody appended at {ev.pos}", ev)
                continue
            d = done.get(ev.payload)
            if d is not None and d.outcome == FAIL:
                v("LG5", f"{ev.process} read a record whose append was refused (aborted read)",
                  inv, d, ev)
            ack = acked.get(ev.payload)
            if ack is not None and ack.pos != ev.pos:
                v("LG5", f"{ev.process} read {ev.payload!r} at {ev.pos}, its append was given "
                  f"{ack.pos}", ack, ev)
            seen = at_pos.get(ev.pos)
            if seen is not None and seen[0] != ev.payload:
                v("LG5", f"two records at {ev.pos}: {seen[0]!r} and {ev.payload!r}", seen[1], ev)
            at_pos.setdefault(ev.pos, (ev.payload, ev))
            where = pos_of.get(ev.payload)
            if where is not None and where[0] != ev.pos:
                v("LG5", f"{ev.payload!r} read at two positions {where[0]} and {ev.pos}",
                  where[1], ev)
            pos_of.setdefault(ev.payload, (ev.pos, ev))

    # LG2: a writer's acknowledged positions increase in append order
    by_writer: dict[str, list[Event]] = defaultdict(list)
    for payload, inv in sorted(appended.items(), key=lambda kv: kv[1].index):
        ack = acked.get(payload)
        if ack is not None:
            by_writer[inv.process].append(ack)
    for writer, acks in by_writer.items():
        for a, b in pairwise(acks):
            assert a.pos is not None and b.pos is not None
            if b.pos <= a.pos:
                v("LG2", f"{writer}: a later append got position {b.pos}, not after {a.pos}",
                  a, b)

    # LG4: each writer epoch's records follow every record of the epochs before it
    by_epoch: dict[int, list[Event]] = defaultdict(list)
    for payload, ack in acked.items():
        by_epoch[epoch_of_append.get(payload, -1)].append(ack)
    older_max: Event | None = None
    for epoch in sorted(by_epoch):
        acks = by_epoch[epoch]
        first = min(acks, key=lambda e: e.pos or (0, 0, 0))
        if older_max is not None and epoch >= 0 and first.pos is not None \
                and older_max.pos is not None and first.pos <= older_max.pos:
            v("LG4", f"writer epoch {epoch} got {first.pos}, not after {older_max.pos} that an "
              "older writer had acknowledged", older_max, first)
        top = max(acks, key=lambda e: e.pos or (0, 0, 0))
        if older_max is None or (top.pos or (0, 0, 0)) > (older_max.pos or (0, 0, 0)):
            older_max = top

    # what the log holds: acknowledged records, and any record some reader returned
    in_log: dict[_Pos, Event] = {}
    for ack in acked.values():
        assert ack.pos is not None
        in_log[ack.pos] = ack
    for evs in reads.values():
        for ev in evs:
            assert ev.pos is not None
            in_log.setdefault(ev.pos, ev)
    known = sorted(in_log)

    # LG2/LG1 per reader instance; LG3 for readers started after a truncation
    final_readers = [k for k in reads if k[0] == "log-final-r"]
    for key, evs in reads.items():
        start = starts.get(key)
        for a, b in pairwise(evs):
            assert a.pos is not None and b.pos is not None
            if b.pos == a.pos:
                v("LG1", f"{key[0]} reader {key[1]} read {a.pos} twice", a, b)
            elif b.pos < a.pos:
                v("LG2", f"{key[0]} reader {key[1]} went back from {a.pos} to {b.pos}", a, b)
        got = {ev.pos for ev in evs}
        assert evs[0].pos is not None and evs[-1].pos is not None
        lo = start.pos if start is not None and start.pos is not None else evs[0].pos
        hi = evs[-1].pos
        if key in final_readers:
            floor = _truncation_at(truncations, len(history.events))
            lo = floor if floor is not None else (0, 0, 0)
            hi = max(known[-1], hi) if known else hi
        for p in known:
            if lo <= p <= hi and p not in got:
                v("LG1", f"{key[0]} reader {key[1]} skipped {p} (read {lo}..{hi})",
                  in_log[p], start)
                break
        if start is not None:
            tb = _truncation_at(truncations, start.index)
            for ev in evs:
                assert ev.pos is not None
                if tb is not None and ev.pos < tb:
                    v("LG3", f"{key[0]} reader {key[1]}, started after the log was truncated "
                      f"before {tb}, returned {ev.pos}", start, ev)
                    break
    out.extend(check_cursors(history, in_log, truncations, max_per_invariant))
    return out


def _truncation_at(truncations: list[Event], index: int) -> _Pos | None:
    """The highest truncation point stored before history index ``index``."""
    best: _Pos | None = None
    for ev in truncations:
        if ev.index < index and ev.pos is not None and (best is None or ev.pos > best):
            best = ev.pos
    return best
