"""Table servers that die (fault ``crash_table_server``), aimed where a table server's
state is ahead of its log.

A table server answers reads from what it has applied and appends each write to its range's
log; a server that dies loses what it had not appended yet (the next owner recovers the log,
which is the range). The moment that matters is a read answered beside a write of the same
key whose append is still in flight: whatever the read saw must be in the log, or survive
nowhere. So three crashes in four are **aimed**: armed, the server dies at the first such
moment (coverage ``table_server_crash_aimed``), or, if none comes within a drawn wait, at the
first answer it gives while an append of its own is in flight (``table_server_crash_in_flight``);
failing both, when faults stop it is left alone. The others kill it at once. A new server
takes the dead one's place a little later (``run.respawn``).

The events are the table workload's own: drawn by :func:`table_events` from the seed's
``table-faults`` stream in the seeds that draw table servers (``WORKLOAD_KINDS``), so the
other seeds keep their schedules.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pybk.sim.cluster import derive_rng
from pybk.sim.scenario import FaultEvent

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun
    from pybk.sim.tables import TableClientProc

__all__ = ["KIND", "crash_table_server", "table_events"]

KIND = "crash_table_server"
#: mean virtual seconds between two table server crashes in the safety phase
_MEAN_INTERVAL = 6.0


def table_events(seed: int, duration: float) -> list[FaultEvent]:
    """The table servers' crashes of a seed that draws table servers (its own stream)."""
    rng = derive_rng(seed, "table-faults")
    out: list[FaultEvent] = []
    t = rng.uniform(1.0, 4.0)
    while t < duration:
        out.append(FaultEvent(round(t, 6), KIND, rng.getrandbits(32)))
        t += rng.expovariate(1.0 / _MEAN_INTERVAL)
    return out


def merge(events: list[FaultEvent], more: list[FaultEvent]) -> list[FaultEvent]:
    """Both schedules in time order (stable: at one instant the swarm's event first)."""
    return sorted([*events, *more], key=lambda e: e.at)


async def crash_table_server(run: SimRun, ev: FaultEvent) -> None:
    """Kill a table server now, or arm its aimed crash (see the module docstring)."""
    from pybk.sim.tables import TableClientProc

    servers = {p.name: p for p in run.processes
               if isinstance(p, TableClientProc) and not p.stopping}
    if not servers:
        return
    name = ev.pick("server", sorted(servers))
    proc = servers.get(name)
    if proc is None:
        return
    aimed = ev.draw("aimed", lambda r: r.random() < 0.75)
    wait = ev.draw("wait", lambda r: round(r.uniform(2.0, 10.0), 6))
    after = ev.draw("respawn_after", lambda r: round(r.uniform(0.2, 2.0), 6))
    run.fault(name, KIND, f"{'aimed, within ' + str(wait) + 's' if aimed else 'now'}; "
                          f"a new server {after}s later")
    loop = asyncio.get_running_loop()
    done = False

    def crash(why: str) -> None:
        nonlocal done
        if done or proc.stopping:
            return
        done = True
        run.log(f"{name} crashes ({why}; {proc.in_flight()} appends in flight)")
        run.cover(f"table_server_crash_{why}")
        proc.stop()  # (dead now: its messages in flight go nowhere, it sends no more)
        run.cluster.network.kill_client(name)
        proc.dying = loop.create_task(_kill(run, proc, after))

    if not aimed:
        crash("now")
        return

    def moment(what: str) -> None:
        """Called by the server after each answer: ``read_beside_write`` or ``answer``."""
        if what == "read_beside_write":
            crash("aimed")
        elif what == "answer" and loop.time() >= deadline and proc.in_flight():
            crash("in_flight")

    deadline = loop.time() + wait
    proc.moments.append(moment)

    def disarm() -> None:  # (faults stop)
        if moment in proc.moments:
            proc.moments.remove(moment)

    run.on_liveness.append(disarm)


async def _kill(run: SimRun, proc: TableClientProc, after: float) -> None:
    await run.kill_process(proc)
    run.later(after, run.respawn, proc)
