"""Workload processes of a simulated run: writers, tailing readers, recoverers, a deleter.

Each process is a coroutine using the public client API exactly as an application would, and
records what it asked and what it got into the :class:`~pybk.sim.history.History`. Payloads are
unique (``<process>:<ledger>:<seq>``) so the checker can tell every write apart (Jepsen's rule).

A process handles the errors injected faults explain (:data:`pybk.sim.findings.EXPECTED`: a
timeout, a fenced ledger, a bookie gone...) as an application would: it records them and goes
on. Any other exception is a finding (``Process.unexpected``, invariant X1): a bug that raises
instead of corrupting data is a bug all the same.

The log workload (writers and tailing readers of a :mod:`pybk.logs` log) lives in
:mod:`pybk.sim.logs`.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pybk.logs.tier_access import TierOpener
from pybk.metadata.tenancy import NAMESPACE_KEY
from pybk.runtime.eventloop import within
from pybk.sim.findings import EXPECTED
from pybk.sim.history import FAIL, INFO, OK, History
from pybk.sim.loop import sleep

__all__ = [
    "PASSWORD",
    "Deleter",
    "Process",
    "ProcessEnv",
    "Reader",
    "Recoverer",
    "Registry",
    "Workload",
    "Writer",
]

PASSWORD = b"sim"

T = TypeVar("T")


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
    #: writers and tailing readers of one pybk.logs log (pybk.sim.logs)
    log_writers: int = 1
    log_readers: int = 1
    #: log appends per virtual second (a quarter of them batches of 2-6 records)
    log_rate: float = 8.0
    #: the log writer truncates the log now and then
    log_truncates: bool = True
    #: cursor consumers of the log (pybk.sim.cursors; drawn in a quarter of the log seeds)
    log_cursors: int = 0
    #: the log offloads its segments to a simulated object store (pybk.sim.tier; drawn in a
    #: quarter of the log seeds)
    log_offload: bool = False
    #: uploads to the simulated tier are cut short too, and a sweeper runs the orphan sweep
    #: beside the offloads (pybk.sim.tier_sweep; drawn in half the seeds that offload)
    log_tier_sweep: bool = False
    #: table servers with their clients on one range (pybk.sim.tables; drawn in one seed of 8)
    table_clients: int = 0
    #: a log mirrored into a second simulated cluster (pybk.sim.mirror; drawn in one seed
    #: of eight)
    mirror: bool = False
    #: bookies in isolation groups and regions; half the writers' ledgers belong to a
    #: namespace bound to a group, placed region-aware (pybk.sim.tenancy; opt in, not drawn)
    tenancy: bool = False
    #: the bookies' tenancy gate: principals, a namespace with drawn limits beside another
    #: tenant's (pybk.sim.tenancy_gate; drawn in one seed of sixteen; on with ``tenancy``)
    tenancy_gate: bool = False
    #: writers of caller-chosen entry ids and of deferred-sync ledgers, with their readers and
    #: recoverers (pybk.sim.ledger_modes; each drawn in one seed of eight)
    adv_writers: int = 0
    deferred_writers: int = 0

    @classmethod
    def small(cls) -> Workload:
        return cls(entries_per_ledger=(4, 20), add_rate=10.0)

    @classmethod
    def draw(cls, rng: random.Random,
             extra: Callable[[str], random.Random] | None = None) -> Workload:
        """A seed's load when the caller gives none (swarm testing: light and heavy loads
        find different bugs): the writers' add rate and the log's append rate vary, and half
        of the seeds also run the log workload (pybk.sim.logs), one in eight table servers
        and their clients (pybk.sim.tables) and one in sixteen the bookies' tenancy gate
        (pybk.sim.tenancy_gate; each drawn after the others, so the earlier draws stay put). A
        quarter of the seeds with logs also run a cursor consumer (pybk.sim.cursors), and a
        quarter offload to a simulated tier (pybk.sim.tier), half of those with torn uploads
        and the orphan sweep (pybk.sim.tier_sweep), each drawn from a stream of its own
        (``extra(name)``): a seed that draws none of them runs as before. So are, in one seed
        of eight each, a writer of caller-chosen entry ids, a writer of a deferred-sync
        ledger (pybk.sim.ledger_modes) and a log mirrored into a second cluster
        (pybk.sim.mirror)."""
        logs = 1 if rng.random() < 0.5 else 0
        add_rate, log_rate = rng.choice((6.0, 12.0, 25.0)), rng.choice((3.0, 8.0))
        tables = 3 if rng.random() < 1 / 8 else 0
        gate = rng.random() < 1 / 16
        cursors = 1 if logs and extra is not None and extra("cursors").random() < 1 / 4 else 0
        offload = bool(logs and extra is not None and extra("offload").random() < 1 / 4)
        sweep = bool(offload and extra is not None and extra("tier-sweep").random() < 1 / 2)
        adv = 1 if extra is not None and extra("adv").random() < 1 / 8 else 0
        deferred = 1 if extra is not None and extra("deferred").random() < 1 / 8 else 0
        mirror = extra is not None and extra("mirror").random() < 1 / 8
        return cls(add_rate=add_rate, log_rate=log_rate, log_writers=logs, log_readers=logs,
                   table_clients=tables, tenancy_gate=gate, log_cursors=cursors,
                   log_offload=offload, log_tier_sweep=sweep, adv_writers=adv,
                   deferred_writers=deferred, mirror=mirror)


@dataclass
class Registry:
    """What the processes share: the ledgers created so far and who writes them."""

    ledgers: list[int] = field(default_factory=list)
    #: the namespace (``tenant/ns``) writers put every other ledger in (None: none)
    namespace: str | None = None
    writing: dict[int, str] = field(default_factory=dict)
    pending: dict[int, int] = field(default_factory=dict)  # ledger -> adds in flight
    closed: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    seq: int = 0  # payload counter (per run: payloads stay unique and deterministic)


@dataclass
class ProcessEnv:
    """What every process of a run is given besides its name, client and generator."""

    history: History
    registry: Registry
    cover: Callable[[str], None]
    topology: tuple[int, int, int]
    workload: Workload
    #: writers use the batched add path (``LedgerHandle.append_many``)
    batched_adds: bool = False
    #: (lid, entry) -> did any AddRequest for it ever leave a client? (a failed add that
    #: never did definitely failed: Jepsen's "fail", not "info")
    was_sent: Callable[[int, int], bool] = lambda lid, entry: True
    #: wall-clock seconds for logs (retention by age); jumps with the clock-jump fault
    wall_clock: Callable[[], float] = lambda: 0.0
    #: the exceptions the run's faults and configuration explain (pybk.sim.findings; a
    #: storage quota adds QuotaExceededError, pybk.sim.tenancy_gate)
    expected: tuple[type[BaseException], ...] = EXPECTED
    #: opens the logs' offload tiers (``client.namespace(tiers=)``; None: the default)
    tiers: TierOpener | None = None


class Process:
    """Base: a name, a client, a stop flag, an rng, the history and coverage counters."""

    def __init__(self, name: str, client: Any, rng: random.Random, env: ProcessEnv) -> None:
        self.name = name
        self.client = client
        self.env = env
        self.h = env.history
        self.reg = env.registry
        self.rng = rng
        self.cover = env.cover
        self.topology = env.topology
        self.w = env.workload
        self.stopping = False
        self.ops = 0
        self.handles = 0  # ledger handles this process opened
        self.current: Any = None  # a writer's open ledger handle

    def stop(self) -> None:
        self.stopping = True

    def tiers(self) -> TierOpener | None:
        """The logs' tier opener for this process: its calls stop when the process dies."""
        opener: Any = self.env.tiers  # (the simulated store's, which takes an owner)
        return None if opener is None else functools.partial(opener, owner=self.name)

    def stopped(self) -> bool:
        """The stop flag (a method, so checks after an await are not "unreachable")."""
        return self.stopping

    def expected(self, exc: BaseException, where: str) -> bool:
        """True if ``exc`` is an outcome injected faults explain (the caller goes on); else
        it is recorded as a finding (X1) and False."""
        if isinstance(exc, self.env.expected):
            return True
        self.unexpected(exc, where)
        return False

    def unexpected(self, exc: BaseException, where: str) -> None:
        import traceback

        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.h.exception(self.name, where, exc, tb)

    def log(self, text: str) -> None:
        if self.h.log is not None:
            self.h.log(f"{self.name} {text}")


