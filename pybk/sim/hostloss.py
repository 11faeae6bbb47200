"""The loss of the host the elected auditor runs on (fault ``lose_auditor_host``), and R3.

The host's bookie and the elected auditor stop together; their metadata sessions lapse
later, a little apart, in either order, and the bookie's registration may lapse just after
the new auditor's first look at the registry, where only its registry watch can tell it
(the watch the old backends missed: mutation ``watch_baseline_at_first_poll``), or its
second look once its watches are established (``sync_watches``).

**R3**: within :data:`BOUND` virtual seconds of the loss plus the lost-bookie delay, the lost
bookie's ledgers are marked under-replicated (or no longer name it). Metadata stalls, clock
jumps and a new auditor extend the bound. The story (the aim, the orders, why a check is
judged before the liveness phase) is in docs/internals.md, "pybk/sim/hostloss.py".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pybk.ops.auditor import bookie_index
from pybk.sim.checker import Violation
from pybk.sim.scenario import FaultEvent

if TYPE_CHECKING:
    from pybk.sim.autorecovery import AutoRecoverySim
    from pybk.sim.runner import SimRun

__all__ = ["BOUND", "ORDERS", "lose_auditor_host", "watch_loss"]

#: which session lapses first: the auditor's (its lock goes, a new auditor is elected while
#: the bookie is still registered) or the bookie's
ORDERS = ("auditor_first", "bookie_first")
#: virtual seconds auto-recovery has, after a loss and the lost-bookie delay, to mark it
BOUND = 5.0
#: how often the check looks (virtual seconds)
_TICK = 0.25


async def lose_auditor_host(run: SimRun, ev: FaultEvent) -> None:
    """Stop the elected auditor and one bookie together; their sessions lapse later."""
    ar = _autorecovery(run)
    if ar is None:
        return
    auditors = [n for n, i in sorted(ar.instances.items()) if i.is_auditor]
    c = run.cluster
    up = c.up_bookies()
    healthy = [b for b in up if b not in run.faulty]
    # (a long outage: the others must still fill an ensemble, within the atlas' down limit)
    # (and another auto-recovery instance must run, to take over)
    if not auditors or len(ar.instances) < 2 or not healthy or len(up) - 1 < run.topology[0] \
            or len(c.bookie_ids) - len(up) >= run.down_limit():
        return
    b = ev.pick("bookie", healthy)
    if c.bookies[b].status != "up" or b in run.faulty:
        return
    # (production's order, the auditor's session first, in two losses of three)
    order = ev.draw("order", lambda r: r.choices(ORDERS, (2, 1))[0])
    aimed = ev.draw("aimed", lambda r: r.random() < 0.75) and order == "auditor_first"
    timeout = ev.draw("session_timeout", lambda r: round(r.uniform(0.5, 3.0), 6))
    # (aimed: milliseconds after the new auditor's look, as in production)
    gap = ev.draw("gap", lambda r: round(r.uniform(0.0, 0.05) if aimed else r.choice(
        (r.uniform(0.0, 0.1), r.uniform(0.0, 0.6), r.uniform(0.6, 3.0))), 6))
    name = auditors[0]
    run.fault(b, "lose_auditor_host",
              f"auditor {name}, {order}{' aimed' if aimed else ''}, sessions lapse after "
              f"{timeout}s, {gap}s apart")
    run.cover(f"auditor_host_lost_{order}")
    c.kill_bookie(b, "drop")
    store = await ar.halt_instance(name)
    gone: set[str] = set()
    lapses: list[asyncio.Task[None]] = []
    both = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def back() -> None:  # (once judged: the host is repaired, its processes return)
        await run.restart(b)
        await ar.restart_instance(name)

    watch_loss(ar, b, both, back)

    async def lapse(what: str) -> None:
        if what in gone:
            return
        gone.add(what)
        if what == "bookie":
            run.log(f"{b}: registration lapsed (host of {name} lost)")
            await c.lapse_registration(b)
        else:
            run.log(f"autorecovery: {name}'s session lapsed (host {b} lost)")
            await store.close()
        if len(gone) == 2:
            both.set()

    def first_look(session: str, op: str) -> None:
        """The new auditor's first look at the registry: the registration lapses after it."""
        instance = ar.instances.get(session)
        if op != "list_bookies" or session == name or instance is None \
                or not instance.is_auditor or "auditor" not in gone:
            return
        ar.listeners.remove(first_look)
        run.cover("auditor_host_lapse_aimed")
        loop.call_later(gap, lambda: lapses.append(loop.create_task(lapse("bookie"))))

    first, second = ("auditor", "bookie") if order == "auditor_first" else ("bookie", "auditor")
    run.later(timeout, lapse, first)
    if aimed:
        ar.listeners.append(first_look)
        run.later(timeout + gap + 5.0, lapse, second)  # (no new auditor looked: anyway)
    else:
        run.later(timeout + gap, lapse, second)

    def disarm() -> None:  # (faults stop: both sessions are gone by now)
        if first_look in ar.listeners:
            ar.listeners.remove(first_look)
        for what in ("auditor", "bookie"):
            if what not in gone:
                lapses.append(loop.create_task(lapse(what)))

    run.on_liveness.append(disarm)


