"""The ledger-mode workload: writers of caller-chosen entry ids and of deferred-sync ledgers,
with readers and recoverers of their own (``Workload(adv_writers=, deferred_writers=)``;
each drawn in one seed of eight).

* :class:`AdvWriter` (``client.create_ledger_adv``) adds each ledger's ids shuffled within
  blocks, several in flight at once, now and then offers an id again (it must be refused),
  and in a third of its ledgers leaves an id out and closes: the ids after the gap were
  never sent and must not have been acknowledged.
* :class:`DeferredWriter` (``write_flags={"deferred_sync"}``) appends without the bookies'
  fsync and calls ``force()`` every few entries; the run's crashes drop what the bookies
  had not synced.
* :class:`ModeReader` tails the ledgers without recovery (their LAC); :class:`ModeRecoverer`
  recovers them (fencing their writer) now and then, as the ledger workload's do.

In the liveness phase every ledger is recovered and read back. The invariants (AV1, AV2,
DS1, DS2) are :mod:`pybk.sim.ledger_modes_checks`'. The workload keeps its own record, not
the history's add events: a deferred ledger's acknowledged adds are no durability promise.
"""

from __future__ import annotations

import asyncio
import functools
import random
from typing import TYPE_CHECKING, Any

from pybk.errors import DuplicateEntryIdError
from pybk.runtime.eventloop import within
from pybk.sim.checker import Violation
from pybk.sim.ledger_modes_checks import ModeLedger, check_modes
from pybk.sim.loop import sleep
from pybk.sim.workload import PASSWORD, Process, ProcessEnv

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["AdvWriter", "DeferredWriter", "LedgerModes", "ModeReader", "ModeRecoverer"]


class LedgerModes:
    """The extension of a run (see the module docstring)."""

    name = "ledger_modes"

    @classmethod
    def for_run(cls, run: SimRun) -> LedgerModes | None:
        wl = run.workload
        if getattr(wl, "adv_writers", 0) or getattr(wl, "deferred_writers", 0):
            return cls(run)
        return None

    def __init__(self, run: SimRun) -> None:
        self.run = run
        self.ledgers: dict[int, ModeLedger] = {}
        self.writing: set[int] = set()
        self._tick = 0

    def now(self) -> tuple[int, int]:
        """The time of a record: (history length, tick)."""
        self._tick += 1
        return (len(self.run.history.events), self._tick)

    def log(self, text: str) -> int:
        return self.run.log(text)

    async def start(self) -> None:
        run, wl = self.run, self.run.workload
        for _ in range(wl.adv_writers):
            run.cover("workload_adv_ledgers")
            run.spawn(AdvWriter, "aw", self)
        for _ in range(wl.deferred_writers):
            run.cover("workload_deferred_ledgers")
            run.spawn(DeferredWriter, "dw", self)
        run.spawn(ModeReader, "mr", self)
        run.spawn(ModeRecoverer, "mrc", self)

    async def settle(self) -> None:
        """Recover every ledger and read it back (what the invariants compare with)."""
        run = self.run
        final = ModeRecoverer("modes-final", run.cluster.client("modes-final"),
                              run.rng_for("modes-final"), run.env, self)
        for lid in sorted(self.ledgers):
            lg = self.ledgers[lid]
            last = await final.recover(lg, final=True)
            if last is None:
                run.history.liveness(f"recover {lg.kind} L{lid}", False,
                                     lg.final_error or "recovery did not complete")

    def check(self) -> list[Violation]:
        return check_modes(self.ledgers, self.run.history.events,
                           beyond_tolerance=self.run.plan.beyond_tolerance)

    async def close(self) -> None:
        pass


class _ModeProcess(Process):
    def __init__(self, name: str, client: Any, rng: random.Random, env: ProcessEnv,
                 modes: LedgerModes) -> None:
        super().__init__(name, client, rng, env)
        self.modes = modes
        self.respawn_args = (modes,)

    def _pick(self, writing_share: float) -> ModeLedger | None:
        ledgers = self.modes.ledgers
        if not ledgers:
            return None
        writing = sorted(self.modes.writing)
        pool = writing if writing and self.rng.random() < writing_share else sorted(ledgers)
        return ledgers[self.rng.choice(pool)]


