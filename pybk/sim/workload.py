"""Workload processes of a simulated run: writers, tailing readers, recoverers, a deleter.

Each process is a coroutine using the public client API exactly as an application would, and
records what it asked and what it got into the :class:`~pybk.sim.history.History`. Payloads are
unique (``<process>:<seq>``) so the checker can tell every write apart (Jepsen's rule).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pybk.sim.history import INFO, OK, History

__all__ = [
    "PASSWORD",
    "Deleter",
    "Process",
    "Reader",
    "Recoverer",
    "Registry",
    "Workload",
    "Writer",
]

PASSWORD = b"sim"


@dataclass(frozen=True)
class Workload:
    """Shape of the load (per seed; the runner may randomize within these bounds)."""

    writers: int = 1
    readers: int = 1
    recoverers: int = 1
    deletes: bool = True
    entries_per_ledger: tuple[int, int] = (8, 60)
    add_rate: float = 25.0  # adds per virtual second per writer
    window: int = 8  # appends in flight per writer
    payload_size: tuple[int, int] = (0, 48)
    mean_recovery_interval: float = 6.0
    #: run auto-recovery (auditor and workers) and its liveness step and invariants
    autorecovery: bool = True

    @classmethod
    def small(cls) -> Workload:
        return cls(entries_per_ledger=(4, 20), add_rate=10.0)


@dataclass
class Registry:
    """What the processes share: the ledgers created so far and who writes them."""

    ledgers: list[int] = field(default_factory=list)
    writing: dict[int, str] = field(default_factory=dict)
    pending: dict[int, int] = field(default_factory=dict)  # ledger -> adds in flight
    closed: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    seq: int = 0  # payload counter (per run: payloads stay unique and deterministic)


class Process:
    """Base: a name, a client, a stop flag, an rng, the history and coverage counters."""

    def __init__(self, name: str, client: Any, history: History, registry: Registry,
                 rng: random.Random, cover: Callable[[str], None], topology: tuple[int, int, int],
                 workload: Workload) -> None:
        self.name = name
        self.client = client
        self.h = history
        self.reg = registry
        self.rng = rng
        self.cover = cover
        self.topology = topology
        self.w = workload
        self.stopping = False
        self.ops = 0
        self.handles = 0  # ledger handles this process opened
        self.current: Any = None  # a writer's open ledger handle

    def stop(self) -> None:
        self.stopping = True

    def stopped(self) -> bool:
        """The stop flag (a method, so checks after an await are not "unreachable")."""
        return self.stopping


def _err(exc: BaseException) -> str:
    return type(exc).__name__


class Writer(Process):
    """Creates ledgers, appends unique payloads (pipelined), closes and rolls to a new ledger."""

    async def run(self) -> None:
        from pybk.errors import BKError

        e, qw, qa = self.topology
        while not self.stopping:
            try:
                lh = await self.client.create_ledger(ensemble_size=e, write_quorum=qw,
                                                     ack_quorum=qa, digest_type="CRC32C",
                                                     password=PASSWORD)
            except (BKError, TimeoutError) as exc:
                self.h.log and self.h.log(f"{self.name} create failed: {_err(exc)} {exc}")
                await asyncio.sleep(0.5)
                continue
            lid = lh.id
            self.current = lh
            self.h.create(self.name, lid, f"E={e} Qw={qw} Qa={qa}")
            self.reg.ledgers.append(lid)
            self.reg.writing[lid] = self.name
            self.reg.pending[lid] = 0
            try:
                await self._fill(lh, lid)
            finally:
                self.reg.writing.pop(lid, None)
            if self.stopped():
                return
            await self._close(lh, lid)

    async def _fill(self, lh: Any, lid: int) -> None:
        target = self.rng.randint(*self.w.entries_per_ledger)
        futs: list[asyncio.Future[Any]] = []
        ensembles = len(lh.metadata.ensembles)
        for _ in range(target):
            if self.stopping:
                return
            self.reg.seq += 1
            size = self.rng.randint(*self.w.payload_size)
            tag = f"{self.name}:{lid}:{self.reg.seq}:"
            payload = (tag + "x" * max(0, size - len(tag))).encode()
            try:
                fut = lh.append(payload)
            except Exception as exc:  # closed/fenced handle refuses at call time
                self.h.log and self.h.log(f"{self.name} append refused: {_err(exc)}")
                return
            entry = lh.last_add_pushed
            self.ops += 1
            self.h.add_invoke(self.name, lid, entry, payload)
            self.reg.pending[lid] = self.reg.pending.get(lid, 0) + 1
            fut.add_done_callback(lambda f, ent=entry: self._done(lid, ent, f))
            futs.append(fut)
            now_ensembles = len(lh.metadata.ensembles)
            if now_ensembles != ensembles:
                ensembles = now_ensembles
                if self.reg.pending.get(lid, 0) > 1:
                    self.cover("ensemble_change_during_pending_adds")
            inflight = [f for f in futs if not f.done()]
            if len(inflight) >= self.w.window:
                await asyncio.wait(inflight[:1] + inflight[-1:], timeout=5.0,
                                   return_when=asyncio.FIRST_COMPLETED)
            if any(f.done() and (f.cancelled() or f.exception() is not None) for f in futs):
                break  # the handle is broken (fenced, closed, out of bookies): roll over
            await asyncio.sleep(self.rng.expovariate(self.w.add_rate))
        inflight = [f for f in futs if not f.done()]
        if inflight:
            await asyncio.wait(inflight, timeout=15.0)
        if len(lh.metadata.ensembles) > 1:
            self.cover("ledger_with_ensemble_change")

    def _done(self, lid: int, entry: int, fut: asyncio.Future[Any]) -> None:
        self.reg.pending[lid] = self.reg.pending.get(lid, 1) - 1
        if fut.cancelled():
            self.h.add_complete(self.name, lid, entry, INFO, "cancelled")
            return
        exc = fut.exception()
        if exc is None:
            self.h.add_complete(self.name, lid, entry, OK)
            return
        name = _err(exc)
        if name == "LedgerFencedError":
            self.cover("writer_fenced")
        self.h.add_complete(self.name, lid, entry, INFO, name)

    async def _close(self, lh: Any, lid: int) -> None:
        self.h.close_invoke(self.name, lid, "close")
        try:
            await asyncio.wait_for(lh.close(), 20.0)
        except Exception as exc:
            self.h.close_complete(self.name, lid, "close", INFO, detail=_err(exc))
            return
        self.reg.closed.append(lid)
        md = lh.metadata
        if md.state != "CLOSED":  # fenced: the handle closed locally only
            self.h.close_complete(self.name, lid, "close", INFO, detail=f"local ({md.state})")
            return
        self.h.close_complete(self.name, lid, "close", OK, md.last_entry_id)


class Reader(Process):
    """Tails ledgers without recovery: LAC reads, long polls, reads up to the LAC."""

    async def run(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.5, 2.0))
        while not self.stopping:
            if not self.reg.ledgers:
                await asyncio.sleep(0.5)
                continue
            writing = [lid for lid in self.reg.ledgers if lid in self.reg.writing]
            pool = writing if writing and self.rng.random() < 0.8 else self.reg.ledgers
            lid = self.rng.choice(pool)
            if lid in self.reg.deleted:
                continue
            try:
                await self._tail(lid)
            except Exception as exc:
                self.h.log and self.h.log(f"{self.name} tail L{lid} ended: {_err(exc)} {exc}")
            await asyncio.sleep(0.3)

    async def _tail(self, lid: int) -> None:
        rh = await asyncio.wait_for(
            self.client.open_ledger(lid, password=PASSWORD, recovery=False), 10.0)
        self.handles += 1
        handle = self.handles
        nxt = 0
        polls = 0
        while not self.stopping and polls < 200:
            polls += 1
            self.ops += 1
            await asyncio.wait_for(rh.read_last_add_confirmed(), 10.0)
            lac = rh.last_add_confirmed
            self.h.lac(self.name, lid, lac, handle)
            if lac >= nxt:
                last = min(lac, nxt + 15)
                entries = await asyncio.wait_for(rh.read(nxt, last), 10.0)
                for ent in entries:
                    self.h.read(self.name, lid, ent.entry_id, ent.data, lac, recovery=False)
                nxt = last + 1
                continue
            if rh.is_closed:
                return
            ent = await asyncio.wait_for(
                rh.read_last_add_confirmed_and_entry(nxt, timeout=1.0), 10.0)
            lac = rh.last_add_confirmed
            self.h.lac(self.name, lid, lac, handle)
            if ent is not None:
                self.cover("long_poll_hit")
                self.h.read(self.name, lid, ent.entry_id, ent.data, lac, recovery=False)
                nxt = ent.entry_id + 1


class Recoverer(Process):
    """Opens ledgers with recovery (often while their writer is still writing) and reads them."""

    async def run(self) -> None:
        await asyncio.sleep(self.rng.uniform(2.0, 6.0))
        while not self.stopping:
            candidates = [lid for lid in self.reg.ledgers if lid not in self.reg.deleted]
            if candidates:
                writing = [lid for lid in candidates if lid in self.reg.writing]
                pool = writing if writing and self.rng.random() < 0.7 else candidates
                await self.recover(self.rng.choice(pool))
            await asyncio.sleep(self.rng.expovariate(1.0 / self.w.mean_recovery_interval))

    async def recover(self, lid: int, how: str = "recover", final: bool = False,
                      bound: float = 20.0) -> int | None:
        if self.reg.pending.get(lid, 0) > 0 and lid in self.reg.writing:
            self.cover("recovery_while_adds_pending")
        self.h.close_invoke(self.name, lid, how)
        self.ops += 1
        try:
            rh = await asyncio.wait_for(
                self.client.open_ledger(lid, password=PASSWORD, recovery=True), bound)
        except Exception as exc:
            name = _err(exc)
            if name == "LedgerRecoveryError":
                self.cover("ledger_recovery_error")
            self.h.close_complete(self.name, lid, how, INFO, detail=f"{name} {exc}")
            return None
        last = int(rh.metadata.last_entry_id) if rh.is_closed else int(rh.last_add_confirmed)
        self.h.close_complete(self.name, lid, how, OK, last)
        nxt = 0
        while nxt <= last:
            hi = min(last, nxt + 31)
            try:
                entries = await asyncio.wait_for(rh.read(nxt, hi), bound)
            except Exception as exc:
                self.h.read_error(self.name, lid, nxt, f"{_err(exc)} {exc}", final=final)
                return last
            for ent in entries:
                self.h.read(self.name, lid, ent.entry_id, ent.data, last, recovery=True,
                            final=final)
            nxt = hi + 1
        return last


class Deleter(Process):
    """Deletes an old closed ledger now and then."""

    async def run(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.rng.uniform(5.0, 15.0))
            old = [lid for lid in self.reg.closed[:-2]
                   if lid not in self.reg.deleted and lid not in self.reg.writing]
            if not old or self.stopping:
                continue
            lid = self.rng.choice(old)
            self.reg.deleted.append(lid)
            self.h.delete(self.name, lid, "invoke")
            self.ops += 1
            try:
                await asyncio.wait_for(self.client.delete_ledger(lid), 10.0)
                self.h.delete(self.name, lid, OK)
            except Exception as exc:
                self.h.delete(self.name, lid, INFO + " " + _err(exc))
