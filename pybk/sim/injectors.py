"""The fault handlers: one small coroutine per scheduled fault kind, in a table.

``HANDLERS[kind](run, event)`` injects one :class:`~pybk.sim.scenario.FaultEvent` into a
running :class:`~pybk.sim.runner.SimRun`. A handler resolves its targets through
``event.pick`` / ``event.draw`` (recorded in the event, so a replayed or shrunk schedule does
the same thing), checks they still make sense (a recorded bookie may be down by now in a
shrunk schedule) and schedules its own healing with ``run.later``.

Some faults are aimed where bugs hide (FoundationDB's BUGGIFY): crashes timed inside a
journal batch's write-to-sync window, bit flips on batch and record headers, recovery reads
that time out, a slow writer link together with a lost fence and a recovery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pybk.sim.cluster import DATA_DIR
from pybk.sim.disktargets import damage_targets
from pybk.sim.hostloss import lose_auditor_host
from pybk.sim.scenario import FaultEvent
from pybk.sim.tablefaults import KIND as TABLE_CRASH
from pybk.sim.tablefaults import crash_table_server
from pybk.sim.workload import Reader
from pybk.storage.records import BATCH_HEADER_SIZE

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["CRASH_MODES", "HANDLERS", "FaultHandler"]

CRASH_MODES = ("drop", "torn", "reorder")

FaultHandler = Callable[["SimRun", FaultEvent], Awaitable[None]]
HANDLERS: dict[str, FaultHandler] = {}


def handles(*kinds: str) -> Callable[[FaultHandler], FaultHandler]:
    def register(fn: FaultHandler) -> FaultHandler:
        for kind in kinds:
            HANDLERS[kind] = fn
        return fn
    return register


def _hold(ev: FaultEvent) -> float:
    return ev.draw("hold", lambda r: round(r.expovariate(1 / 2.0) + 0.2, 6))


# -- network ---------------------------------------------------------------------------------


@handles("partition", "asym_partition")
async def partition(run: SimRun, ev: FaultEvent) -> None:
    clients = run.clients()
    if not clients:
        return
    cl = ev.pick("client", clients)
    b = ev.pick("bookie", run.cluster.bookie_ids)
    links = [(cl, b), (b, cl)]
    if ev.kind == "asym_partition":
        links = [links[0] if ev.pick("direction", ("out", "in")) == "out" else links[1]]
    run.block(ev.kind, links, _hold(ev))


@handles("isolate")
async def isolate(run: SimRun, ev: FaultEvent) -> None:
    b = ev.pick("bookie", run.cluster.bookie_ids)
    clients = run.clients()
    run.block(ev.kind, [(x, b) for x in clients] + [(b, x) for x in clients], _hold(ev))


@handles("swizzle")
async def swizzle(run: SimRun, ev: FaultEvent) -> None:
    """Clog a random subset of bookies one by one, heal them in random order (FDB)."""
    bookies = run.cluster.bookie_ids
    subset = ev.draw("bookies", lambda r: r.sample(bookies, r.randint(1, len(bookies))))
    gaps = ev.draw("gaps", lambda r: [round(r.uniform(0.05, 0.4), 6) for _ in subset])
    order = ev.draw("heal_order", lambda r: r.sample(subset, len(subset)))
    heal_gaps = ev.draw("heal_gaps", lambda r: [round(r.uniform(0.05, 0.4), 6)
                                                for _ in subset])
    hold = _hold(ev)
    run.fault(",".join(subset), ev.kind)
    net = run.cluster.network
    for b, gap in zip(subset, gaps, strict=True):
        for cl in run.clients():
            net.block(cl, b)
            net.block(b, cl)
        await asyncio.sleep(gap)
    delay = hold
    for b, gap in zip(order, heal_gaps, strict=True):
        run.later(delay, run.unclog, b)
        delay += gap


@handles("slow_link")
async def slow_link(run: SimRun, ev: FaultEvent) -> None:
    """A slow path from a writer to one bookie of its ledger; half the time that bookie
    also loses the next fencing request and a recovery starts at once: the interleaving of
    BookKeeper issue 2614 (a late add meets an unfenced bookie)."""
    writers = {p.name: p for p in run.ledger_writers() if p.current is not None}
    if not writers:
        return
    name = ev.pick("writer", sorted(writers))
    wp = writers.get(name)
    if wp is None or wp.current is None:
        return
    lh = wp.current
    b = ev.pick("bookie", list(lh.metadata.last_ensemble))
    net = run.cluster.network
    run.fault(f"{name}->{b}", ev.kind)
    net.slow[(name, b)] = ev.draw("delay", lambda r: round(r.uniform(0.2, 1.5), 6))

    async def unslow(link: tuple[str, str] = (name, b)) -> None:
        net.slow.pop(link, None)
    run.later(_hold(ev) * 2, unslow)
    recoverers = run.recoverers()
    fence_lost: bool = ev.draw("fence_lost", lambda r: r.random() < 0.5)
    if recoverers and fence_lost:
        net.lose_next_fence[b] = net.lose_next_fence.get(b, 0) + 1
        run.fault(b, "lose_fence")
        rc = recoverers[0]
        run.later(ev.draw("recover_after", lambda r: round(r.uniform(0.0, 0.3), 6)),
                  rc.recover, lh.id)


@handles("lose_fence")
async def lose_fence(run: SimRun, ev: FaultEvent) -> None:
    b = ev.pick("bookie", run.cluster.bookie_ids)
    run.fault(b, ev.kind)
    net = run.cluster.network
    net.lose_next_fence[b] = net.lose_next_fence.get(b, 0) + 1


@handles("recovery_timeout")
async def recovery_timeout(run: SimRun, ev: FaultEvent) -> None:
    """Recovery reads to some bookies of a ledger being written are lost (they time out)
    for a while, and a recovery of that ledger starts: a timeout is "don't know", never
    "absent". The ledger is a ledger writer's, or a log's segment (recovered by a new log
    writer taking the log over). Half the time the readers' entry reads are lost too for as
    long (their LAC reads and long polls still answer): a tailing reader learns of new entries
    and cannot read them, where it must raise or retry, never skip."""
    targets = run.recovery_targets()
    if not targets:
        return
    which = ev.pick("target", sorted(targets))
    ensemble = targets.get(which)
    if ensemble is None:
        return
    qw = run.topology[1]
    lost = ev.draw("bookies", lambda r: r.sample(ensemble, r.randint(1, min(qw, len(ensemble)))))
    hold = ev.draw("hold", lambda r: round(r.uniform(2.5, 6.0), 6))
    net = run.cluster.network
    until = asyncio.get_running_loop().time() + hold
    for b in lost:
        net.lose_recovery_reads[b] = until
    run.fault(",".join(lost), ev.kind, which)
    if ev.draw("readers_too", lambda r: r.random() < 0.5):
        readers = sorted(p.name for p in run.processes if not p.stopping
                         and (isinstance(p, Reader) or getattr(p, "prefix", "") == "lr"))
        for name in readers:
            net.lose_entry_reads[name] = until
        if readers:
            run.fault(",".join(readers), "reader_stall")
    await run.trigger_recovery(which)


# -- bookie processes ------------------------------------------------------------------------


@handles("crash")
async def crash(run: SimRun, ev: FaultEvent) -> None:
    """Kill -9 plus power cut, restart later. Half the crashes (four in five on an overlapped
    journal) are timed inside a journal batch's write-to-sync window: the batch is written,
    its sync not yet returned (an answer sent before the sync is then an answer for lost
    data)."""
    c = run.cluster
    up = c.up_bookies()
    if not up or len(c.bookie_ids) - len(up) >= run.down_limit():
        return
    b = ev.pick("bookie", up)
    if c.bookies[b].status != "up":
        return
    mode = ev.pick("mode", CRASH_MODES)
    restart_after = ev.draw("restart_after", lambda r: round(r.expovariate(1 / 2.0) + 0.1, 6))
    live = c.bookies[b].bookie
    # (an overlapped journal's window is the rarer one: aim there more often)
    aim = 0.8 if live is not None and live.store is not None \
        and live.store.journal.overlap_syncs else 0.5
    if not ev.draw("timed", lambda r: r.random() < aim):
        _cover_flush(run, live)
        run.fault(b, "crash", mode)
        await c.crash_bookie(b, mode)
        run.later(restart_after, run.restart, b)
        return
    where = ev.draw("window", lambda r: round(r.uniform(0.1, 0.9), 6))
    sb = c.bookies[b]
    fs = sb.fs
    incarnation = sb.incarnation
    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {"armed": True}
    # An overlapped journal's rare moment: a batch written while the one before it is
    # answered (or a buffer split in two). Wait for one of those, not any write.
    store = sb.bookie.store if sb.bookie is not None else None
    journal = store.journal if store is not None else None
    overlapped = journal is not None and journal.overlap_syncs
    # the db engine: half its timed crashes aim at a background flush of its write cache
    at_flush = where >= 0.5 and hasattr(store, "flushing_now")

    def overlaps() -> int:
        return journal.stats["overlapped"] + journal.stats["splits"] if journal else 0

    before = overlaps()

    def fire(how: str) -> None:
        if not state["armed"]:
            return
        state["armed"] = False
        fs.fault_hook = None
        fallback.cancel()
        if sb.status != "up" or sb.incarnation != incarnation:
            return
        run.fault(b, "crash", f"{mode} {how}")
        run.cover(f"crash_{how}")
        _cover_flush(run, sb.bookie)
        c.crash_now(b, mode)
        run.later(restart_after, run.restart, b)

    def hook(op: str, path: str) -> None:
        if at_flush:
            if op == "write" and "/entrylogs/" in path:  # (the flush's window: its offload)
                fs.fault_hook = None
                loop.call_later(fs.sync_delay * (where - 0.5) * 2, fire, "in_flush_window")
            return
        if op == "write" and "/journal/" in path and not path.endswith(".prep"):
            if overlapped:
                loop.call_soon(check)  # (the journal counts an overlap after its write)
                return
            fs.fault_hook = None
            loop.call_later(fs.sync_delay * where, fire, "in_sync_window")

    def check() -> None:
        if state["armed"] and fs.fault_hook is hook and overlaps() > before:
            fs.fault_hook = None
            loop.call_later(fs.sync_delay * where, fire, "in_overlapped_sync_window")

    def disarm() -> None:  # (faults stop: a crash not fired yet never fires)
        state["armed"] = False
        fallback.cancel()
        if fs.fault_hook is hook:
            fs.fault_hook = None

    # (no such write came: crash anyway)
    fallback = loop.call_later(5.0 if overlapped else 2.0, fire, "untimed")
    fs.fault_hook = hook
    run.on_liveness.append(disarm)


def _cover_flush(run: SimRun, bookie: Any) -> None:
    """Count a crash that comes while the db engine flushes its write cache."""
    store = bookie.store if bookie is not None else None
    if getattr(store, "flushing_now", False):
        run.cover("crash_during_db_flush")


@handles("wipe")
async def wipe(run: SimRun, ev: FaultEvent) -> None:
    c = run.cluster
    cands = [b for b in c.bookie_ids if run.atlas_allows_damage(b) and b not in run.faulty]
    down = len(c.bookie_ids) - len(c.up_bookies())
    if not cands or down >= run.down_limit():
        return
    b = ev.pick("bookie", cands)
    if b not in cands:
        return
    run.faulty.append(b)
    run.fault(b, "wipe")
    if c.bookies[b].status == "up":
        await c.crash_bookie(b, "drop")
    started = await c.restart_bookie(b, wipe=True)
    if not started:
        run.cover("wiped_bookie_refused")


# -- disks -----------------------------------------------------------------------------------


async def _quiet_disk(run: SimRun, b: str) -> bool:
    """Wait (briefly) until bookie ``b`` has nothing unsynced: damage goes to synced data."""
    fs = run.cluster.bookies[b].fs
    for _ in range(10):
        if fs.unsynced_bytes() == 0:
            break
        await asyncio.sleep(0.01)
    return fs.unsynced_bytes() == 0 and run.cluster.bookies[b].status == "up"


async def _damage_bookie(run: SimRun, ev: FaultEvent,
                         damage: Callable[[Any, list[tuple[str, int, int, int]]], str | None],
                         ) -> None:
    """Damage committed data of a live bookie (its reads meet it at once; a scrubber's
    pass follows) or of a crashed one (its replay meets it), within the fault atlas."""
    c = run.cluster
    up = c.up_bookies()
    cands = [b for b in up if run.atlas_allows_damage(b)]
    if not cands:
        return
    b = ev.pick("bookie", cands)
    if b not in cands:
        return
    down = len(c.bookie_ids) - len(up)
    live = ev.draw("live", lambda r: r.random() < 0.7) or down >= run.down_limit()
    if live:
        if not await _quiet_disk(run, b):
            return
    else:
        await c.crash_bookie(b, "drop")
    sb = c.bookies[b]
    detail = damage(sb.fs, damage_targets(sb.fs))
    if detail is not None:
        sb.damaged.append(ev.kind)
        run.fault(b, ev.kind, detail)
        if b not in run.faulty:
            run.faulty.append(b)
    if live:
        await run.audit(sb, "scrub")
    else:
        run.later(ev.draw("restart_after", lambda r: round(r.uniform(0.1, 1.0), 6)),
                  run.restart, b)


@handles("bitflip", "latent")
async def bitflip(run: SimRun, ev: FaultEvent) -> None:
    """A flipped bit or a latent read error in committed journal data; half of them aimed at
    a batch's or a record's header (where replay decides torn tail or corruption)."""

    def damage(fs: Any, batches: list[tuple[str, int, int, int]]) -> str | None:
        if not batches:
            return None
        aim = ev.pick("aim", ("anywhere", "batch_header", "record_header"))
        path, off, size, _end = batches[ev.draw("batch", lambda r: r.randrange(len(batches)))
                                         % len(batches)]
        if aim == "batch_header":
            offset = off + ev.draw("at", lambda r: r.randrange(BATCH_HEADER_SIZE))
        elif aim == "record_header":
            offset = off + BATCH_HEADER_SIZE + ev.draw("at", lambda r: r.randrange(9))
        else:
            offset = off + ev.draw("at", lambda r: r.randrange(size))
        offset = min(offset, off + size - 1)
        if ev.kind == "bitflip":
            fs.flip_bit(path, offset, ev.draw("bit", lambda r: r.randrange(8)))
        else:
            fs.fail_reads(path, offset, 64)
        return f"{path}@{offset} ({aim})"

    await _damage_bookie(run, ev, damage)


@handles("misdirect")
async def misdirect(run: SimRun, ev: FaultEvent) -> None:
    """Misdirected I/O (TigerBeetle's storage fault model): a synced batch's write that
    landed elsewhere in its file (its own place reads as never written; older data where it
    landed is overwritten), or reads of a batch served from another offset."""

    def damage(fs: Any, batches: list[tuple[str, int, int, int]]) -> str | None:
        if not batches:
            return None
        path, off, size, _end = batches[ev.draw("batch", lambda r: r.randrange(len(batches)))
                                         % len(batches)]
        shift = ev.draw("shift", lambda r: r.choice((-4096, -1024, -512, 512, 1024, 4096)))
        how = ev.pick("how", ("write", "read"))
        landed = max(0, off + shift)
        if how == "write":
            fs.misdirect_write(path, off, size, landed)
            return f"{path}: batch at {off} ({size} B) landed at {landed}"
        fs.misdirect_reads(path, off, size, landed - off or 512)
        return f"{path}: reads of {off}..{off + size} come from {landed}"

    await _damage_bookie(run, ev, damage)


@handles("fsync_eio")
async def fsync_eio(run: SimRun, ev: FaultEvent) -> None:
    up = run.cluster.up_bookies()
    if not up:
        return
    b = ev.pick("bookie", up)
    run.fault(b, "fsync_eio")
    run.cluster.bookies[b].fs.fail_next_fsync()
    run.later(ev.draw("bounce_after", lambda r: round(r.uniform(1.0, 4.0), 6)), run.bounce, b)


@handles("enospc")
async def enospc(run: SimRun, ev: FaultEvent) -> None:
    up = run.cluster.up_bookies()
    if not up:
        return
    b = ev.pick("bookie", up)
    fs = run.cluster.bookies[b].fs
    free, total = fs.disk_usage(DATA_DIR)
    run.fault(b, "enospc")
    fs.set_capacity(total - free + ev.draw("room", lambda r: r.randint(0, 4096)))
    run.later(_hold(ev) + 1.0, run.restore_capacity, b)


@handles("slow_fsync")
async def slow_fsync(run: SimRun, ev: FaultEvent) -> None:
    b = ev.pick("bookie", run.cluster.bookie_ids)
    run.fault(b, "slow_fsync")
    run.cluster.bookies[b].fs.sync_delay = ev.pick("delay", (0.05, 0.3, 1.0))
    run.later(_hold(ev), run.restore_sync, b)


# -- clients and writers ---------------------------------------------------------------------


@handles("pause_writer")
async def pause_writer(run: SimRun, ev: FaultEvent) -> None:
    writers = {p.name: p for p in run.writers()}
    if not writers:
        return
    name = ev.pick("writer", sorted(writers))
    if name not in writers:
        return
    run.fault(name, "pause")
    run.cluster.network.pause(name)
    run.later(ev.draw("resume_after", lambda r: round(r.uniform(2.5, 8.0), 6)), run.resume, name)


@handles("crash_writer")
async def crash_writer(run: SimRun, ev: FaultEvent) -> None:
    """A writer process dies (its connections and metadata session with it); a new one of
    the same kind takes over a little later."""
    writers = {p.name: p for p in run.writers()}
    if not writers:
        return
    name = ev.pick("writer", sorted(writers))
    w = writers.get(name)
    if w is None:
        return
    run.fault(name, "crash_writer")
    await run.kill_process(w)
    run.later(ev.draw("respawn_after", lambda r: round(r.uniform(0.2, 2.0), 6)),
              run.respawn, w)


# -- metadata and time -----------------------------------------------------------------------


@handles("meta_stall")
async def meta_stall(run: SimRun, ev: FaultEvent) -> None:
    run.fault("meta", "meta_stall")
    run.cluster.meta_stall_until = (asyncio.get_running_loop().time()
                                    + ev.draw("for", lambda r: round(r.uniform(0.5, 4.0), 6)))


@handles("meta_expire")
async def meta_expire(run: SimRun, ev: FaultEvent) -> None:
    """The bookies' registry session ends (missed heartbeats): they drop out of the list of
    live bookies until they register again."""
    run.fault("meta", ev.kind, ",".join(run.cluster.admin.expire_session()))
    run.later(_hold(ev), run.reregister)


@handles("meta_cas")
async def meta_cas(run: SimRun, ev: FaultEvent) -> None:
    run.fault("meta", "meta_cas")
    run.cluster.meta_cas_rate = 0.3
    run.later(_hold(ev), run.restore_cas)


@handles("clock_jump")
async def clock_jump(run: SimRun, ev: FaultEvent) -> None:
    """Time jumps: the monotonic clock ahead (every process frozen at once, every timer due
    meanwhile runs late, together), and the wall clock the logs date segments with, either
    way (NTP steps it)."""
    ahead = ev.draw("monotonic", lambda r: round(r.choice((0.0, r.uniform(0.05, 1.0),
                                                           r.uniform(1.0, 6.0))), 6))
    wall = ev.draw("wall", lambda r: round(r.choice((-1, 1)) * r.uniform(1.0, 86400.0), 3))
    run.fault("clock", ev.kind, f"monotonic +{ahead}s wall {wall:+}s")
    run.wall_offset += wall
    if ahead:
        loop = asyncio.get_running_loop()
        jump = getattr(loop, "jump", None)
        if jump is not None:
            jump(ahead)


HANDLERS["lose_auditor_host"] = lose_auditor_host  # (pybk.sim.hostloss)
HANDLERS[TABLE_CRASH] = crash_table_server  # (pybk.sim.tablefaults)