class _ModeWriter(_ModeProcess):
    kind = ""

    async def run(self) -> None:
        e, qw, qa = self.topology
        while not self.stopping:
            try:
                lh = await within(self._create(e, qw, qa), 20.0)
            except Exception as exc:
                if not self.expected(exc, f"create {self.kind} ledger"):
                    return
                await asyncio.sleep(0.5)
                continue
            lg = ModeLedger(lh.id, self.kind, qa, self.name)
            self.modes.ledgers[lh.id] = lg
            self.modes.writing.add(lh.id)
            self.current = lh
            self.modes.log(f"{self.name} create {self.kind} L{lh.id} E={e} Qw={qw} Qa={qa}")
            try:
                await self._fill(lh, lg)
            finally:
                self.modes.writing.discard(lh.id)
            if self.stopped():
                return
            await self._close(lh, lg)

    async def _create(self, e: int, qw: int, qa: int) -> Any:
        raise NotImplementedError

    async def _fill(self, lh: Any, lg: ModeLedger) -> None:
        raise NotImplementedError

    def _payload(self, lid: int) -> bytes:
        self.reg.seq += 1
        size = self.rng.randint(*self.w.payload_size)
        tag = f"{self.name}:{lid}:{self.reg.seq}:"
        return (tag + "x" * max(0, size - len(tag))).encode()

    def _done(self, lg: ModeLedger, entry: int, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            lg.acked[entry] = self.modes.log(f"{self.name} ack L{lg.lid}:{entry}")
        elif not isinstance(exc, self.env.expected):
            self.unexpected(exc, f"add L{lg.lid}:{entry}")

    async def _window(self, futs: list[asyncio.Future[Any]]) -> list[asyncio.Future[Any]]:
        futs = [f for f in futs if not f.done()]
        if len(futs) >= self.w.window:
            await asyncio.wait(futs[:1] + futs[-1:], timeout=5.0,
                               return_when=asyncio.FIRST_COMPLETED)
        return futs

    async def _close(self, lh: Any, lg: ModeLedger) -> None:
        if lg.exempt_at is None:
            lg.exempt_at = self.modes.now()
        try:
            await within(lh.close(), 20.0)
        except Exception as exc:
            self.expected(exc, f"close L{lg.lid}")
            self.modes.log(f"{self.name} close L{lg.lid} failed: {type(exc).__name__}")
            return
        md = lh.metadata
        self.modes.log(f"{self.name} closed L{lg.lid} ({md.state} at {md.last_entry_id})")


class AdvWriter(_ModeWriter):
    """Caller-chosen ids, shuffled, in parallel, with duplicates and gaps (module docstring)."""

    kind = "adv"

    async def _create(self, e: int, qw: int, qa: int) -> Any:
        return await self.client.create_ledger_adv(e, qw, qa, "CRC32C", PASSWORD)

    async def _fill(self, lh: Any, lg: ModeLedger) -> None:
        n = self.rng.randint(*self.w.entries_per_ledger)
        order: list[int] = []
        for first in range(0, n, 6):
            block = list(range(first, min(n, first + 6)))
            self.rng.shuffle(block)
            order += block
        if n > 4 and self.rng.random() < 1 / 3:  # an id left out: the ids after it wait
            gap = self.rng.randrange(n // 2, n - 1)
            order.remove(gap)
            self.modes.log(f"{self.name} L{lg.lid} leaves id {gap} out")
            self.cover("adv_gap_left")
        futs: list[asyncio.Future[Any]] = []
        for eid in order:
            if self.stopping:
                return
            payload = self._payload(lg.lid)
            try:
                fut = lh.append(eid, payload)
            except Exception as exc:
                if self.expected(exc, "append"):
                    self.modes.log(f"{self.name} append refused: {type(exc).__name__}")
                break
            self.ops += 1
            lg.payloads[eid] = payload
            self.modes.log(f"{self.name} add L{lg.lid}:{eid} {payload.decode()[:60]}")
            fut.add_done_callback(functools.partial(self._done, lg, eid))
            futs.append(fut)
            if self.rng.random() < 0.1:
                self._duplicate(lh, lg)
            futs = await self._window(futs)
            if any(f.done() and not f.cancelled() and f.exception() is not None for f in futs):
                break  # (fenced, closed, out of bookies: roll over)
            await sleep(self.rng.expovariate(self.w.add_rate))
        sent = [f for f in futs if not f.done()]
        if sent:
            await asyncio.wait(sent, timeout=5.0)

    def _duplicate(self, lh: Any, lg: ModeLedger) -> None:
        eid = self.rng.choice(sorted(lg.payloads))
        try:
            fut = lh.append(eid, b"duplicate")
        except DuplicateEntryIdError:
            self.cover("adv_duplicate_refused")
            return
        except Exception as exc:
            self.expected(exc, "append a duplicate")
            return
        fut.cancel()
        self.unexpected(AssertionError(f"L{lg.lid}: id {eid} added twice"), "append")


class DeferredWriter(_ModeWriter):
    """Deferred-sync appends and a ``force()`` every few entries (module docstring)."""

    kind = "deferred"

    async def _create(self, e: int, qw: int, qa: int) -> Any:
        return await self.client.create_ledger(e, qw, qa, "CRC32C", PASSWORD,
                                               write_flags={"deferred_sync"})

    async def _fill(self, lh: Any, lg: ModeLedger) -> None:
        n = self.rng.randint(*self.w.entries_per_ledger)
        force_at = self.rng.randint(2, 8)
        futs: list[asyncio.Future[Any]] = []
        for i in range(n):
            if self.stopping:
                return
            payload = self._payload(lg.lid)
            try:
                fut = lh.append(payload)
            except Exception as exc:
                if self.expected(exc, "append"):
                    self.modes.log(f"{self.name} append refused: {type(exc).__name__}")
                return
            eid = lh.last_add_pushed
            self.ops += 1
            lg.payloads[eid] = payload
            self.modes.log(f"{self.name} add L{lg.lid}:{eid} {payload.decode()[:60]}")
            fut.add_done_callback(functools.partial(self._done, lg, eid))
            futs.append(fut)
            if i + 1 >= force_at:
                force_at += self.rng.randint(2, 8)
                if not await self._force(lh, lg):
                    return
            futs = await self._window(futs)
            await sleep(self.rng.expovariate(self.w.add_rate))
        if not self.stopping:
            await self._force(lh, lg)

    async def _force(self, lh: Any, lg: ModeLedger) -> bool:
        """One force; what it returned is recorded the moment it returns (no task between:
        a reader must not learn the LAC first)."""
        self.modes.log(f"{self.name} force L{lg.lid} (pushed up to {lh.last_add_pushed})")
        try:
            lac = await lh.force()
        except Exception as exc:
            if self.expected(exc, "force"):
                self.modes.log(f"{self.name} force L{lg.lid} failed: {type(exc).__name__}")
            return False
        at = self.modes.now()
        lg.forces.append((at, lac, self.modes.log(f"{self.name} forced L{lg.lid} to {lac}")))
        self.cover("deferred_force_completed")
        return True


class ModeReader(_ModeProcess):
    """Reads the LAC of the workload's ledgers (no recovery) and the entries up to it."""

    winds_down = False

    async def run(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        while not self.stopping:
            lg = self._pick(0.8)
            if lg is None:
                await asyncio.sleep(0.5)
                continue
            try:
                await self._tail(lg)
            except Exception as exc:
                if not self.expected(exc, f"tail L{lg.lid}"):
                    return
            await asyncio.sleep(0.3)

    async def _tail(self, lg: ModeLedger) -> None:
        rh = await within(
            self.client.open_ledger(lg.lid, password=PASSWORD, recovery=False), 10.0)
        nxt = 0
        seen = -2
        for _poll in range(40):
            if self.stopping:
                return
            self.ops += 1
            await within(rh.read_last_add_confirmed(), 10.0)
            lac = rh.last_add_confirmed
            if lac != seen:
                seen = lac
                at = self.modes.now()
                line = self.modes.log(f"{self.name} L{lg.lid} LAC {lac}")
                lg.lacs.append((at, lac, self.name, line, rh.is_closed))
            if lac >= nxt:
                last = min(lac, nxt + 15)
                for ent in await within(rh.read(nxt, last), 10.0):
                    lg.reads.setdefault(ent.entry_id, (ent.data, -1))
                nxt = last + 1
            elif rh.is_closed:
                return
            await asyncio.sleep(self.rng.uniform(0.1, 0.5))


class ModeRecoverer(_ModeProcess):
    """Recovers the workload's ledgers now and then, often while they are written."""

    async def run(self) -> None:
        await asyncio.sleep(self.rng.uniform(2.0, 6.0))
        while not self.stopping:
            lg = self._pick(0.7)
            if lg is not None:
                await self.recover(lg)
            await asyncio.sleep(self.rng.expovariate(1.0 / self.w.mean_recovery_interval))

    async def recover(self, lg: ModeLedger, final: bool = False) -> int | None:
        if lg.exempt_at is None:
            lg.exempt_at = self.modes.now()
        if lg.lid in self.modes.writing:
            self.cover(f"{lg.kind}_ledger_recovered_while_written")
        self.ops += 1
        try:
            rh = await within(
                self.client.open_ledger(lg.lid, password=PASSWORD, recovery=True), 20.0)
        except Exception as exc:
            self.expected(exc, f"recover L{lg.lid}")
            self.modes.log(f"{self.name} recover L{lg.lid} failed: {type(exc).__name__}")
            if final:
                lg.final_error = f"{type(exc).__name__}: {exc}"
            return None
        last = int(rh.metadata.last_entry_id)
        line = self.modes.log(f"{self.name} recovered L{lg.lid} at {last}")
        lg.seals.append((self.name, last, line))
        if not final:
            return last
        try:
            for first in range(0, last + 1, 32):
                for ent in await within(rh.read(first, min(last, first + 31)), 20.0):
                    lg.reads[ent.entry_id] = (ent.data, line)
        except Exception as exc:
            self.expected(exc, f"read L{lg.lid}")
            lg.final_error = f"{type(exc).__name__}: {exc}"
        lg.final_last = last
        return last
