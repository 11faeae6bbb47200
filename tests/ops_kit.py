"""Real bookie processes with auto-recovery: the lost-bookie scenario, for any metadata URI.

Five ``pybk bookie --autorecovery`` processes on loopback; ledgers written over TCP (closed
ones with Qw 2 and 3, and one left open by an idle writer); one bookie SIGKILLed and its
directory deleted. Then, waiting on conditions with bounds: it leaves ``pybk bookie list``
within its session timeout, ``pybk ledger under-replicated`` empties with no ledger naming it
any more, every entry of every ledger reads back, and every replica is checked directly.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pybk.cli import spawn_bookie, wait_ready
from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.testing.replicas import replication_problems
from pybk.wire import ReadRequest, Status

SESSION = 2.0  # seconds: a dead bookie's registration and candidacy lapse this fast
RECOVERY_ARGS = [
    "--autorecovery", "--session-timeout", str(SESSION), "--lost-bookie-delay", "0",
    "--worker-poll-interval", "0.5", "--open-ledger-grace", "1",
    "--ledger-check-interval", "0", "--bookie-check-interval", "5",
]  # fmt: skip


def pybk(*args: str, timeout: float = 60.0) -> str:
    """Run the ``pybk`` command; its stdout (raises with stderr on a failure)."""
    done = subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise AssertionError(f"pybk {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


async def until(cond: Callable[[], Awaitable[bool]], bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not await cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound}s: {what}")
        await asyncio.sleep(0.2)


async def lost_bookie_is_re_replicated(root: Path, metadata: str) -> None:
    ids = [f"bookie-{i}" for i in range(5)]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for b in ids:
            procs[b] = spawn_bookie(root, b, metadata, extra_args=RECOVERY_ARGS)
        for b in ids:
            await asyncio.to_thread(wait_ready, root, b, procs[b], 60.0)
        config = ClientConfig(add_timeout=5.0, read_timeout=5.0)
        async with Client(metadata, config=config) as client:
            handles = []
            for n in range(6):
                w = 3 if n % 2 else 2
                lh = await client.create_ledger(ensemble_size=3, write_quorum=w, ack_quorum=2)
                await lh.append_many([b"ledger %d entry %d" % (n, i) for i in range(40)])
                await lh.close()
                handles.append(lh)
            idle = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await idle.append_many([b"open %d" % i for i in range(15)])  # and then silence

            async def all_written() -> bool:  # no add still on its way to a third replica
                for bookie in idle.metadata.last_ensemble:  # (its failure would make the
                    for e in range(15):                     # writer change the ensemble)
                        reply = await client.transport.send(bookie, ReadRequest(idle.id, e),
                                                            5.0)
                        if reply.status != Status.OK:
                            return False
                return True

            await until(all_written, 30.0, "every replica of the open ledger to be written")
            named = {b: sum(b in e for h in [*handles, idle]
                            for e in h.metadata.ensembles.values()) for b in ids}
            victim = max(sorted(named), key=lambda b: (b in idle.metadata.last_ensemble,
                                                       named[b]))
            ledgers = [h.id for h in handles] + [idle.id]

            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait(10)
            shutil.rmtree(root / "bookies" / victim)  # gone for good

            killed = time.monotonic()

            async def left_the_list() -> bool:
                return victim not in pybk("bookie", "list", "--metadata", metadata)

            await until(left_the_list, SESSION + 10, f"{victim} to leave `pybk bookie list`")
            gone_after = time.monotonic() - killed

            async def repaired() -> bool:
                if pybk("ledger", "under-replicated", "--metadata", metadata).strip():
                    return False
                for lid in ledgers:
                    md = await client.ledger_metadata(lid)
                    if any(victim in e for e in md.ensembles.values()):
                        return False
                return True

            await until(repaired, 120.0, f"every ledger to be re-replicated off {victim}")
            # the idle writer's ledger was fenced and closed at what it had acknowledged
            md = await client.ledger_metadata(idle.id)
            assert md.is_closed and md.last_entry_id == 14, md
            for lid in ledgers:
                rh = await client.open_ledger(lid, recovery=False)
                entries = await rh.read(0, rh.last_add_confirmed)
                assert len(entries) == rh.last_add_confirmed + 1
            assert await replication_problems(client.store, client.transport) == []
            assert victim not in pybk("bookie", "list", "--metadata", metadata)
            status = pybk("autorecovery", "status", "--metadata", metadata)
            assert "under-replicated ledgers: 0" in status and "auditor: bookie-" in status
        # within its session timeout (plus the time the list command itself takes)
        assert gone_after < SESSION + 8, gone_after
        logs = "".join(p.read_text(errors="replace") for p in (root / "logs").glob("*.log"))
        assert f"moved from {victim}" in logs  # copied by the workers, not by luck
        assert "recovering (fencing) it" in logs  # the idle writer's open fragment
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# -- the lost auditor, in process ---------------------------------------------------------------

#: seconds within which a lost bookie's ledgers must be re-replicated; the periodic bookie
#: check (an hour by default) must play no part
LOST_AUDITOR_BOUND = 20.0


async def lost_auditor_trial(root: Path, metadata: str | None = None) -> float:
    """LocalCluster(5 bookies, autorecovery, default auto-recovery settings), six ledgers
    E3/Qw3/Qa2 of 200 entries; the bookie next to the elected auditor is stopped and its
    directory deleted (LocalCluster stops its auto-recovery before unregistering it, so a
    new auditor's first check may still see it). Returns the seconds until no ledger names
    it and no mark is left."""
    from pybk.cluster import LocalCluster
    from pybk.metadata.base import LedgerMetadata

    config = ClientConfig(add_timeout=5.0, read_timeout=5.0)
    async with LocalCluster(root, 5, metadata=metadata, autorecovery=True,
                            client_config=config) as cluster:
        client = cluster.client()
        ledgers = []
        for n in range(6):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await lh.append_many([b"ledger %d entry %d" % (n, i) for i in range(200)])
            await lh.close()
            ledgers.append(lh.id)

        async def one_auditor() -> bool:
            return sum(r.is_auditor for r in cluster.recoveries.values()) == 1

        await until(one_auditor, 30.0, "one elected auditor")
        auditor = next(b for b, r in cluster.recoveries.items() if r.is_auditor)
        store = cluster.store

        def names(md: LedgerMetadata) -> bool:
            return any(auditor in e for e in md.ensembles.values())

        if not any([names(await store.read_ledger(lid)) for lid in ledgers]):
            return 0.0  # the auditor's bookie holds nothing: nothing to repair
        started = time.monotonic()
        await cluster.stop_bookie(auditor)
        shutil.rmtree(cluster.bookie_dir(auditor))  # gone for good

        async def repaired() -> bool:
            if await store.list_under_replicated():
                return False
            return not any([names(await store.read_ledger(lid)) for lid in ledgers])

        await until(repaired, LOST_AUDITOR_BOUND,
                    f"the ledgers of {auditor} (the auditor's bookie) to be re-replicated")
        took = time.monotonic() - started
        assert await replication_problems(store, cluster.transport) == []
        return took


# -- the lost auditor, with real processes killed by SIGKILL --------------------------------------

#: auto-recovery next to each bookie with the default hourly bookie check: only the watch
#: can make the new auditor notice in time
LOST_AUDITOR_ARGS = [
    "--autorecovery", "--session-timeout", str(SESSION), "--lost-bookie-delay", "0",
    "--worker-poll-interval", "0.5", "--open-ledger-grace", "1",
    "--ledger-check-interval", "0", "--bookie-check-interval", "3600",
]  # fmt: skip


async def killed_auditor_trials(root: Path, metadata: str, trials: int,
                                bound: float = LOST_AUDITOR_BOUND) -> list[float]:
    """Five ``pybk bookie --autorecovery`` processes and six ledgers E3/Qw3/Qa2; ``trials``
    times: SIGKILL the process of the elected auditor's bookie, delete its directory, wait
    (bounded) until no ledger names it and no mark is left, start a fresh bookie in its
    place. Returns the seconds each repair took after the kill."""
    from pybk.metadata import open_store
    from pybk.ops import AutoRecoveryConfig

    procs: dict[str, subprocess.Popen[bytes]] = {}
    took: list[float] = []
    election = AutoRecoveryConfig().election
    store = open_store(metadata)
    try:
        for n in range(5):
            procs[f"bookie-{n}"] = spawn_bookie(root, f"bookie-{n}", metadata,
                                                extra_args=LOST_AUDITOR_ARGS)
        for b, p in procs.items():
            await asyncio.to_thread(wait_ready, root, b, p, 60.0)
        async with Client(metadata, config=ClientConfig(add_timeout=5.0,
                                                         read_timeout=5.0)) as client:
            ledgers = []
            for n in range(6):
                lh = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
                await lh.append_many([b"ledger %d entry %d" % (n, i) for i in range(200)])
                await lh.close()
                ledgers.append(lh.id)
            for trial in range(trials):
                async def elected() -> bool:
                    return await store.election_leader(election) in procs

                await until(elected, 30.0, "an auditor among the live bookies")
                victim = str(await store.election_leader(election))
                started = time.monotonic()
                os.kill(procs[victim].pid, signal.SIGKILL)
                procs.pop(victim).wait(10)
                shutil.rmtree(root / "bookies" / victim)

                async def repaired(victim: str = victim) -> bool:
                    if await store.list_under_replicated():
                        return False
                    for lid in ledgers:
                        md = await store.read_ledger(lid)
                        if any(victim in e for e in md.ensembles.values()):
                            return False
                    return True

                await until(repaired, bound, f"trial {trial}: the ledgers of {victim} "
                            "(the killed auditor's bookie) to be re-replicated")
                took.append(time.monotonic() - started)
                fresh = f"bookie-r{trial}"
                procs[fresh] = spawn_bookie(root, fresh, metadata, extra_args=LOST_AUDITOR_ARGS)
                await asyncio.to_thread(wait_ready, root, fresh, procs[fresh], 60.0)
            assert await replication_problems(store, client.transport) == []
    finally:
        for p in procs.values():
            p.kill()
            p.wait(10)
        await store.close()
    return took
