"""The second phase of a simulated run (:class:`pybk.sim.runner.SimRun`), once the safety phase
is over: faults stop and disarm, the network heals, bookies restart (at most Qa-1 stay down),
the workload winds down, every ledger is recovered and read back, a new ledger must take
writes, each extension settles, and the bookies left up are audited and inspected (I14).
Apart from the runner, which holds the run's state and its first phase; this is one job.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from pybk.bookie.inspect import inspect_data_dir
from pybk.runtime.eventloop import gather, within
from pybk.sim.cluster import DATA_DIR, SimBookie, derive_rng
from pybk.sim.workload import PASSWORD, Recoverer, Writer
from pybk.storage.dbstore import DbLedgerStore
from pybk.storage.store import LedgerStore

if TYPE_CHECKING:
    from pybk.sim.runner import SimRun

__all__ = ["liveness_phase"]


async def liveness_phase(run: SimRun) -> None:
    """Heal everything, then record in ``run.history`` whether the cluster made progress
    within ``run.liveness_bound`` of virtual time (each failure a liveness finding)."""
    loop = asyncio.get_running_loop()
    c = run.cluster
    for t in run.heal_tasks:
        t.cancel()
    for disarm in run.on_liveness:
        disarm()
    net = c.network
    net.config = net.config.quiet()
    net.heal()
    c.meta_stall_until = 0.0
    c.meta_cas_rate = 0.0
    await run.reregister()
    for sb in c.bookies.values():
        sb.fs.set_capacity(1 << 40)
        sb.fs.sync_delay = run.config.sync_delay
        sb.fs.fault_hook = None  # (a timed crash still armed)
        # Injected fsync failures that never met an fsync must not outlive the safety
        # phase (MemFileSystem has no public way to withdraw them yet).
        pending_eio = getattr(sb.fs, "_fsync_failures", None)
        if isinstance(pending_eio, list):
            pending_eio.clear()
    for p in run.processes:
        p.stop()
        if not getattr(p, "winds_down", True):  # (a reader has nothing to finish)
            task = run.tasks.get(p.name)
            if task is not None:
                task.cancel()
    _count_store_coverage(run)
    # Bookies: restart the ones that can; bounce the up ones (journal may have failed).
    for bid, sb in c.bookies.items():
        if sb.status == "up" and sb.bookie is not None and sb.bookie.state != "writable":
            await c.crash_bookie(bid, "drop")
        if sb.status in ("down", "refused"):
            await run.restart(bid)
    for bid, sb in c.bookies.items():
        if sb.status != "up" and bid not in run.faulty:
            run.history.liveness(f"restart {bid}", False,
                                  f"undamaged bookie will not start: {sb.last_error}")
    down = [b for b, sb in c.bookies.items() if sb.status != "up"]
    tolerance = run.topology[2] - 1
    spare = [b for b in c.up_bookies() if b not in run.faulty]
    # Keep one more bookie down when the atlas allows it and spares remain to replace it
    # (recovery writes back; with no replacement it cannot finish, as in BookKeeper). A
    # damaged bookie is no spare: auto-recovery moves its damaged slots to a healthy
    # bookie outside the ensemble, so the healthy ones left must still fill an ensemble.
    if not run.plan.beyond_tolerance and len(set(down) | set(run.faulty)) < tolerance \
            and spare and run.n - len(set(down) | set(run.faulty)) - 1 >= run.topology[0] \
            and run.rng.random() < 0.3:
        b = run.rng.choice(spare)
        await c.crash_bookie(b, "drop")
        down.append(b)
    run.log(f"liveness: bookies down {sorted(down)} faulty {sorted(run.faulty)}")
    # Let the workload wind down, then stop it for good.
    tasks = list(run.tasks.values())
    _done, pending = await asyncio.wait(tasks, timeout=10.0) if tasks else ((), ())
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=5.0)
    start = loop.time()
    await _ledgers_live(run, start)
    for ext in run.extensions:
        await ext.settle()
    for sb in c.bookies.values():
        if sb.status == "up":
            await run.audit(sb, "final")
        if sb.status == "up" and not sb.damaged:
            _inspect(run, sb)

def _count_store_coverage(run: SimRun) -> None:
    """Did the configuration's paths run? (overlapped batches, splits, inline syncs,
    preallocated segments, rotations, checkpoints, delta chains loaded)."""
    for sb in run.cluster.bookies.values():
        store = sb.bookie.store if sb.status == "up" and sb.bookie is not None else None
        if store is None:
            continue
        for stat, marker in (("overlapped", "batches_overlapped"),
                             ("splits", "batches_splits"),
                             ("inline_syncs", "inline_syncs"),
                             ("preallocated", "segments_preallocated"),
                             ("rotations", "segments_rotations"),
                             ("lazy", "records_held_lazily")):
            if store.journal.stats[stat]:
                run.coverage[f"journal_{marker}"] += store.journal.stats[stat]
        for kind in ("bases", "deltas"):  # index checkpoints, and chains loaded
            if store.checkpoint_stats[kind]:
                run.coverage[f"checkpoint_{kind}"] += store.checkpoint_stats[kind]
        if store.report.checkpoint_deltas:
            run.coverage["checkpoint_deltas_loaded"] += store.report.checkpoint_deltas
        held = getattr(store, "adds_held", 0)  # (the db engine: both write caches full)
        if held:
            run.coverage["db_adds_held"] += held

async def _ledgers_live(run: SimRun, start: float) -> None:
    """Every ledger recovers and reads back; a new ledger takes writes."""
    loop = asyncio.get_running_loop()
    c = run.cluster
    final = Recoverer("final", c.client("final"), derive_rng(run.seed, "final"), run.env)
    for lid in list(run.registry.ledgers):
        if lid in run.registry.deleted:
            continue
        remaining = run.liveness_bound - (loop.time() - start)
        last = await final.recover(lid, how="final", final=True,
                                   bound=max(1.0, remaining))
        if last is None:
            run.history.liveness(f"recover L{lid}", False, "recovery did not complete")
    w = Writer("final-w", final.client, derive_rng(run.seed, "final-w"), run.env)
    ok = True
    try:
        # As wide as the live bookies allow (a wiped bookie stays out for good).
        e = min(run.topology[0], len(c.up_bookies()))
        qw = min(run.topology[1], e)
        qa = min(run.topology[2], qw)
        lh = await within(final.client.create_ledger(
            ensemble_size=e, write_quorum=qw, ack_quorum=qa, digest_type="CRC32C",
            password=PASSWORD), run.liveness_bound)
        run.registry.ledgers.append(lh.id)
        run.history.create("final-w", lh.id, qa=qa)
        futs = []
        for i in range(5):
            payload = f"final-w:{lh.id}:{i}".encode()
            fut = lh.append(payload)
            run.history.add_invoke("final-w", lh.id, lh.last_add_pushed, payload)
            fut.add_done_callback(lambda f, e=lh.last_add_pushed, lid=lh.id:
                                  w._done(lid, e, f))
            futs.append(fut)
        await within(gather(*futs), run.liveness_bound)
        await w._close(lh, lh.id)
        await final.recover(lh.id, how="final", final=True, bound=run.liveness_bound)
    except Exception as exc:
        ok = False
        final.expected(exc, "liveness: new ledger")
        run.history.liveness("new ledger accepts writes", False,
                              f"{type(exc).__name__}: {exc}")
    if ok:
        run.history.liveness("new ledger accepts writes", True,
                              f"{loop.time() - start:.3f}s after heal")

def _inspect(run: SimRun, sb: SimBookie) -> None:
    """I14: the bookie's checkpoint chain and journal agree with its segments (a bookie
    that never wrote nor loaded a checkpoint has no chain to compare: skipped); a db
    bookie's checkpoint names only entry logs that are there and sound."""
    store = sb.bookie.store if sb.bookie is not None else None  # (the journal engine's)
    if isinstance(store, DbLedgerStore):
        _inspect_db(run, sb)
        return
    if not isinstance(store, LedgerStore) or not (
            store.report.checkpoint_loaded or any(store.checkpoint_stats.values())):
        return
    report = inspect_data_dir(sb.fs, DATA_DIR)
    run.cover("data_dir_inspected")
    for st in store.index.ledgers.values():
        if st.entries.holes:  # (striped ensembles leave ids out of a bookie's dense run)
            run.cover("index_ledgers_with_holes")
        if st.entries.sparse:  # (ids far off the run: recovery adds, re-replication)
            run.cover("index_ledgers_with_sparse_ids")
    if report.checkpoint.state == "ok" and report.checkpoint.deltas:
        run.cover("data_dir_inspected_with_deltas")
    if report.checkpoint.detail.startswith(("disagrees", "replay after", "its entries live")):
        run.history.index_mismatch(sb.bookie_id, report.checkpoint.detail)


def _inspect_db(run: SimRun, sb: SimBookie) -> None:
    """I14 on a db bookie (one no damage was injected into): its directory, read offline as
    ``pybk bookie inspect`` does, is sound: the checkpoint readable, every entry log it names
    there and intact (a flush syncs its log before the checkpoint names it), the journal
    after its mark clean."""
    report = inspect_data_dir(sb.fs, DATA_DIR)
    run.cover("data_dir_inspected_db")
    if report.problems:
        run.history.index_mismatch(sb.bookie_id, f"disagrees with its entry logs: "
                                                 f"{report.problems[0]}")
