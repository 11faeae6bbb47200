"""Auto-recovery as a service: one auditor candidate plus one replication worker.

Run one :class:`AutoRecovery` next to each bookie (``pybk bookie --autorecovery``,
``LocalCluster(autorecovery=True)``) or on its own (``pybk autorecovery --metadata URI``).
Every instance campaigns in the cluster's auditor election; the elected one runs the
:class:`~pybk.ops.auditor.Auditor` until it loses leadership, and every instance runs a
:class:`~pybk.ops.worker.ReplicationWorker`. Failures inside a check or a repair are
retried; an exception nobody expected stops the instance and is kept in
:attr:`AutoRecovery.failure` (and logged), never swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

from pybk.client.context import ClientConfig, ClientContext
from pybk.metadata.base import Election, MetadataStore
from pybk.ops.auditor import Auditor
from pybk.ops.config import AutoRecoveryConfig, AutoRecoveryStats
from pybk.ops.settings import AutoRecoverySettings
from pybk.ops.worker import ReplicationWorker
from pybk.runtime.eventloop import gather
from pybk.transport.base import Transport

__all__ = ["AutoRecovery"]

log = logging.getLogger(__name__)


class AutoRecovery:
    """An auditor candidate and a replication worker (see the module doc).

    ``name`` labels this instance (a bookie id, or a host name): it is the candidate's name
    in the election and the owner of its ledger locks. ``client_config`` carries the
    placement policy used for replacements and the timeouts of copies.
    """

    def __init__(
        self,
        store: MetadataStore,
        transport: Transport,
        *,
        name: str,
        config: AutoRecoveryConfig | None = None,
        client_config: ClientConfig | None = None,
        rng: random.Random | None = None,
        stats: AutoRecoveryStats | None = None,
    ) -> None:
        self.name = name
        self.config = config or AutoRecoveryConfig()
        self.stats = stats or AutoRecoveryStats()
        self.ctx = ClientContext(store, transport, client_config or ClientConfig(),
                                 rng or random.Random())
        self.settings = AutoRecoverySettings(store)
        self.auditor = Auditor(self.ctx, self.settings, self.config, self.stats)
        self.worker = ReplicationWorker(self.ctx, self.settings, self.config, self.stats,
                                        owner=name)
        self._election: Election | None = None
        self._auditor_task: asyncio.Task[None] | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._running = False
        #: the unexpected exception that stopped this instance, if any
        self.failure: BaseException | None = None
        #: whoever made this instance closes the store when this is True
        self.owns_store = False

    @property
    def is_auditor(self) -> bool:
        return self._election is not None and self._election.is_leader

    async def start(self) -> AutoRecovery:
        if self._running:
            return self
        self._running = True
        loop = asyncio.get_running_loop()
        self._worker_task = loop.create_task(self.worker.run(), name=f"pybk-worker-{self.name}")
        self._worker_task.add_done_callback(self._task_done)
        self._election = self.ctx.store.election(self.config.election, self.name)
        self._election.on_change = self._leadership
        await self._election.join()
        log.info("auto-recovery %s started", self.name)
        return self

    def _leadership(self, leading: bool) -> None:
        self.stats.leading = leading
        if leading and self._running:
            if self._auditor_task is None or self._auditor_task.done():
                log.info("auto-recovery %s: elected auditor", self.name)
                self._auditor_task = asyncio.get_running_loop().create_task(
                    self.auditor.run(), name=f"pybk-auditor-{self.name}")
                self._auditor_task.add_done_callback(self._task_done)
        elif self._auditor_task is not None:
            log.info("auto-recovery %s: no longer the auditor", self.name)
            self._auditor_task.cancel()
            self._auditor_task = None

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or not self._running:
            return
        exc = task.exception()
        if exc is None:
            return
        from pybk.errors import ClientClosedError

        if isinstance(exc, ClientClosedError):
            log.info("auto-recovery %s: the metadata store closed (%s)", self.name, exc)
            return
        self.failure = exc
        log.error("auto-recovery %s stopped on an unexpected error", self.name, exc_info=exc)

    def wake(self) -> None:
        """Make the worker (and the auditor) look again now (tests, the admin)."""
        self.worker.wake()
        self.auditor.wake()

    async def stop(self, *, resign: bool = True) -> None:
        """Stop the auditor and the worker. ``resign=False`` stops as a killed process does:
        the election is left as it stands, its lock going only when the store's session
        lapses (the simulator's lost hosts)."""
        if not self._running:
            return
        self._running = False
        if self._election is not None and resign:
            with contextlib.suppress(Exception):
                await self._election.resign()
        for task in (self._auditor_task, self._worker_task):
            if task is not None and not task.done():
                task.cancel()
                await gather(task, return_exceptions=True)
        self._auditor_task = self._worker_task = None
        log.info("auto-recovery %s stopped", self.name)

    async def __aenter__(self) -> AutoRecovery:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def status(self) -> dict[str, Any]:
        """This instance's view, for the admin and the HTTP endpoint."""
        s = self.stats
        return {
            "name": self.name,
            "auditor": self.is_auditor,
            "failure": None if self.failure is None else repr(self.failure),
            "under_replicated": s.under_replicated,
            "ledgers_marked": s.ledgers_marked,
            "ledgers_repaired": s.ledgers_repaired,
            "repairs_failed": s.repairs_failed,
            "repairs_deferred": s.repairs_deferred,
            "entries_copied": s.entries_copied,
            "bytes_copied": s.bytes_copied,
            "last_error": s.last_error,
        }