def _err(exc: BaseException) -> str:
    return type(exc).__name__


class _Broken:
    """Did any of a ledger's adds fail? (a done-callback, not a scan of every future)"""

    __slots__ = ("failed",)

    def __init__(self) -> None:
        self.failed = False

    def note(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.failed = True


class Writer(Process):
    """Creates ledgers, appends unique payloads (pipelined), closes and rolls to a new ledger."""

    async def run(self) -> None:
        e, qw, qa = self.topology
        made = 0
        while not self.stopping:
            ns = self.reg.namespace if made % 2 == 0 else None
            custom = {} if ns is None else {NAMESPACE_KEY: ns.encode()}
            try:
                lh = await self.client.create_ledger(ensemble_size=e, write_quorum=qw,
                                                     ack_quorum=qa, digest_type="CRC32C",
                                                     password=PASSWORD,
                                                     custom_metadata=custom)
                made += 1
            except Exception as exc:
                if not self.expected(exc, "create_ledger"):
                    return
                self.log(f"create failed: {_err(exc)} {exc}")
                await asyncio.sleep(0.5)
                continue
            lid = lh.id
            self.current = lh
            self.h.create(self.name, lid, f"E={e} Qw={qw} Qa={qa}"
                          + (" batched" if self.env.batched_adds else ""), qa=qa)
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

    def _payload(self, lid: int) -> bytes:
        self.reg.seq += 1
        size = self.rng.randint(*self.w.payload_size)
        tag = f"{self.name}:{lid}:{self.reg.seq}:"
        return (tag + "x" * max(0, size - len(tag))).encode()

    def _push(self, lh: Any, lid: int) -> list[asyncio.Future[Any]] | None:
        """One add (or, on the batched path, a batch of 1-4): the futures to wait for, or
        None when the handle refused (closed, fenced)."""
        if not self.env.batched_adds:
            payload = self._payload(lid)
            try:
                fut = lh.append(payload)
            except Exception as exc:  # closed/fenced handle refuses at call time
                if self.expected(exc, "append"):
                    self.log(f"append refused: {_err(exc)}")
                return None
            entry = lh.last_add_pushed
            self.ops += 1
            self.h.add_invoke(self.name, lid, entry, payload)
            self.reg.pending[lid] = self.reg.pending.get(lid, 0) + 1
            fut.add_done_callback(lambda f, ent=entry: self._done(lid, ent, f))
            return [fut]
        payloads = [self._payload(lid) for _ in range(self.rng.randint(1, 4))]
        before = lh.last_add_pushed
        try:
            batch = lh.append_many(payloads)
        except Exception as exc:
            if self.expected(exc, "append_many"):
                self.log(f"append_many refused: {_err(exc)}")
            return None
        # the coroutine assigns the entry ids when it starts: start it now
        task = asyncio.ensure_future(batch)
        loop = asyncio.get_running_loop()
        recorded: asyncio.Future[None] = loop.create_future()
        # (looked at two turns later, once the batch's task has pushed its entries: callbacks,
        # not a task per batch)
        loop.call_soon(loop.call_soon, self._record_batch, lh, lid, before, payloads, task,
                       recorded)
        return [task, recorded]

    def _record_batch(self, lh: Any, lid: int, before: int, payloads: list[bytes],
                      task: asyncio.Future[Any], recorded: asyncio.Future[None]) -> None:
        if lh.last_add_pushed != before + len(payloads):  # refused before anything was pushed
            def refused(_task: asyncio.Future[Any]) -> None:
                exc = None if task.cancelled() else task.exception()
                if exc is not None and self.expected(exc, "append_many"):
                    self.log(f"append_many refused: {_err(exc)}")
                if not recorded.done():
                    recorded.set_result(None)

            task.add_done_callback(refused)
            return
        entries = list(range(before + 1, before + 1 + len(payloads)))
        for entry, payload in zip(entries, payloads, strict=True):
            self.ops += 1
            self.h.add_invoke(self.name, lid, entry, payload)
        self.reg.pending[lid] = self.reg.pending.get(lid, 0) + len(entries)

        def completed(_task: asyncio.Future[Any]) -> None:
            for entry in entries:
                self._done(lid, entry, task)
            if not recorded.done():
                recorded.set_result(None)

        task.add_done_callback(completed)

    async def _fill(self, lh: Any, lid: int) -> None:
        target = self.rng.randint(*self.w.entries_per_ledger)
        futs: list[asyncio.Future[Any]] = []
        broken = _Broken()
        ensembles = len(lh.metadata.ensembles)
        pushed = 0
        while pushed < target:
            if self.stopping:
                return
            new = self._push(lh, lid)
            if new is None:
                return
            pushed += 1
            for fut in new:
                fut.add_done_callback(broken.note)
            futs.extend(new)
            now_ensembles = len(lh.metadata.ensembles)
            if now_ensembles != ensembles:
                ensembles = now_ensembles
                if self.reg.pending.get(lid, 0) > 1:
                    self.cover("ensemble_change_during_pending_adds")
            if len(futs) >= self.w.window:
                futs = [f for f in futs if not f.done()]
                if len(futs) >= self.w.window:
                    await asyncio.wait(futs[:1] + futs[-1:], timeout=5.0,
                                       return_when=asyncio.FIRST_COMPLETED)
            if broken.failed:
                break  # the handle is broken (fenced, closed, out of bookies): roll over
            await sleep(self.rng.expovariate(self.w.add_rate))
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
        if not isinstance(exc, self.env.expected):
            self.unexpected(exc, f"add L{lid}:{entry}")
        # never sent to any bookie: it definitely did not happen
        outcome = INFO if self.env.was_sent(lid, entry) else FAIL
        if outcome == FAIL:
            self.cover("add_failed_unsent")
        self.h.add_complete(self.name, lid, entry, outcome, name)

    async def _close(self, lh: Any, lid: int) -> None:
        self.h.close_invoke(self.name, lid, "close")
        try:
            await within(lh.close(), 20.0)
        except Exception as exc:
            self.expected(exc, "close")
            self.h.close_complete(self.name, lid, "close", INFO, detail=_err(exc))
            return
        self.reg.closed.append(lid)
        md = lh.metadata
        if md.state != "CLOSED":  # fenced: the handle closed locally only
            self.h.close_complete(self.name, lid, "close", INFO, detail=f"local ({md.state})")
            return
        self.h.close_complete(self.name, lid, "close", OK, md.last_entry_id)


class Reader(Process):
    """Tails ledgers without recovery: LAC reads, long polls, reads up to the LAC.

    A long poll the bookies answer at once without the entry (the ledger is fenced, its
    bookies are stopping) is followed by a LAC read and, until something changes, by polls
    spaced out exponentially up to the long-poll timeout: what the log reader
    (:class:`pybk.logs.reader.LogReader`) does, rather than polling again at once, which
    would make as many rounds as the network's round trips allow until the ledger closes."""

    winds_down = False  # (stopped at once when faults stop: it has nothing to finish)

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
                if not self.expected(exc, f"tail L{lid}"):
                    return
                self.log(f"tail L{lid} ended: {_err(exc)} {exc}")
            await asyncio.sleep(0.3)

    async def _tail(self, lid: int) -> None:
        rh = await within(
            self.client.open_ledger(lid, password=PASSWORD, recovery=False), 10.0)
        self.handles += 1
        handle = self.handles
        if self.rng.random() < 0.5:
            await self._follow(rh, lid, handle)
            return
        nxt = 0
        polls = 0
        seen = -2
        ask = True  # ask the bookies for the LAC (else wait for the next entry: a long poll)
        backoff = 0.0  # before the next poll, after polls answered at once without the entry
        loop = asyncio.get_running_loop()
        while not self.stopping and polls < 200:
            polls += 1
            self.ops += 1
            if ask:
                await within(rh.read_last_add_confirmed(), 10.0)
            ask = False  # (asked again only after a long poll that brought nothing)
            lac = rh.last_add_confirmed
            if lac != seen:  # (an unchanged LAC tells the checker nothing new)
                self.h.lac(self.name, lid, lac, handle)
                seen = lac
            if lac >= nxt:
                last = min(lac, nxt + 15)
                entries = await within(rh.read(nxt, last), 10.0)
                for ent in entries:
                    self.h.read(self.name, lid, ent.entry_id, ent.data, lac, recovery=False)
                nxt = last + 1
                continue
            if rh.is_closed:
                return
            if backoff:
                await asyncio.sleep(backoff)
            started = loop.time()
            ent = await within(
                rh.read_last_add_confirmed_and_entry(nxt, timeout=1.0), 10.0)
            lac = rh.last_add_confirmed
            if lac != seen:
                self.h.lac(self.name, lid, lac, handle)
                seen = lac
                backoff = 0.0
            if ent is not None:
                self.cover("long_poll_hit")
                self.h.read(self.name, lid, ent.entry_id, ent.data, lac, recovery=False)
                nxt = ent.entry_id + 1
                backoff = 0.0
            else:
                ask = True
                if loop.time() - started < 0.1:  # answered at once (a tenth of the timeout)
                    self.cover("long_poll_answered_early")
                    backoff = min(max(backoff * 2, 0.01), 1.0)


    async def _follow(self, rh: Any, lid: int, handle: int) -> None:
        """The ledger through ``ReadHandle.tail()``, as an application follows one: each
        entry in order, none skipped, until the ledger closes."""
        self.cover("ledger_tail_api")
        agen = rh.tail(0)
        expected = 0
        seen = -2
        try:
            while not self.stopping and expected < 10_000:
                self.ops += 1
                try:
                    ent = await within(agen.__anext__(), 10.0)
                except StopAsyncIteration:
                    return
                lac = rh.last_add_confirmed
                if lac != seen:
                    self.h.lac(self.name, lid, lac, handle)
                    seen = lac
                if ent.entry_id != expected:
                    self.h.tail_gap(self.name, lid, expected, ent.entry_id)
                self.h.read(self.name, lid, ent.entry_id, ent.data, lac, recovery=False)
                expected = ent.entry_id + 1
        finally:
            await agen.aclose()


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
            rh = await within(
                self.client.open_ledger(lid, password=PASSWORD, recovery=True), bound)
        except Exception as exc:
            name = _err(exc)
            if name == "LedgerRecoveryError":
                self.cover("ledger_recovery_error")
            self.expected(exc, f"recover L{lid}")
            self.h.close_complete(self.name, lid, how, INFO, detail=f"{name} {exc}")
            return None
        last = int(rh.metadata.last_entry_id) if rh.is_closed else int(rh.last_add_confirmed)
        self.h.close_complete(self.name, lid, how, OK, last)
        nxt = 0
        while nxt <= last:
            hi = min(last, nxt + 31)
            try:
                entries = await within(rh.read(nxt, hi), bound)
            except Exception as exc:
                self.expected(exc, f"read L{lid}:{nxt}..{hi}")
                # find the first entry of the range that cannot be read: the report names it
                for entry in range(nxt, hi + 1):
                    try:
                        (ent,) = await within(rh.read(entry, entry), bound)
                    except Exception as exc1:
                        self.expected(exc1, f"read L{lid}:{entry}")
                        self.h.read_error(self.name, lid, entry, f"{_err(exc1)} {exc1}",
                                          final=final)
                        return last
                    self.h.read(self.name, lid, ent.entry_id, ent.data, last, recovery=True,
                                final=final)
                nxt = hi + 1
                continue
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
                await within(self.client.delete_ledger(lid), 10.0)
                self.h.delete(self.name, lid, OK)
            except Exception as exc:
                self.expected(exc, f"delete L{lid}")
                self.h.delete(self.name, lid, INFO + " " + _err(exc))