def watch_loss(ar: AutoRecoverySim, bookie: str, lost: asyncio.Event,
               then: Callable[[], Awaitable[None]]) -> None:
    """Check R3 for ``bookie``, lost once ``lost`` is set (its registration and the
    auditor's session gone); then await ``then()``."""
    async def judge() -> None:
        await lost.wait()
        await _judge(ar, bookie)
        await then()

    ar.loss_checks.append(asyncio.get_running_loop().create_task(judge()))


async def _judge(ar: AutoRecoverySim, bookie: str) -> None:
    run = ar.run
    loop = asyncio.get_running_loop()
    since = loop.time()
    delay = ar.config.lost_bookie_recovery_delay
    deadline = since + delay + BOUND
    auditor = _auditor(ar)
    while True:
        how = await _acted_on(ar, bookie, delay, deadline)
        if how:
            run.log(f"R3: {bookie}'s loss {how} {loop.time() - since:.2f}s after it")
            run.cover("auditor_host_loss_noticed")
            return
        if loop.time() >= deadline:
            line = run.log(f"R3 VIOLATION {bookie} lost at {since:.3f}: not marked by "
                           f"{loop.time():.3f}")
            ar.violations.append(Violation(
                "R3", -1, -1,
                f"bookie {bookie} was lost at {since:.3f} (registration and the auditor's "
                f"session gone) and auto-recovery had not marked its ledgers "
                f"{loop.time() - since:.2f}s later (bound {BOUND}s after the "
                f"{delay}s lost-bookie delay)", (line,)))
            return
        before = loop.time()
        await asyncio.sleep(_TICK)
        # (a clock jump is not time anyone had, and neither is a metadata stall)
        deadline += max(0.0, loop.time() - before - _TICK)
        if run.cluster.meta_stall_until > loop.time():
            deadline += _TICK
        now = _auditor(ar)
        if now is not auditor:
            # a new auditor (one elected, or none left): the loss is news to it, and its
            # delay starts when it sees it, as in BookKeeper
            auditor = now
            deadline = max(deadline, loop.time() + delay + BOUND)


async def _acted_on(ar: AutoRecoverySim, bookie: str, delay: float, deadline: float) -> str:
    """How auto-recovery has dealt with the loss so far ("" if not)."""
    store = ar.run.cluster.admin
    if bookie in {r.bookie_id for r in await store.list_bookies()}:
        return "ended (registered again)"
    if any(bookie in marked for marked in (await store.list_under_replicated()).values()):
        return "marked"
    seen = [i.auditor.lost_since[bookie] for i in ar.instances.values()
            if bookie in i.auditor.lost_since]
    if seen and ar.calm and min(seen) + delay <= deadline:
        # (faults stopped: noticed in time, its marks due after the delay; not waited for)
        return "noticed in time (judged as faults stop)"
    mds = []
    for lid in await store.list_ledgers():
        try:
            mds.append(store.peek_ledger(lid))
        except KeyError:
            continue
    named = bookie in bookie_index(mds)
    return "" if named else "left no ledger naming it (re-replicated, or none)"


def _auditor(ar: AutoRecoverySim) -> object:
    """The elected auditor's instance (None if none is)."""
    return next((i for _n, i in sorted(ar.instances.items()) if i.is_auditor), None)


def _autorecovery(run: SimRun) -> AutoRecoverySim | None:
    from pybk.sim.autorecovery import AutoRecoverySim

    return next((e for e in run.extensions if isinstance(e, AutoRecoverySim)), None)
