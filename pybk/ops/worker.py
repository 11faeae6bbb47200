"""A replication worker: repairs the ledgers the auditor marked (BookKeeper's
``ReplicationWorker``).

It wakes when the auditor bumps the marks counter (and every ``worker_poll_interval`` in
case a watch was missed), lists the marks and, for each marked ledger it can lock
(``replication/ledger-<id>``: one worker per ledger at a time, the lock vanishing with a
dead worker), runs :func:`~pybk.ops.replicator.repair_ledger`. A repaired, clean or
deleted ledger's mark is cleared *if it still lists what was repaired* (a mark widened
meanwhile stays for the next pass). A failure backs the ledger off (doubling, bounded) and
moves on; a ledger whose open last fragment is in its grace period is retried when the
period ends. While auto-recovery is disabled cluster-wide the worker copies nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pybk.client.context import ClientContext
from pybk.errors import BKError, ClientClosedError, LockedError
from pybk.metadata.base import Watch
from pybk.ops.config import AutoRecoveryConfig, AutoRecoveryStats
from pybk.ops.replicator import Outcome, repair_ledger
from pybk.ops.settings import AutoRecoverySettings
from pybk.runtime.eventloop import gather

__all__ = ["ReplicationWorker", "ledger_lock"]

log = logging.getLogger(__name__)


#: seconds within which a scheduled retry counts as due
_SLACK = 0.001


def ledger_lock(ledger_id: int) -> str:
    """The lock a worker holds while it repairs ``ledger_id``."""
    return f"replication/ledger-{ledger_id}"


class ReplicationWorker:
    """Runs while its task runs; see the module doc. ``owner`` labels its locks."""

    def __init__(self, ctx: ClientContext, settings: AutoRecoverySettings,
                 config: AutoRecoveryConfig, stats: AutoRecoveryStats, *, owner: str) -> None:
        self.ctx = ctx
        self.settings = settings
        self.config = config
        self.stats = stats
        self.owner = owner
        self._wake = asyncio.Event()
        self.retry_at: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        #: ledger -> loop time a repair was first deferred (its open fragment's grace)
        self.deferred_since: dict[int, float] = {}
        #: ledgers being repaired by this worker now
        self.busy: set[int] = set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        watches: list[Watch] = self.settings.watch(self.wake)
        try:
            while True:
                self._wake.clear()
                next_wake = loop.time() + self.config.worker_poll_interval
                try:
                    next_wake = min(next_wake, await self.pass_once())
                except ClientClosedError:
                    raise
                except BKError as exc:
                    self.stats.last_error = f"worker: {type(exc).__name__}: {exc}"
                    log.warning("replication worker %s: pass failed: %s", self.owner, exc)
                    next_wake = min(next_wake, loop.time() + self.config.retry_backoff)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, next_wake - loop.time())):
                        await self._wake.wait()  # (no task per wait, as wait_for makes)
        finally:
            for w in watches:
                w.cancel()

    async def pass_once(self) -> float:
        """Repair every marked ledger that is due; returns when the next retry is due."""
        loop = asyncio.get_running_loop()
        if not await self.settings.is_enabled():
            return float("inf")  # the settings watch wakes us when re-enabled
        marks = await self.ctx.store.list_under_replicated()
        self.stats.under_replicated = len(marks)
        for lid in list(self.retry_at):
            if lid not in marks:  # cleared by someone else
                self.retry_at.pop(lid, None)
                self._backoff.pop(lid, None)
                self.deferred_since.pop(lid, None)
        live = {r.bookie_id for r in await self.ctx.store.list_bookies()}
        now = loop.time()
        # (a retry due within a millisecond is due now: a wait shorter than the clock's
        # resolution would wake at once, again and again)
        due = [lid for lid in sorted(marks) if self.retry_at.get(lid, 0.0) <= now + _SLACK]
        self.ctx.rng.shuffle(due)  # several workers start on different ledgers
        if due:  # (most passes find nothing due)
            limit = asyncio.Semaphore(self.config.concurrent_repairs)

            async def one(lid: int) -> None:
                async with limit:
                    if await self.settings.is_enabled():
                        await self._repair(lid, marks[lid], live)

            await gather(*(one(lid) for lid in due))
        upcoming = [t for lid, t in self.retry_at.items() if lid in marks]
        return min(upcoming, default=float("inf"))

    async def _repair(self, lid: int, marked: list[str], live: set[str]) -> None:
        loop = asyncio.get_running_loop()
        store = self.ctx.store
        lock = ledger_lock(lid)
        if not await store.try_lock(lock, self.owner):
            self.retry_at[lid] = loop.time() + self.config.retry_backoff  # another worker's
            return
        self.busy.add(lid)
        try:
            now = loop.time()
            since = self.deferred_since.get(lid)
            grace_over = since is not None and \
                now - since + _SLACK >= self.config.open_ledger_grace
            result = await repair_ledger(
                self.ctx, lid, marked, live=live, grace_over=grace_over,
                passwords=self.config.passwords, window=self.config.copy_window)
            self.stats.entries_copied += result.entries_copied
            self.stats.bytes_copied += result.bytes_copied
            self.stats.slots_replaced += len(result.slots_replaced)
            if result.outcome is Outcome.DEFERRED:
                self.stats.repairs_deferred += 1
                start = self.deferred_since.setdefault(lid, now)
                self.retry_at[lid] = start + self.config.open_ledger_grace
                log.info("ledger %s: its open last fragment names a lost bookie; "
                         "repair deferred %.1f s", lid, self.retry_at[lid] - now)
                return
            if not store.holds_lock(lock):
                raise LockedError(f"lost the lock of ledger {lid} during its repair")
            await store.clear_under_replicated(lid, expected=marked)
            self.stats.ledgers_repaired += 1
            self.retry_at.pop(lid, None)
            self._backoff.pop(lid, None)
            self.deferred_since.pop(lid, None)
            log.info("ledger %s: %s (marked %s; %d entries copied)", lid,
                     result.outcome.value, marked, result.entries_copied)
        except (BKError, OSError) as exc:
            self.stats.repairs_failed += 1
            self.stats.last_error = f"ledger {lid}: {type(exc).__name__}: {exc}"
            backoff = min(self._backoff.get(lid, self.config.retry_backoff / 2) * 2,
                          self.config.max_retry_backoff)
            self._backoff[lid] = backoff
            self.retry_at[lid] = loop.time() + backoff
            log.warning("ledger %s: repair failed (%s: %s); retry in %.1f s", lid,
                        type(exc).__name__, exc, backoff)
        finally:
            self.busy.discard(lid)
            with contextlib.suppress(BKError):
                await store.unlock(lock)
