"""``sim.run(seed, ...)``: one simulated run, from seed to checked result.

A run is a pure function of its arguments: a :class:`~pybk.sim.loop.SimLoop` (virtual time),
a :class:`~pybk.sim.cluster.SimCluster` (real bookies on simulated disks, a memory metadata
store, the simulated network) and per-subsystem ``random.Random`` objects derived from the
seed. It has two phases (TigerBeetle's VOPR):

1. **safety**: the workload runs while the fault injector draws faults from the seed's
   :class:`~pybk.sim.faults.FaultPlan`, limited by the fault atlas;
2. **liveness**: faults stop, the network heals, bookies restart (at most Qa-1 stay down),
   every ledger is recovered and read back, and a new ledger must take writes, all within a
   bound of virtual time.

Then the :mod:`~pybk.sim.checker` judges the recorded history. The trace (one line per event,
stamped with virtual time) is identical for identical arguments, byte for byte.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pybk.bookie.inspect import inspect_data_dir
from pybk.protocol import (
    AddRequest,
    DigestManager,
    ListEntriesRequest,
    ReadRequest,
    Request,
    Response,
    Status,
)
from pybk.replication.context import ClientConfig
from pybk.sim.autorecovery import AutoRecoverySim
from pybk.sim.checker import Checker, Violation
from pybk.sim.cluster import DATA_DIR, SimBookie, SimCluster, derive_rng
from pybk.sim.faults import FaultPlan, Faults
from pybk.sim.history import History
from pybk.sim.loop import SimDeadlock, SimLoop, SimTimeLimit
from pybk.sim.net import NetConfig
from pybk.sim.workload import PASSWORD, Deleter, Reader, Recoverer, Registry, Workload, Writer
from pybk.testing.mutations import NO_MUTATIONS, Mutations

TOPOLOGIES: tuple[tuple[int, int, int], ...] = ((3, 3, 2), (3, 2, 2), (5, 3, 2), (2, 2, 1),
                                                (4, 3, 3))
CRASH_MODES = ("drop", "torn", "reorder")


@dataclass
class Stats:
    virtual_seconds: float = 0.0
    wall_seconds: float = 0.0
    operations: int = 0
    messages: int = 0
    loop_steps: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    coverage: dict[str, int] = field(default_factory=dict)


@dataclass
class SimResult:
    seed: int
    ok: bool
    violations: list[Violation]
    trace: list[str]
    trace_hash: str
    stats: Stats
    topology: tuple[int, int, int]
    bookies: int
    plan: FaultPlan
    faults_spec: str
    duration: float
    mutations: tuple[str, ...] = ()
    error: str | None = None
    #: the bookie count was given by the caller rather than drawn from the seed
    bookies_given: bool = False

    def command(self) -> str:
        """The shell command that replays this run. ``--bookies`` appears only when the run
        was given one: a count drawn from the seed is drawn again (passing it explicitly
        changes what the seed draws, so the run would differ)."""
        extra = f" --bookies {self.bookies}" if self.bookies_given else ""
        if self.mutations:
            extra += f" --mutation {','.join(self.mutations)}"
        return (f"pybk simulate --seed {self.seed} --faults {self.faults_spec} "
                f"--duration {self.duration:g}{extra} --verbose")

    def report(self) -> str:
        head = (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} topology "
                f"E,Qw,Qa={self.topology} bookies={self.bookies} {self.plan.describe()}")
        lines = [head]
        if self.error:
            lines.append(f"  run error: {self.error}")
        for v in self.violations:
            lines.append(v.render(self.trace))
        if not self.ok:
            lines.append(f"  reproduce: {self.command()}")
        return "\n".join(lines)


class _Run:
    """State of one run (kept out of ``run`` so the pieces stay readable)."""

    def __init__(self, seed: int, bookies: int | None, duration: float, faults: Faults,
                 workload: Workload | None, topology: tuple[int, int, int] | None,
                 liveness_bound: float, mutations: Mutations = NO_MUTATIONS) -> None:
        self.seed = seed
        #: broken behaviours handed to every bookie and client of the run (checker tests)
        self.mutations = mutations
        self.rng = derive_rng(seed, "runner")
        self.topology = topology or self.rng.choice(
            [t for t in TOPOLOGIES if bookies is None or t[0] <= bookies])
        e = self.topology[0]
        self.n = bookies if bookies is not None else e + self.rng.choice((0, 1, 1, 2))
        self.duration = duration
        self.faults = faults
        self.plan = faults.swarm(derive_rng(seed, "swarm"))
        self.workload = workload or Workload()
        self.liveness_bound = liveness_bound
        # half the runs give their bookies overlapped journals (a batch completed while the
        # next one syncs; buffers of 4+ records split in two), as `pybk bookie` runs them; a
        # stream of its own, so the other draws of a seed stay what they were
        self.overlapped_journals = derive_rng(seed, "journal").random() < 0.5
        # and, independently, half preallocate small journal segments (made ahead as zeros,
        # written in place, rotated every 8 KiB): crashes then tear in-place writes and
        # half-made segment files too
        self.preallocated_segments = derive_rng(seed, "segments").random() < 0.5
        # and half checkpoint their index every 2 virtual seconds, mostly as deltas (chains of
        # up to 8), so crashes and damage meet delta chains and their writes
        self.frequent_checkpoints = derive_rng(seed, "checkpoints").random() < 0.5
        self.trace: list[str] = []
        self.fault_counts: Counter[str] = Counter()
        self.coverage: Counter[str] = Counter()
        self.loop: SimLoop | None = None
        self.history = History(log=self.log, now=self.now)
        self.registry = Registry()
        self.faulty: list[str] = []  # fault atlas: bookies whose data was damaged
        self.processes: list[Any] = []
        self.tasks: list[asyncio.Task[Any]] = []
        self.heal_tasks: list[asyncio.Task[Any]] = []
        self.writer_count = 0
        net = NetConfig(drop=self.plan.drop, duplicate=self.plan.duplicate,
                        reorder=self.plan.reorder, corrupt=self.plan.corrupt,
                        reset=self.plan.reset)
        self.cluster = SimCluster(seed, self.n, net=net, log=self.log, count=self.count_fault,
                                  client_config=self._client_config(),
                                  bookie_config=self._bookie_config())
        self.cluster.on_bookie_started.append(self._audit_restart)
        self.cluster.network.observers.append(self._observe)
        #: parts of the run with processes, a liveness condition and invariants of their own
        #: (start with the bookies, settle in the liveness phase, checked with the history)
        self.extensions: list[Any] = [
            ext for ext in (AutoRecoverySim.for_run(self),) if ext is not None]

    # -- trace -------------------------------------------------------------------------------

    def now(self) -> float:
        return self.loop.time() if self.loop is not None else 0.0

    def log(self, text: str) -> int:
        self.trace.append(f"{self.now():11.6f} {text}")
        return len(self.trace) - 1

    def count_fault(self, kind: str) -> None:
        if kind.startswith("bookie_state_") or kind == "bookie_refused_start":
            self.coverage[kind] += 1
        else:
            self.fault_counts[kind] += 1

    def cover(self, marker: str) -> None:
        self.coverage[marker] += 1

    def _bookie_config(self) -> Any:
        knobs: dict[str, Any] = {"mutations": self.mutations}
        if self.overlapped_journals:
            knobs.update(journal_overlap_syncs=True, journal_overlap_split_min=2)
        if self.preallocated_segments:
            knobs.update(journal_preallocate=True, segment_size=8 << 10)
        if self.frequent_checkpoints:
            knobs.update(checkpoint_interval=2.0, checkpoint_delta_ratio=4.0,
                         checkpoint_max_deltas=8)
        from pybk.bookie import BookieConfig

        return BookieConfig(**knobs)

    def _client_config(self) -> ClientConfig:
        return ClientConfig(add_timeout=2.0, read_timeout=2.0, speculative_read_delay=0.5,
                            long_poll_timeout=1.0, explicit_lac_interval=0.5,
                            mutations=self.mutations)

    # -- observing bookies from the outside ------------------------------------------------------

    def _observe(self, bookie: str, client: str, req: Request, resp: Response) -> None:
        if isinstance(req, AddRequest):
            if resp.status == Status.OK:
                self.history.bookie_acked(bookie, req.ledger_id, req.entry_id)
                if req.recovery:
                    self.cover("recovery_write_back")
            elif resp.status == Status.FENCED:
                self.cover("add_rejected_by_fenced_bookie")
            return
        if not isinstance(req, ReadRequest) or req.previous_lac is not None:
            return
        if req.fence:
            self.cover("fencing_read")
        self._observe_read(bookie, req.ledger_id, req.entry_id, resp, "read")

    def _observe_read(self, bookie: str, lid: int, entry: int, resp: Response, how: str) -> None:
        status = resp.status
        if status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER) and entry >= 0:
            self.history.bookie_absent(bookie, lid, entry, f"{how} {status.name}")
        elif status in (Status.IO_ERROR, Status.CORRUPT, Status.UNKNOWN_LEDGER_STATE):
            self.cover(f"bookie_read_{status.name.lower()}")
        elif status == Status.OK:
            body = getattr(resp, "body", None)
            if body is None:
                return
            try:
                dec = DigestManager(lid, "CRC32C", PASSWORD).verify(
                    body, entry if entry >= 0 else None)
            except Exception:
                self.history.bookie_served(bookie, lid, entry, None, how)
                return
            self.history.bookie_served(bookie, lid, dec.entry_id, dec.payload, how)

    async def _audit_restart(self, sb: SimBookie) -> None:
        """After a restart, before the bookie is reachable: does it hold what it acked?"""
        if sb.incarnation > 1:
            self.cover("bookie_restarted")
            if sb.fs.counters.get("truncate", 0) > getattr(sb, "_truncates", 0):
                self.cover("journal_tail_truncated")
            sb._truncates = sb.fs.counters.get("truncate", 0)  # type: ignore[attr-defined]
        await self._audit(sb, "restart")

    async def _audit(self, sb: SimBookie, how: str) -> None:
        bookie = sb.bookie
        if bookie is None:
            return
        acked: dict[int, list[int]] = {}
        for ev in self.history.of_kind("bookie_ack"):
            if ev.process == sb.bookie_id and ev.ledger not in self.registry.deleted:
                acked.setdefault(ev.ledger, []).append(ev.entry)
        for lid in sorted(acked):
            entries = sorted(set(acked[lid]))
            resp = await bookie.handle(ListEntriesRequest(lid))
            if resp.status == Status.OK:
                held = getattr(resp, "ranges", ())
                for e in entries:
                    if not any(a <= e <= b for a, b in held):
                        self.history.bookie_absent(sb.bookie_id, lid, e, f"{how} audit list")
                if how != "final" and not sb.damaged:
                    continue
            # Read back (a sample on healthy bookies; all on damaged ones).
            sample = entries if sb.damaged else entries[-3:]
            for e in sample:
                r = await bookie.handle(ReadRequest(lid, e))
                self._observe_read(sb.bookie_id, lid, e, r, f"{how} audit")

    # -- faults ------------------------------------------------------------------------------

    def _atlas_allows_damage(self, bid: str) -> bool:
        if bid in self.faulty:
            return True
        # Recoverable regime: at most Qa-1 damaged bookies (every acknowledged entry keeps a
        # good copy) and never more than the spares (a damaged bookie may refuse to start for
        # good, and recovery needs a full ensemble of live bookies to write back).
        if self.plan.beyond_tolerance:
            budget = self.topology[1]
        else:
            budget = min(self.topology[2] - 1, self.n - self.topology[0])
        return len(self.faulty) < budget

    def _down_limit(self) -> int:
        return max(1, self.n - self.topology[0]) if not self.plan.beyond_tolerance else self.n

    def _later(self, delay: float, coro_fn: Any, *args: Any) -> None:
        async def go() -> None:
            await asyncio.sleep(delay)
            await coro_fn(*args)
        self.heal_tasks.append(asyncio.get_running_loop().create_task(go()))

    async def inject(self, until: float) -> None:
        rng = derive_rng(self.seed, "faults")
        events = self.plan.events
        if not events:
            return
        weights = [self.plan.weights[k] for k in events]
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / self.plan.mean_interval))
            if loop.time() >= until:
                return
            kind = rng.choices(events, weights)[0]
            await self.apply(kind, rng)

    def _clients(self) -> list[str]:
        return [p.name for p in self.processes if not p.stopping]

    async def apply(self, kind: str, rng: Any) -> None:
        net = self.cluster.network
        c = self.cluster
        bookies = c.bookie_ids
        up = c.up_bookies()
        hold = rng.expovariate(1 / 2.0) + 0.2
        if kind in ("partition", "asym_partition") and self._clients():
            cl, b = rng.choice(self._clients()), rng.choice(bookies)
            links = [(cl, b), (b, cl)]
            if kind == "asym_partition":
                links = [rng.choice(links)]
            self._block(kind, links, hold)
        elif kind == "isolate":
            b = rng.choice(bookies)
            links = [(x, b) for x in self._clients()] + [(b, x) for x in self._clients()]
            self._block(kind, links, hold)
        elif kind == "swizzle":
            subset = rng.sample(bookies, rng.randint(1, len(bookies)))
            self.fault_counts[kind] += 1
            self.history.fault(",".join(subset), kind)
            for b in subset:
                for cl in self._clients():
                    net.block(cl, b)
                    net.block(b, cl)
                await asyncio.sleep(rng.uniform(0.05, 0.4))
            order = list(subset)
            rng.shuffle(order)
            for i, b in enumerate(order):
                self._later(hold + i * rng.uniform(0.05, 0.4), self._unclog, b)
        elif kind == "slow_link":
            # A slow path from a writer to one bookie of its ledger; half the time that
            # bookie also loses the next fencing request and a recovery starts right away:
            # the interleaving of BookKeeper issue 2614 (a late add meets an unfenced bookie).
            writers = [p for p in self.processes if isinstance(p, Writer)
                       and not p.stopping and p.current is not None]
            if writers:
                wp = rng.choice(writers)
                lh = wp.current
                b = rng.choice(list(lh.metadata.last_ensemble))
                w = wp.name
                self._fault(f"{w}->{b}", kind)
                net.slow[(w, b)] = rng.uniform(0.2, 1.5)

                async def unslow(link: tuple[str, str] = (w, b)) -> None:
                    net.slow.pop(link, None)
                self._later(hold * 2, unslow)
                recoverers = [p for p in self.processes if isinstance(p, Recoverer)
                              and not p.stopping]
                if recoverers and rng.random() < 0.5:
                    net.lose_next_fence[b] = net.lose_next_fence.get(b, 0) + 1
                    self._fault(b, "lose_fence")
                    rc = rng.choice(recoverers)
                    self._later(rng.uniform(0.0, 0.3), rc.recover, lh.id)
        elif kind == "lose_fence":
            b = rng.choice(bookies)
            self._fault(b, kind)
            net.lose_next_fence[b] = net.lose_next_fence.get(b, 0) + 1
        elif kind == "crash" and up:
            down = len(bookies) - len(up)
            if down >= self._down_limit():
                return
            b = rng.choice(up)
            mode = rng.choice(CRASH_MODES)
            self._fault(b, "crash", mode)
            await c.crash_bookie(b, mode)
            self._later(rng.expovariate(1 / 2.0) + 0.1, self._restart, b)
        elif kind == "wipe":
            cands = [b for b in bookies if self._atlas_allows_damage(b) and b not in self.faulty]
            down = len(bookies) - len(up)
            if not cands or down >= self._down_limit():
                return
            b = rng.choice(cands)
            self.faulty.append(b)
            self._fault(b, "wipe")
            if c.bookies[b].status == "up":
                await c.crash_bookie(b, "drop")
            started = await c.restart_bookie(b, wipe=True)
            if not started:
                self.cover("wiped_bookie_refused")
        elif kind in ("bitflip", "latent"):
            # Damage committed data of a live bookie (its reads hit it at once) or of a
            # crashed one (its replay meets it). Only data followed by later synced records.
            cands = [b for b in up if self._atlas_allows_damage(b)]
            down = len(bookies) - len(up)
            if not cands:
                return
            b = rng.choice(cands)
            live = rng.random() < 0.7 or down >= self._down_limit()
            if live:
                fs = c.bookies[b].fs
                for _ in range(10):
                    if fs.unsynced_bytes() == 0:
                        break
                    await asyncio.sleep(0.01)
                if fs.unsynced_bytes() != 0 or c.bookies[b].status != "up":
                    return
            else:
                await c.crash_bookie(b, "drop")
            if self._damage(b, kind, rng) and b not in self.faulty:
                self.faulty.append(b)
            if live:  # a scrubber's pass: read back everything it acknowledged
                await self._audit(c.bookies[b], "scrub")
            else:
                self._later(rng.uniform(0.1, 1.0), self._restart, b)
        elif kind == "fsync_eio" and up:
            b = rng.choice(up)
            self._fault(b, "fsync_eio")
            c.bookies[b].fs.fail_next_fsync()
            self._later(rng.uniform(1.0, 4.0), self._bounce, b)
        elif kind == "enospc" and up:
            b = rng.choice(up)
            fs = c.bookies[b].fs
            free, total = fs.disk_usage(DATA_DIR)
            self._fault(b, "enospc")
            fs.set_capacity(total - free + rng.randint(0, 4096))
            self._later(hold + 1.0, self._restore_capacity, b)
        elif kind == "slow_fsync":
            b = rng.choice(bookies)
            self._fault(b, "slow_fsync")
            c.bookies[b].fs.sync_delay = rng.choice((0.05, 0.3, 1.0))
            self._later(hold, self._restore_sync, b)
        elif kind == "pause_writer":
            writers = [p for p in self.processes if isinstance(p, Writer) and not p.stopping]
            if writers:
                w = rng.choice(writers)
                self._fault(w.name, "pause")
                net.pause(w.name)
                self._later(rng.uniform(2.5, 8.0), self._resume, w.name)
        elif kind == "crash_writer":
            writers = [p for p in self.processes if isinstance(p, Writer) and not p.stopping]
            if writers:
                w = rng.choice(writers)
                self._fault(w.name, "crash_writer")
                w.stop()
                net.kill_client(w.name)
                await w.client.store.close()  # its metadata session dies with it
                for p, t in zip(self.processes, self.tasks, strict=True):
                    if p is w:
                        t.cancel()
                self._later(rng.uniform(0.2, 2.0), self._spawn_writer)
        elif kind == "meta_stall":
            self._fault("meta", "meta_stall")
            c.meta_stall_until = asyncio.get_running_loop().time() + rng.uniform(0.5, 4.0)
        elif kind == "meta_expire":
            # The registry session of the bookies ends (missed heartbeats): they drop out of
            # the list of live bookies until they register again.
            self._fault("meta", kind, ",".join(c.admin.expire_session()))
            self._later(hold, self._reregister)
        elif kind == "meta_cas":
            self._fault("meta", "meta_cas")
            c.meta_cas_rate = 0.3
            self._later(hold, self._restore_cas)

    def _fault(self, target: str, kind: str, detail: str = "") -> None:
        self.fault_counts[kind] += 1
        self.history.fault(target, kind, detail)

    def _block(self, kind: str, links: list[tuple[str, str]], hold: float) -> None:
        self._fault(";".join(f"{a}->{b}" for a, b in links), kind)
        for a, b in links:
            self.cluster.network.block(a, b)

        async def heal() -> None:
            for a, b in links:
                self.cluster.network.unblock(a, b)
        self._later(hold, heal)

    async def _unclog(self, b: str) -> None:
        net = self.cluster.network
        for a, d in net.blocked_links():
            if b in (a, d):
                net.unblock(a, d)

    def _damage(self, bid: str, kind: str, rng: Any) -> bool:
        fs = self.cluster.bookies[bid].fs
        files = []
        stack = [DATA_DIR]
        while stack:
            d = stack.pop()
            if not fs.exists(d):
                continue
            for name in fs.listdir(d):
                path = d.rstrip("/") + "/" + name
                try:
                    fs.file_size(path)
                except (IsADirectoryError, FileNotFoundError, OSError):
                    stack.append(path)
                    continue
                try:
                    # where the data ends: a preallocated segment's zero tail is not data,
                    # and damage followed only by zeros would pass for a torn tail
                    size = len(fs.read_file(path).rstrip(b"\0"))
                except OSError:
                    continue  # (already damaged: a latent read error)
                if size > 2048:
                    files.append((path, size))
        if not files:
            return False
        journal = [f for f in files if "journal" in f[0]]
        path, size = rng.choice(sorted(journal or files))
        offset = rng.randrange(0, size - 1024)  # at least 1 KiB of later synced data
        if kind == "bitflip":
            fs.flip_bit(path, offset, rng.randrange(8))
        else:
            fs.fail_reads(path, offset, 64)
        self.cluster.bookies[bid].damaged.append(kind)
        self._fault(bid, kind, f"{path}@{offset}")
        return True

    async def _restart(self, b: str) -> None:
        """Start a crashed bookie; one retry when a transient fault (a pending fsync EIO)
        made it refuse, as an operator would. Damaged bookies may refuse for good."""
        sb = self.cluster.bookies[b]
        for _attempt in range(2):
            if sb.status == "refused" and b not in self.faulty:
                sb.status = "down"
            if sb.status != "down":
                return
            if await self.cluster.start_bookie(b):
                return
            if sb.damaged:
                self.cover("damaged_bookie_refused_start")
                return

    async def _bounce(self, b: str) -> None:
        """Restart a bookie whose journal may have failed (the operator's move)."""
        sb = self.cluster.bookies[b]
        if sb.status == "up":
            await self.cluster.crash_bookie(b, "drop")
            await self._restart(b)

    async def _restore_capacity(self, b: str) -> None:
        self.cluster.bookies[b].fs.set_capacity(1 << 40)

    async def _restore_sync(self, b: str) -> None:
        self.cluster.bookies[b].fs.sync_delay = self.base_sync_delay

    async def _reregister(self) -> None:
        from pybk.metadata.base import BookieRegistration

        for bid in self.cluster.up_bookies():
            bookie = self.cluster.bookies[bid].bookie
            read_only = bookie is not None and bookie.state != "writable"
            await self.cluster.admin.register_bookie(BookieRegistration(bid, "", read_only))

    async def _restore_cas(self) -> None:
        self.cluster.meta_cas_rate = 0.0

    async def _resume(self, name: str) -> None:
        self.cluster.network.resume(name)

    # -- processes -----------------------------------------------------------------------------

    def _start(self, cls: Any, name: str) -> Any:
        client = self.cluster.client(name)
        proc = cls(name, client, self.history, self.registry, derive_rng(self.seed, name),
                   self.cover, self.topology, self.workload)
        self.processes.append(proc)
        self.tasks.append(asyncio.get_running_loop().create_task(self._guard(proc)))
        return proc

    async def _guard(self, proc: Any) -> None:
        try:
            await proc.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log(f"{proc.name} died: {type(exc).__name__}: {exc}")
            self.cover(f"process_died_{type(exc).__name__}")

    async def _spawn_writer(self) -> None:
        self.writer_count += 1
        self._start(Writer, f"w{self.writer_count}")

    # -- phases ----------------------------------------------------------------------------------

    async def main(self) -> None:
        loop = asyncio.get_running_loop()
        c = self.cluster
        self.base_sync_delay = self.rng.choice((0.0005, 0.002, 0.01))
        for sb in c.bookies.values():
            sb.fs.sync_delay = self.base_sync_delay
        self.log(f"seed {self.seed} topology E,Qw,Qa={self.topology} bookies={self.n} "
                 f"sync_delay={self.base_sync_delay} "
                 f"journal={'overlapped' if self.overlapped_journals else 'serial'}"
                 f"{'+preallocated' if self.preallocated_segments else ''}"
                 f"{' checkpoints=2s' if self.frequent_checkpoints else ''} "
                 f"plan: {self.plan.describe()}")
        await c.start()
        for _ in range(self.workload.writers):
            await self._spawn_writer()
        for i in range(self.workload.readers):
            self._start(Reader, f"r{i + 1}")
        for i in range(self.workload.recoverers):
            self._start(Recoverer, f"rc{i + 1}")
        if self.workload.deletes:
            self._start(Deleter, "d1")
        for ext in self.extensions:
            await ext.start()
        safety_end = loop.time() + self.duration
        await self.inject(safety_end)
        await asyncio.sleep(max(0.0, safety_end - loop.time()))
        self.log("=== liveness phase: faults stop, network heals")
        await self.liveness()

    async def liveness(self) -> None:
        loop = asyncio.get_running_loop()
        c = self.cluster
        for t in self.heal_tasks:
            t.cancel()
        net = c.network
        net.config = net.config.quiet()
        net.heal()
        c.meta_stall_until = 0.0
        c.meta_cas_rate = 0.0
        await self._reregister()
        for sb in c.bookies.values():
            sb.fs.set_capacity(1 << 40)
            sb.fs.sync_delay = self.base_sync_delay
            # Injected fsync failures that never met an fsync must not outlive the safety
            # phase (MemFileSystem has no public way to withdraw them yet).
            pending_eio = getattr(sb.fs, "_fsync_failures", None)
            if isinstance(pending_eio, list):
                pending_eio.clear()
        for p in self.processes:
            p.stop()
        for sb in c.bookies.values():  # coverage: did overlapped journals overlap and split?
            store = sb.bookie.store if sb.status == "up" and sb.bookie is not None else None
            if store is not None:
                for stat, marker in (("overlapped", "batches_overlapped"),
                                     ("splits", "batches_splits"),
                                     ("preallocated", "segments_preallocated"),
                                     ("rotations", "segments_rotations")):
                    if store.journal.stats[stat]:
                        self.coverage[f"journal_{marker}"] += store.journal.stats[stat]
                for kind in ("bases", "deltas"):  # index checkpoints, and chains loaded
                    if store.checkpoint_stats[kind]:
                        self.coverage[f"checkpoint_{kind}"] += store.checkpoint_stats[kind]
                if store.report.checkpoint_deltas:
                    self.coverage["checkpoint_deltas_loaded"] += store.report.checkpoint_deltas
        # Bookies: restart the ones that can; bounce the up ones (journal may have failed).
        for bid, sb in c.bookies.items():
            if sb.status == "up" and sb.bookie is not None and sb.bookie.state != "writable":
                await c.crash_bookie(bid, "drop")
            if sb.status in ("down", "refused"):
                await self._restart(bid)
        for bid, sb in c.bookies.items():
            if sb.status != "up" and bid not in self.faulty:
                self.history.liveness(f"restart {bid}", False,
                                      f"undamaged bookie will not start: {sb.last_error}")
        down = [b for b, sb in c.bookies.items() if sb.status != "up"]
        tolerance = self.topology[2] - 1
        spare = [b for b in c.up_bookies() if b not in self.faulty]
        # Keep one more bookie down when the atlas allows it and spares remain to replace it
        # (recovery writes back; with no replacement it cannot finish, as in BookKeeper).
        if not self.plan.beyond_tolerance and len(set(down) | set(self.faulty)) < tolerance \
                and spare and self.n - len(down) - 1 >= self.topology[0] \
                and self.rng.random() < 0.3:
            b = self.rng.choice(spare)
            await c.crash_bookie(b, "drop")
            down.append(b)
        self.log(f"liveness: bookies down {sorted(down)} faulty {sorted(self.faulty)}")
        # Let the workload wind down, then stop it for good.
        _done, pending = await asyncio.wait(self.tasks, timeout=10.0) if self.tasks else ((), ())
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        start = loop.time()
        final = Recoverer("final", c.client("final"), self.history, self.registry,
                          derive_rng(self.seed, "final"), self.cover, self.topology,
                          self.workload)
        for lid in list(self.registry.ledgers):
            if lid in self.registry.deleted:
                continue
            remaining = self.liveness_bound - (loop.time() - start)
            last = await final.recover(lid, how="final", final=True,
                                       bound=max(1.0, remaining))
            if last is None:
                self.history.liveness(f"recover L{lid}", False, "recovery did not complete")
        # New writes must go through.
        w = Writer("final-w", final.client, self.history, self.registry,
                   derive_rng(self.seed, "final-w"), self.cover, self.topology, self.workload)
        ok = True
        try:
            # As wide as the live bookies allow (a wiped bookie stays out for good).
            e = min(self.topology[0], len(c.up_bookies()))
            qw = min(self.topology[1], e)
            qa = min(self.topology[2], qw)
            lh = await asyncio.wait_for(final.client.create_ledger(
                ensemble_size=e, write_quorum=qw, ack_quorum=qa, digest_type="CRC32C",
                password=PASSWORD), self.liveness_bound)
            self.registry.ledgers.append(lh.id)
            self.history.create("final-w", lh.id)
            futs = []
            for i in range(5):
                payload = f"final-w:{lh.id}:{i}".encode()
                fut = lh.append(payload)
                self.history.add_invoke("final-w", lh.id, lh.last_add_pushed, payload)
                fut.add_done_callback(lambda f, e=lh.last_add_pushed, lid=lh.id:
                                      w._done(lid, e, f))
                futs.append(fut)
            await asyncio.wait_for(asyncio.gather(*futs), self.liveness_bound)
            await w._close(lh, lh.id)
            await final.recover(lh.id, how="final", final=True, bound=self.liveness_bound)
        except Exception as exc:
            ok = False
            self.history.liveness("new ledger accepts writes", False,
                                  f"{type(exc).__name__}: {exc}")
        if ok:
            self.history.liveness("new ledger accepts writes", True,
                                  f"{loop.time() - start:.3f}s after heal")
        for ext in self.extensions:
            await ext.settle()
        for sb in c.bookies.values():
            if sb.status == "up":
                await self._audit(sb, "final")
            if sb.status == "up" and not sb.damaged:
                self._inspect(sb)

    def _inspect(self, sb: SimBookie) -> None:
        """I14: the bookie's checkpoint chain and journal agree with its segments."""
        report = inspect_data_dir(sb.fs, DATA_DIR)
        self.cover("data_dir_inspected")
        store = sb.bookie.store if sb.bookie is not None else None
        for st in store.index.ledgers.values() if store is not None else ():
            if st.entries.holes:  # (striped ensembles leave ids out of a bookie's dense run)
                self.cover("index_ledgers_with_holes")
            if st.entries.sparse:  # (ids far off the run: recovery adds, re-replication)
                self.cover("index_ledgers_with_sparse_ids")
        if report.checkpoint.state == "ok" and report.checkpoint.deltas:
            self.cover("data_dir_inspected_with_deltas")
        if report.checkpoint.detail.startswith(("disagrees", "replay after", "its entries live")):
            self.history.index_mismatch(sb.bookie_id, report.checkpoint.detail)


def run(
    seed: int,
    bookies: int | None = None,
    duration: float = 30.0,
    faults: Faults | None = None,
    workload: Workload | None = None,
    *,
    topology: tuple[int, int, int] | None = None,
    mutations: tuple[str, ...] | list[str] = (),
    liveness_bound: float = 60.0,
    max_steps: int = 400_000,
) -> SimResult:
    """Run one seed and check it. See the module docstring; API.md has the contract."""
    faults = faults if faults is not None else Faults.all()
    switches = Mutations.of(mutations)
    r = _Run(seed, bookies, duration, faults, workload, topology, liveness_bound, switches)
    loop = SimLoop(max_time=duration + 10 * liveness_bound + 600.0, max_steps=max_steps)
    r.loop = loop
    wall = time.perf_counter()
    error: str | None = None
    try:
        loop.run_main(r.main())
    except (SimDeadlock, SimTimeLimit) as exc:
        error = f"{type(exc).__name__}: {exc}"
        r.log(f"RUN ERROR {error}")
    finally:
        for ext in r.extensions:
            ending = ext.close()
            try:
                loop.run_until_complete(ending)
            except Exception:
                ending.close()
        closing = r.cluster.close()
        try:
            loop.run_until_complete(closing)
        except Exception:
            closing.close()
        loop.shutdown()
    checker = Checker(r.history, beyond_tolerance=r.plan.beyond_tolerance)
    violations = checker.run()
    for ext in r.extensions:
        violations.extend(ext.check())
    if error is not None and not r.plan.beyond_tolerance:
        violations.append(Violation("I12", -1, -1, f"the run did not finish: {error}",
                                    (len(r.trace) - 1,)))
    trace_hash = hashlib.sha256("\n".join(r.trace).encode()).hexdigest()
    ops = sum(p.ops for p in r.processes)
    stats = Stats(virtual_seconds=loop.time(), wall_seconds=time.perf_counter() - wall,
                  operations=ops, messages=r.cluster.network.messages, loop_steps=loop.steps,
                  faults=dict(sorted(r.fault_counts.items())),
                  coverage=dict(sorted(r.coverage.items())))
    return SimResult(seed=seed, ok=not violations, violations=violations, trace=r.trace,
                     trace_hash=trace_hash, stats=stats, topology=r.topology, bookies=r.n,
                     plan=r.plan, faults_spec=faults.spec(), duration=duration,
                     mutations=tuple(mutations), error=error,
                     bookies_given=bookies is not None)


__all__ = ["TOPOLOGIES", "SimResult", "Stats", "run"]
