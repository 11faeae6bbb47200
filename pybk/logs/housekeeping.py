"""The writer's housekeeping: retention (and the backlog quota's eviction) after each roll and
on loop time, the backlog quota's refusals, and the offloads the log's trigger asks for.

:class:`Housekeeper` is a part of :class:`pybk.logs.LogWriter`, given what its job needs in
its constructor (the catalog, the writer's epoch, options and loop) and told, through
callbacks, the little it shares with the writer: where the writer keeps the metadata a round
read, the bytes of the current segment, whether the writer stopped, and when appends must be
refused or may resume. Design notes: docs/internals.md, "pybk/logs/writer.py".
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pybk.errors import BKError, LedgerFencedError
from pybk.logs.backlog import Backlog, BacklogStats
from pybk.logs.config import WriterOptions
from pybk.logs.meta import LogMetadata
from pybk.logs.offload import offload_segments
from pybk.logs.offload_trigger import plan_offload
from pybk.logs.position import Position
from pybk.logs.retention import Eviction, housekeep

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["Housekeeper", "retrieve"]

#: the writer's logger (its messages kept one name across the writer's modules)
log = logging.getLogger("pybk.logs.writer")


class Housekeeper:
    """See the module docstring. ``set_metadata(md)``: the metadata a round left (the writer
    keeps it); ``current_bytes()``: the bytes of the segment being written; ``stopped()``:
    the writer closed or failed; ``on_refusal(refusal)``: appends are refused from now on
    (``refusal`` says why) or, None, may resume."""

    def __init__(self, cat: LogCatalog, epoch: int, options: WriterOptions,
                 loop: asyncio.AbstractEventLoop, label: str, *,
                 set_metadata: Callable[[LogMetadata], None],
                 current_bytes: Callable[[], int],
                 stopped: Callable[[], bool],
                 on_refusal: Callable[[str | None], None]) -> None:
        self._cat = cat
        self._epoch = epoch
        self._opts = options
        self._loop = loop
        self._set_metadata = set_metadata
        self._current_bytes = current_bytes
        self._stopped = stopped
        self._on_refusal = on_refusal
        self._keeper: asyncio.Task[None] | None = None  # retention on loop time
        self._lock = asyncio.Lock()
        #: the offload the log's trigger started (pybk.logs.offload_trigger), and the names
        #: of its uploads (per writer: its label and epoch)
        self._offloading: asyncio.Task[None] | None = None
        self._offload_rng = random.Random(f"{label}/{epoch}")
        #: the log's backlog quota as this writer last checked it (pybk.logs.backlog)
        self.stats = BacklogStats()
        #: why appends are refused (the slowest cursor's lag), None while they are not
        self.refusal: str | None = None
        self._backlog_task: asyncio.Task[None] | None = None

    async def apply_retention(self) -> None:
        """One round: retention and eviction, the backlog's verdict, an offload if due."""
        async with self._lock:  # one round at a time: each plans on the last one's
            md, backlog, evicted = await housekeep(self._cat, epoch=self._epoch,
                                                   current_bytes=self._current_bytes())
            self._set_metadata(md)
        self._note_backlog(md, backlog, evicted)
        self._maybe_offload(md)

    def _maybe_offload(self, md: LogMetadata) -> None:
        """Start an offload when the log's trigger says one is due (pybk.logs.offload_trigger;
        one at a time, beside the appends)."""
        if self._offloading is not None or self._stopped():
            return
        before = plan_offload(md, self._cat.now_ms())
        if before is not None:
            self._offloading = task = self._loop.create_task(self._offload(before))
            task.add_done_callback(retrieve)

    async def _offload(self, before: Position | None) -> None:
        """Offload what is due, then look again (segments completed meanwhile), until
        nothing is due."""
        try:
            while before is not None and not self._stopped():
                done = await offload_segments(self._cat, self._offload_rng, before=before)
                log.info("log %s: segments %s offloaded", self._cat.name, done)
                before = plan_offload(await self._cat.read(), self._cat.now_ms())
        except Exception as exc:  # (the tier's own errors too): tried again next round
            log.warning("log %s: offload failed, will retry: %r", self._cat.name, exc)
        finally:
            self._offloading = None

    async def check_at_open(self) -> None:
        """A writer opened while the log is over its backlog quota refuses from the start
        (a failed check is left to the next round: retention's own errors are not fatal)."""
        try:
            await self.apply_retention()
        except (BKError, OSError) as exc:
            log.info("log %s: the backlog check at open failed, will retry: %s",
                     self._cat.name, exc)

    def _note_backlog(self, md: LogMetadata, backlog: Backlog,
                      evicted: Eviction | None) -> None:
        """Take a check's outcome: counts, and start or stop refusing appends."""
        st = self.stats
        st.checks += 1
        st.bytes, st.seconds = backlog.bytes, backlog.seconds
        if evicted is not None:
            st.evicted_segments += evicted.segments
            st.evicted_bytes += evicted.bytes
        refusal = backlog.over if md.config.backlog_policy == "refuse" else None
        if refusal == self.refusal:
            return
        self.refusal = st.refusing = refusal
        if refusal is not None:
            log.warning("log %s: slowest cursor %s: appends refused until it catches up",
                        self._cat.name, refusal)
            self._on_refusal(refusal)
            if self._backlog_task is None:
                self._backlog_task = self._loop.create_task(
                    self._recheck_backlog(self._opts.backlog_check_interval))
                self._backlog_task.add_done_callback(retrieve)
        else:
            log.info("log %s: backlog under its quota again: appends resume", self._cat.name)
            self._on_refusal(None)

    async def _recheck_backlog(self, interval: float) -> None:
        """While appends are refused: check again every ``interval`` s of loop time."""
        try:
            while self.refusal is not None and not self._stopped():
                await asyncio.sleep(interval)
                try:
                    await self.apply_retention()
                except LedgerFencedError:
                    return
                except (BKError, OSError) as exc:
                    log.info("log %s: backlog check failed, will retry: %s",
                             self._cat.name, exc)
        finally:
            self._backlog_task = None

    def start(self) -> None:
        """Retention on loop time every ``housekeeping_interval`` seconds (when set)."""
        interval = self._opts.housekeeping_interval
        if interval is not None:
            self._keeper = self._loop.create_task(self._housekeeping(interval))
            self._keeper.add_done_callback(retrieve)

    async def _housekeeping(self, interval: float) -> None:
        """Retention and the tier's deletion lag on loop time, while the writer lives (a
        failure is logged and tried again next time; a takeover ends it)."""
        while True:
            await asyncio.sleep(interval)
            if self._stopped():
                return
            try:
                await self.apply_retention()
            except LedgerFencedError:
                return
            except (BKError, OSError) as exc:
                log.info("log %s: housekeeping failed, will retry: %s", self._cat.name, exc)

    def stop(self) -> None:
        """Cancel the housekeeping timer, the backlog rechecks and an offload under way."""
        for task in (self._keeper, self._backlog_task, self._offloading):
            if task is not None:
                task.cancel()
        self._keeper = None


def retrieve(task: asyncio.Task[Any]) -> None:
    """A done callback: fetch a finished task's exception (so asyncio does not warn)."""
    if not task.cancelled():
        task.exception()
