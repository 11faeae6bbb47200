"""Auto-recovery in the simulator: the auditor and replication workers run under every fault,
and the run's liveness phase ends only once re-replication has finished.

Two auto-recovery instances (``ar0``, ``ar1``: auditor candidates and workers, as
``pybk autorecovery`` runs them) start with the bookies. Each has its own metadata session
(the store's faults apply to it: stalls, CAS conflicts) and its own network endpoint (drops,
delays, duplicates, reordering). During the safety phase one of them is crashed now and then
(its session expires: the other takes the auditor's role) and later restarted. Knobs are
drawn from the seed (lost-bookie delay, grace period for open ledgers, a periodic scrub).

In the liveness phase, after the ledgers were recovered (:meth:`AutoRecoverySim.settle`)
(listed in docs/internals.md, "pybk/sim/autorecovery.py").
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pybk.client.quorum import Quorums
from pybk.errors import BKError
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.ops import AutoRecovery, AutoRecoveryConfig
from pybk.ops.admin import Admin
from pybk.ops.fragments import fragments
from pybk.runtime.eventloop import gather, within
from pybk.sim.checker import Violation
from pybk.sim.cluster import derive_rng
from pybk.sim.workload import PASSWORD
from pybk.storage.memfs import MemFileSystem
from pybk.testing.replicas import replication_problems
from pybk.transport.identity import CLUSTER
from pybk.transport.local import LocalTransport
from pybk.wire import ListEntriesRequest, ListEntriesResponse, Status

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["AutoRecoverySim"]

log = logging.getLogger(__name__)

INSTANCES = ("ar0", "ar1")


class AutoRecoverySim:
    """Auto-recovery as a part of a simulated run (see the module doc)."""

    name = "autorecovery"

    @classmethod
    def for_run(cls, run: SimRun) -> AutoRecoverySim | None:
        return cls(run) if getattr(run.workload, "autorecovery", True) else None

    def __init__(self, run: SimRun) -> None:
        self.run = run
        self.rng = derive_rng(run.seed, "autorecovery")
        rng = self.rng
        self.config = AutoRecoveryConfig(
            # a bookie that crashes comes back soon, mostly: a delay spares copying then
            lost_bookie_recovery_delay=rng.choice((0.0, 3.0, 8.0, 8.0)),
            open_ledger_grace=rng.choice((1.0, 3.0)),
            worker_poll_interval=0.5, retry_backoff=0.3, max_retry_backoff=3.0,
            bookie_check_interval=run.config.auditor_bookie_check,
            ledger_check=rng.choice(("edges", "entries", "scrub")),
            ledger_check_interval=rng.choice((0.0, 0.0, 0.0, 10.0)),
            copy_window=8, concurrent_repairs=2, passwords=(PASSWORD,))
        self.instances: dict[str, AutoRecovery] = {}
        self.violations: list[Violation] = []
        self._chaos: asyncio.Task[None] | None = None
        self._settling = False
        #: faults stopped and the R3 checks under way are being judged: no more crashes
        self.calm = False
        self.lost: str | None = None
        #: called as ``listener(session, op)`` before each operation of an instance's
        #: session (a fault aimed at an auditor's first look at the registry)
        self.listeners: list[Callable[[str, str], None]] = []
        #: the R3 checks of lost auditor hosts (pybk.sim.hostloss), judged before liveness
        self.loss_checks: list[asyncio.Task[None]] = []

    # -- sessions with the R1 probe ----------------------------------------------------------

    def _session(self, name: str) -> MemoryMetadataStore:
        """A metadata session of the run's store (its faults included) whose ledger writes
        are checked against R1 and recorded in the history when they change a ledger's
        state (a recovery: the checker then knows the ledger is being closed)."""
        store = self.run.cluster.store.session()
        faults = store.before_op
        later = store.after_op
        stashed: dict[int, LedgerMetadata | None] = {}

        async def before(op: str, key: object) -> None:
            if faults is not None:
                await faults(op, key)
            for listener in list(self.listeners):
                listener(name, op)
            if op == "write_ledger" and isinstance(key, int):
                stashed[key] = _peek(store, key)  # (synchronous: what the CAS replaces)

        async def after(op: str, key: object) -> None:
            if op == "write_ledger" and isinstance(key, int):
                old, new = stashed.pop(key, None), _peek(store, key)
                if old is not None and new is not None and old.state != new.state \
                        and key in self.run.history.created:
                    self.run.history.metadata(name, key, new.state, new.last_entry_id)
                await self._probe(key, old, new)
            if later is not None:
                await later(op, key)

        store.before_op = before
        store.after_op = after
        return store

    async def _probe(self, lid: int, old: LedgerMetadata | None,
                     new: LedgerMetadata | None) -> None:
        """R1 for one metadata write: slots swapped in closed fragments hold their entries."""
        if old is None or new is None or old.state != new.state:
            return  # a recovery's close (its write-back answers at Qa, as the writer's)
        quorums = Quorums(new.ensemble_size, new.write_quorum, new.ack_quorum)
        for fragment in fragments(new):
            before = old.ensembles.get(fragment.first)
            if fragment.is_open or before is None or len(before) != len(fragment.ensemble):
                continue
            for index, bookie in enumerate(fragment.ensemble):
                if before[index] == bookie:
                    continue
                entries = list(fragment.entries_of(index, quorums))
                self.run.log(f"autorecovery: ledger {lid} fragment {fragment.first} slot "
                             f"{index} {before[index]} -> {bookie} ({len(entries)} entries)")
                self.run.cover("autorecovery_slot_swapped")
                missing = await self._missing_on(bookie, lid, entries)
                if missing:
                    line = self.run.log(f"R1 VIOLATION ledger {lid}: {bookie} lacks "
                                        f"{missing[:8]} when swapped in")
                    self.violations.append(Violation(
                        "R1", lid, missing[0],
                        f"fragment {fragment.first} slot {index} moved from {before[index]} to "
                        f"{bookie}, which does not hold entries {missing[:8]} (of "
                        f"{len(entries)}) at that moment", (line,)))

    async def _missing_on(self, bookie: str, lid: int, entries: list[int]) -> list[int]:
        sb = self.run.cluster.bookies.get(bookie)
        if not entries or sb is None or sb.status != "up" or sb.bookie is None \
                or bookie in self.run.faulty:
            return []  # cannot be looked at now (it held them when it answered the copies)
        reply = await sb.bookie.handle(ListEntriesRequest(lid))
        if reply.status == Status.NO_SUCH_LEDGER:
            return entries
        if reply.status != Status.OK or not isinstance(reply, ListEntriesResponse):
            return []
        held = reply.ranges
        return [e for e in entries if not any(a <= e <= b for a, b in held)]

    # -- instances ---------------------------------------------------------------------------

    async def _start_instance(self, name: str) -> None:
        run = self.run
        instance = AutoRecovery(
            self._session(name), run.cluster.network.endpoint(name), name=name,
            config=self.config,
            client_config=run.client_config(), rng=derive_rng(run.seed, f"autorecovery:{name}"))
        instance.owns_store = True
        await instance.start()
        self.instances[name] = instance

    async def _crash_instance(self, name: str) -> None:
        """The instance's process dies: its session expires (the election and the locks
        move on), its tasks stop."""
        instance = self.instances.pop(name)
        store = instance.ctx.store
        assert isinstance(store, MemoryMetadataStore)
        store.expire_session()
        await instance.stop()
        await store.close()
        self.run.log(f"autorecovery: {name} crashed")
        self.run.cover("autorecovery_instance_crashed")

    async def halt_instance(self, name: str) -> MemoryMetadataStore:
        """The instance's process dies with its host: its tasks stop, but its session (the
        auditor's lock, the worker's ledger locks) lives on until the caller closes the
        returned store (the session lapsed)."""
        instance = self.instances.pop(name)
        store = instance.ctx.store
        assert isinstance(store, MemoryMetadataStore)
        await instance.stop(resign=False)
        self.run.log(f"autorecovery: {name} stopped with its host (session still held)")
        return store

    async def restart_instance(self, name: str) -> None:
        """Start a stopped instance again (not once the liveness phase began: it does)."""
        if name not in self.instances and not self._stopping():
            await self._start_instance(name)
            self.run.log(f"autorecovery: {name} restarted")

    async def before_liveness(self) -> None:
        """Wait for the R3 checks under way (each is bounded), before the liveness phase
        heals the registry and forces audits. Meanwhile no instance crashes (each crash
        makes a new auditor, for which the loss is news: its bound starts again)."""
        self.calm = True
        while self.loss_checks:
            await gather(*self.loss_checks, return_exceptions=True)
            self.loss_checks = [t for t in self.loss_checks if not t.done()]

    async def start(self) -> None:
        for name in INSTANCES:
            await self._start_instance(name)
        self._chaos = asyncio.get_running_loop().create_task(self._crashes())

    async def _crashes(self) -> None:
        """Now and then, crash an instance and bring it back a little later."""
        while not self._stopping():
            await asyncio.sleep(self.rng.uniform(4.0, 12.0))
            if self._stopping():
                return
            if self.calm or not self.instances:  # (both gone: a host lost meanwhile)
                continue
            name = self.rng.choice(sorted(self.instances))
            await self._crash_instance(name)
            await asyncio.sleep(self.rng.uniform(0.5, 4.0))
            if self._stopping():
                return
            await self._start_instance(name)
            self.run.log(f"autorecovery: {name} restarted")

    def _stopping(self) -> bool:
        return self._settling

    # -- liveness --------------------------------------------------------------------------------

    async def settle(self) -> None:
        run = self.run
        self._settling = True
        if self._chaos is not None:
            self._chaos.cancel()
            await gather(self._chaos, return_exceptions=True)
        for name in INSTANCES:
            if name not in self.instances:
                await self._start_instance(name)
        failures = [i.failure for i in self.instances.values() if i.failure is not None]
        for failure in failures:
            run.history.liveness("auto-recovery runs", False, repr(failure))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + run.liveness_bound
        store = run.cluster.admin
        from pybk.client import Client

        client = Client(self._session("ar-admin"),
                        transport=run.cluster.network.endpoint("ar-admin"),
                        config=run.client_config(), rng=derive_rng(run.seed, "ar-admin"))
        run.cluster.clients["ar-admin"] = client
        admin = Admin(client, passwords=(PASSWORD,), copy_window=8)
        # the end state is read from the bookies directly (not through the network: the
        # faults are over, and every replica of every entry is a lot of messages)
        # (as the cluster's principal: a tenancy gate lets an operator's check read all)
        checker = LocalTransport({b: sb.bookie for b, sb in run.cluster.bookies.items()
                                  if sb.status == "up" and sb.bookie is not None},
                                 principal=CLUSTER)
        # how deep the liveness audit looks: every digest only where damage was done
        self.config.ledger_check = "scrub" if run.faulty else "entries"
        if run.plan.beyond_tolerance:
            # entries may be gone for good (more faults than the quorums tolerate): there is
            # nothing to converge to, but R1 held throughout
            return
        # 1. what the safety phase left: converge, then an audit that finds nothing
        if not await self._converge(admin, deadline, "after the faults"):
            return
        # 2. a bookie lost for good, decommissioned while the workers run
        open_before = await self._open_ledgers()
        victim = self._victim(open_before.values())
        if victim is None:
            run.log("autorecovery: no bookie can be lost for good (too few left, or each holds an "
                    "open ledger with Qa=1)")
            return
        sb = run.cluster.bookies[victim]
        await run.cluster.crash_bookie(victim, "drop")
        sb.fs = MemFileSystem()
        sb.status = "refused"  # never restarted: gone for good
        sb.damaged.append("lost")
        self.lost = victim
        run.log(f"autorecovery: {victim} lost for good (disk wiped); decommissioning it")
        run.cover("autorecovery_bookie_lost")
        try:
            report = await within(
                admin.decommission_bookie(victim, poll_interval=0.5),
                max(1.0, deadline - loop.time()))
        except (BKError, TimeoutError) as exc:
            run.history.liveness(f"decommission {victim}", False,
                                 f"{type(exc).__name__}: {exc}")
            return
        run.history.liveness(f"decommission {victim}", True,
                             f"{len(report.repaired)} ledgers repaired")
        if not await self._finished(deadline):
            return
        # A ledger still open when the bookie was lost (a log's in-progress segment) and
        # closed by the workers' recovery since may lack entries below its LAC on a live
        # bookie (its writer died between the Qa-th and the Qw-th copy): recovery rewrites
        # only what lies above the LAC, and, as in BookKeeper, only a ledger check repairs
        # the rest. So converge once more when that happened, before the end state.
        closed_since = open_before.keys() - (await self._open_ledgers()).keys()
        if closed_since:
            run.cover("autorecovery_closed_while_decommissioning")
            if not await self._converge(admin, deadline, "after the decommission closed "
                                        f"ledgers {sorted(closed_since)}"):
                return
        # 3. the end state, at once
        checker.bookies = {b: sb.bookie for b, sb in run.cluster.bookies.items()
                           if sb.status == "up" and sb.bookie is not None}
        problems = await replication_problems(store, checker, passwords=(PASSWORD,),
                                              timeout=5.0)
        await checker.close()
        for problem in problems:
            lid = int(problem.split()[1]) if problem.startswith("ledger ") else -1
            line = run.log(f"R2 VIOLATION {problem}")
            self.violations.append(Violation("R2", lid, -1, problem, (line,)))
        if not problems:
            run.cover("autorecovery_fully_replicated")

    def _victim(self, open_ledgers: Iterable[LedgerMetadata]) -> str | None:
        """An up, undamaged bookie whose loss leaves enough bookies for every ensemble and
        is within every ledger's tolerance, its isolation group's too (re-replication never
        leaves a group). A ledger still open (a log's in-progress segment) with Qa=1 cannot
        lose a bookie of its last ensemble: its recovery must fence Qw-Qa+1 = Qw bookies of
        each write set, as in BookKeeper, so losing one is beyond tolerance for it."""
        run = self.run
        healthy = [b for b in run.cluster.up_bookies() if b not in run.faulty]
        if len(healthy) - 1 < run.topology[0]:  # (a damaged bookie's slots need spares too)
            return None
        pinned = {b for md in open_ledgers if md.ack_quorum < 2 and md.ensembles
                  for b in md.last_ensemble}
        groups = run.cluster.groups
        in_group = Counter(groups[b] for b in healthy if b in groups)
        candidates = [b for b in healthy if b not in pinned
                      and (b not in groups or in_group[groups[b]] - 1 >= run.topology[0])]
        return self.rng.choice(sorted(candidates)) if candidates else None

    async def _open_ledgers(self) -> dict[int, LedgerMetadata]:
        """Every ledger not closed, by id, as stored now."""
        store = self.run.cluster.admin
        found = {}
        for lid in await store.list_ledgers():
            md = _peek(store, lid)
            if md is not None and not md.is_closed:
                found[lid] = md
        return found

    async def _converge(self, admin: Admin, deadline: float, when: str) -> bool:
        """Trigger an audit, wait until an auditor served it (both checks ran after the
        request: a check already under way when it was made does not count) and
        re-replication is done."""
        loop = asyncio.get_running_loop()
        request = await admin.trigger_audit()
        while self._audit_served() < request:
            if loop.time() >= deadline:
                self.run.history.liveness(f"re-replication {when}", False,
                                          "the triggered audit did not complete")
                return False
            await asyncio.sleep(0.2)
        if not await self._finished(deadline):
            return False
        self.run.history.liveness(f"re-replication {when}", True,
                                  f"{self._marked()} marks in all")
        return True

    def _audit_served(self) -> int:
        return max((i.stats.audit_request_served for i in self.instances.values()), default=0)

    def _marked(self) -> int:
        return sum(i.stats.ledgers_marked for i in self.instances.values())

    async def _finished(self, deadline: float) -> bool:
        """Wait until no mark is left and no closed ledger names a bookie that is not live."""
        loop = asyncio.get_running_loop()
        store = self.run.cluster.admin
        while True:
            left = await self._unfinished(store)
            if not left:
                return True
            if loop.time() >= deadline:
                self.run.history.liveness("re-replication", False, "; ".join(left[:5]))
                return False
            await asyncio.sleep(0.5)

    async def _unfinished(self, store: MemoryMetadataStore) -> list[str]:
        left = [f"ledger {lid} marked {m}"
                for lid, m in sorted((await store.list_under_replicated()).items())]
        live = {r.bookie_id for r in await store.list_bookies()}
        for lid in await store.list_ledgers():
            md = _peek(store, lid)
            if md is None or not md.is_closed:
                continue
            for fragment in fragments(md):
                dead = [b for b in fragment.ensemble if b not in live]
                if dead and not fragment.is_empty:
                    left.append(f"ledger {lid} fragment {fragment.first} names {dead}")
        return left

    def check(self) -> list[Violation]:
        return list(self.violations)

    async def close(self) -> None:
        self._settling = True
        if self._chaos is not None:
            self._chaos.cancel()
        for task in self.loss_checks:
            task.cancel()
        for name in list(self.instances):
            instance = self.instances.pop(name)
            await instance.stop()
            await instance.ctx.store.close()


def _peek(store: MemoryMetadataStore, lid: int) -> LedgerMetadata | None:
    """A ledger's metadata as stored now, read without yielding to the loop."""
    try:
        return store.peek_ledger(lid)
    except KeyError:
        return None

