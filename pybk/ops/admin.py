"""The admin API (``client.admin()``): bookies, under-replicated ledgers, recovery,
decommission, and the cluster-wide auto-recovery switches.

Everything goes through the client's metadata store and transport, so it works the same
against an embedded cluster, bookie processes on SQLite metadata, or ZooKeeper. The
operations that copy data (:meth:`Admin.recover_bookie`, :meth:`Admin.decommission_bookie`)
run the replication workers' own repair (:func:`~pybk.ops.replicator.repair_ledger`) in this
process, ledger by ledger under the same per-ledger locks, so they cooperate with running
auto-recovery instead of racing it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pybk.bookie.gcremote import read_gc_status, request_gc, status_key
from pybk.client.context import ClientContext
from pybk.errors import BKError, BookieStateError, LockedError
from pybk.metadata.base import LedgerMetadata
from pybk.ops.auditor import bookie_index, read_all_metadata
from pybk.ops.replicator import Outcome, repair_ledger
from pybk.ops.settings import AutoRecoverySettings
from pybk.ops.tenancy_admin import TenancyAdmin
from pybk.ops.worker import ledger_lock
from pybk.runtime.eventloop import within
from pybk.wire import BookieInfoRequest, BookieInfoResponse, Status

if TYPE_CHECKING:
    from pybk.client import Client

__all__ = ["Admin", "BookieInfo", "RecoveryReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BookieInfo:
    """A live bookie as the registry shows it."""

    id: str
    address: str
    state: str  # "writable" | "read-only"
    rack: str
    #: isolation group ("" when in none)
    group: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "address": self.address, "state": self.state,
                "rack": self.rack, "group": self.group}


@dataclass
class RecoveryReport:
    """What :meth:`Admin.recover_bookie` / :meth:`Admin.decommission_bookie` did."""

    bookie: str
    ledgers: list[int] = field(default_factory=list)  # ledgers that named it
    repaired: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)  # gone meanwhile: nothing to do
    entries_copied: int = 0
    bytes_copied: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"bookie": self.bookie, "ledgers": self.ledgers, "repaired": self.repaired,
                "deleted": self.deleted, "entries_copied": self.entries_copied,
                "bytes_copied": self.bytes_copied}


class Admin(TenancyAdmin):
    """Cluster administration through one client (see the module doc); tenants and
    namespaces: :class:`pybk.ops.tenancy_admin.TenancyAdmin`."""

    def __init__(self, client: Client, *, passwords: Sequence[bytes] = (b"",),
                 copy_window: int = 64) -> None:
        self._client = client
        self.passwords = tuple(passwords)
        self.copy_window = copy_window

    @property
    def _ctx(self) -> ClientContext:
        return self._client._context()

    @property
    def settings(self) -> AutoRecoverySettings:
        return AutoRecoverySettings(self._ctx.store)

    # -- bookies -----------------------------------------------------------------------------

    async def list_bookies(self) -> list[BookieInfo]:
        """Live bookies (registered now), sorted by id. A bookie that died without
        unregistering leaves this list when its registration lapses (its metadata
        session's timeout / lease)."""
        return [BookieInfo(r.bookie_id, r.address, "read-only" if r.read_only else "writable",
                           r.rack, r.group) for r in await self._ctx.store.list_bookies()]

    async def bookie_info(self, bookie_id: str, timeout: float = 5.0) -> dict[str, Any]:
        """What the bookie itself says: free and total disk, state, reason."""
        reply = await self._ctx.transport.send(bookie_id, BookieInfoRequest(), timeout)
        if reply.status != Status.OK or not isinstance(reply, BookieInfoResponse):
            from pybk.errors import error_for_status

            raise error_for_status(reply.status, f"{bookie_id}: {reply.message}")
        return {"id": bookie_id, "free_bytes": reply.free_bytes,
                "total_bytes": reply.total_bytes, "state": reply.state,
                "message": reply.message}

    # -- space -------------------------------------------------------------------------------

    async def collect_garbage(self, bookie: str | None = None, *,
                              timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        """Ask one bookie's garbage collector (or every registered bookie's) for a run now,
        with major compaction; wait for each to publish it (``timeout`` seconds, loop time).
        Returns bookie id -> what its run did (:meth:`gc_status`'s ``last_run``), or
        ``{"error": ...}`` for a bookie that did not answer in time."""
        store = self._ctx.store
        ids = [bookie] if bookie is not None else sorted(
            r.bookie_id for r in await store.list_bookies())
        asked = {b: await request_gc(store, b) for b in ids}
        answers = await asyncio.gather(*(self._gc_answer(b, n, timeout)
                                         for b, n in asked.items()))
        return dict(zip(asked, answers, strict=True))

    async def _gc_answer(self, bookie: str, wanted: int, timeout: float) -> dict[str, Any]:
        store = self._ctx.store
        changed = asyncio.Event()
        watch = store.watch_value(status_key(bookie), lambda _key: changed.set())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                changed.clear()
                status = await read_gc_status(store, bookie)
                if status is not None and int(status.get("handled", 0)) >= wanted:
                    last: dict[str, Any] = status.get("last_run") or {}
                    return last
                left = deadline - loop.time()
                if left <= 0:
                    return {"error": f"bookie {bookie} did not run its garbage collector "
                                     f"within {timeout:g}s (stopped, or no metadata store?)"}
                try:  # (a watch may miss a change: look again at least every second)
                    await asyncio.wait_for(changed.wait(), min(left, 1.0))
                except TimeoutError:
                    pass
        finally:
            watch.cancel()

    async def gc_status(self) -> dict[str, dict[str, Any]]:
        """Per registered bookie: its garbage collector's
        last published status: running, runs, last run (seconds before it was published),
        ledgers removed, bytes reclaimed, entries moved, time spent."""
        store = self._ctx.store
        ids = {r.bookie_id for r in await store.list_bookies()}
        out: dict[str, dict[str, Any]] = {}
        for b in sorted(ids):
            status = await read_gc_status(store, b)
            out[b] = status if status is not None else {"error": "no status published yet"}
        return out

    async def ledgers_of(self, bookie_id: str) -> list[int]:
        """Ledgers whose metadata names ``bookie_id`` in any fragment."""
        return sorted(bookie_index(await read_all_metadata(self._ctx)).get(bookie_id, ()))

    async def recover_bookie(self, bookie_id: str, *, grace: float = 0.0) -> RecoveryReport:
        """Copy every fragment that names ``bookie_id`` to other bookies and update the
        ensembles (BookKeeper's ``recover``). A ledger still being written whose open
        fragment names the bookie is recovered (its writer fenced) first, after ``grace``
        seconds. Raises (after trying every ledger) if some could not be repaired."""
        report = RecoveryReport(bookie_id)
        report.ledgers = await self.ledgers_of(bookie_id)
        await self._repair_all(bookie_id, report.ledgers, report, grace)
        return report

    async def decommission_bookie(self, bookie_id: str, *, timeout: float | None = None,
                                  poll_interval: float = 1.0, delete_cookie: bool = False,
                                  grace: float = 0.0) -> RecoveryReport:
        """Retire a stopped bookie for good: mark and repair every ledger naming it, then
        wait until no ledger names it and no mark lists it (running auto-recovery may do
        part of the work). Refuses (BookieStateError) while the bookie is registered: stop
        it first. ``delete_cookie`` forgets its identity, so a fresh bookie may reuse the
        id. Raises pybk.TimeoutError when ``timeout`` passes first."""
        if any(b.id == bookie_id for b in await self.list_bookies()):
            raise BookieStateError(
                f"bookie {bookie_id} is still running (registered): stop it before "
                "decommissioning it")
        ctx = self._ctx
        work = self._decommission(bookie_id, poll_interval, grace)
        report = await (within(work, timeout) if timeout is not None else work)
        if delete_cookie:
            await ctx.store.delete_cookie(bookie_id)
        log.info("bookie %s decommissioned: %d ledgers repaired", bookie_id,
                 len(report.repaired))
        return report

    async def _decommission(self, bookie_id: str, poll_interval: float,
                            grace: float) -> RecoveryReport:
        ctx = self._ctx
        report = RecoveryReport(bookie_id)
        while True:
            ledgers = await self.ledgers_of(bookie_id)
            marks = await ctx.store.list_under_replicated()
            waiting = sorted(lid for lid, missing in marks.items() if bookie_id in missing)
            if not ledgers and not waiting:
                return report
            report.ledgers = sorted(set(report.ledgers) | set(ledgers))
            for lid in ledgers:
                if bookie_id not in marks.get(lid, ()):
                    await ctx.store.mark_under_replicated(lid, [bookie_id])
            if ledgers:
                await self.settings.marks_added()
            try:
                await self._repair_all(bookie_id, sorted(set(ledgers) | set(waiting)), report,
                                       grace)
            except BKError as exc:
                log.info("decommission of %s: %s; trying again", bookie_id, exc)
            await asyncio.sleep(poll_interval)  # a bounded wait for workers elsewhere

    async def _repair_all(self, bookie_id: str, ledgers: Sequence[int], report: RecoveryReport,
                          grace: float) -> None:
        ctx = self._ctx
        live = {r.bookie_id for r in await ctx.store.list_bookies()} - {bookie_id}
        failures: list[str] = []
        first: BKError | None = None
        loop = asyncio.get_running_loop()
        started = loop.time()
        for lid in ledgers:
            lock = ledger_lock(lid)
            if not await ctx.store.try_lock(lock, f"admin:{id(self):x}"):
                failures.append(f"ledger {lid}: being repaired by "
                                f"{await ctx.store.lock_owner(lock)}")
                first = first or LockedError(failures[-1])
                continue
            try:
                marks = (await ctx.store.list_under_replicated()).get(lid, [])
                result = await repair_ledger(
                    ctx, lid, sorted({bookie_id, *marks}), live=live,
                    grace_over=loop.time() - started >= grace, passwords=self.passwords,
                    window=self.copy_window)
                report.entries_copied += result.entries_copied
                report.bytes_copied += result.bytes_copied
                if result.outcome is Outcome.DELETED:
                    report.deleted.append(lid)
                elif result.outcome is Outcome.DEFERRED:
                    failures.append(f"ledger {lid}: still open, grace period running")
                    first = first or LockedError(failures[-1])
                    continue
                else:
                    report.repaired.append(lid)
                if marks:
                    await ctx.store.clear_under_replicated(lid, expected=marks)
            except BKError as exc:
                failures.append(f"ledger {lid}: {type(exc).__name__}: {exc}")
                first = first or exc
            finally:
                await ctx.store.unlock(lock)
        if first is not None:  # the first failure's kind, every failure's story
            raise fresh_copy_with(first, f"{len(failures)} ledger(s) naming {bookie_id} not "
                                         "repaired: " + "; ".join(failures[:5]))

    # -- under-replication -------------------------------------------------------------------

    async def under_replicated(self) -> list[int]:
        """Ledgers marked under-replicated (fewer than Qw live copies of some entry)."""
        return sorted(await self._ctx.store.list_under_replicated())

    async def under_replicated_details(self) -> dict[int, list[str]]:
        """Marked ledger -> the bookies it lacks replicas on."""
        return await self._ctx.store.list_under_replicated()

    # -- auto-recovery switches --------------------------------------------------------------

    async def trigger_audit(self) -> int:
        """Ask the auditor for an audit now (lost bookies are marked at once, whatever the
        recovery delay, and every ledger's replicas are checked)."""
        return await self.settings.request_audit()

    async def enable_autorecovery(self) -> None:
        await self.settings.set_enabled(True)

    async def disable_autorecovery(self) -> None:
        await self.settings.set_enabled(False)

    async def set_lost_bookie_recovery_delay(self, seconds: float | None) -> None:
        await self.settings.set_lost_bookie_recovery_delay(seconds)

    async def autorecovery_status(self) -> dict[str, Any]:
        """Enabled or not, the auditor, the delay, the marks and who repairs what now."""
        store = self._ctx.store
        settings = self.settings
        return {
            "enabled": await settings.is_enabled(),
            "auditor": await store.election_leader("auditor"),
            "lost_bookie_recovery_delay": await settings.lost_bookie_recovery_delay(),
            "under_replicated": len(await store.list_under_replicated()),
            "repairing": {name.rsplit("-", 1)[-1]: owner
                          for name, owner in (await store.list_locks("replication/")).items()},
        }

    # -- ledgers -----------------------------------------------------------------------------

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return await self._ctx.store.read_ledger(ledger_id)

    async def list_ledgers(self) -> list[int]:
        return await self._ctx.store.list_ledgers()


def fresh_copy_with(exc: BKError, message: str) -> BKError:
    """An exception of ``exc``'s class with ``message`` (its cause: ``exc``)."""
    try:
        new = type(exc)(message)
    except Exception:
        new = BKError(message)
    new.__cause__ = exc
    return new
