"""The bookie: request handling over the storage engine (docs/contracts.md).

``Bookie.handle(request)`` answers every request type of :mod:`pybk.wire` with its
response; request-level failures become a status and a message, never an exception, and an
unexpected exception becomes IO_ERROR with its text (the bookie keeps serving).

What the bookie adds on top of :class:`pybk.storage.store.LedgerStore` (listed in
docs/internals.md, "pybk/bookie/bookie.py"). Its adds are :mod:`pybk.bookie.adds`, its
reads and long polls :mod:`pybk.bookie.reads`, its upkeep on request (ledger deletion,
garbage collection, compaction, checkpoints) :mod:`pybk.bookie.maintenance`: mixins of the
one Bookie class.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Final

from pybk.bookie.adds import BookieAdds
from pybk.bookie.config import BookieConfig
from pybk.bookie.cookie import check_cookie
from pybk.bookie.deferred import DeferredSyncs, force_reply
from pybk.bookie.gc import GarbageCollector, metadata_liveness
from pybk.bookie.gcremote import GcRemote
from pybk.bookie.longpoll import LongPollWaiters
from pybk.bookie.lookups import LedgerLookups
from pybk.bookie.maintenance import BookieMaintenance
from pybk.bookie.reads import NO_SUCH_ENTRY_ON_IO_ERROR, BookieReads
from pybk.bookie.replies import state_message
from pybk.bookie.scrubbing import start_scrubber
from pybk.bookie.state import READ_ONLY, STOPPED, WRITABLE, BookieState
from pybk.bookie.turns import ADMIT_CHUNK, ADMIT_STEP
from pybk.bookie.unknown import UnknownLedgerCheck, fence_checked
from pybk.errors import (
    BKError,
    BookieStateError,
    BookieStoppedError,
    IOBookieError,
    ReadOnlyBookieError,
    status_of,
)
from pybk.metadata.base import MetadataStore
from pybk.runtime.ratelog import RateLimitedLog
from pybk.runtime.turnqueue import TurnQueue
from pybk.stats import BookieStats
from pybk.storage.engine import LedgerStorage
from pybk.storage.engines import make_engine
from pybk.storage.fs import FileSystem
from pybk.storage.scrub import Scrubber
from pybk.wire import (
    AddBatchRequest,
    AddOutcome,
    AddRequest,
    BookieInfoRequest,
    BookieInfoResponse,
    FenceRequest,
    FenceResponse,
    ForceRequest,
    ListEntriesRequest,
    ListEntriesResponse,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    Request,
    Response,
    Status,
    WriteLacRequest,
    WriteLacResponse,
    add_response,
    error_response,
)

log = logging.getLogger(__name__)

# (a module constant: each ``Status.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_OK = Status.OK

#: seconds between two log lines of one kind of error a remote request can cause
REMOTE_LOG_INTERVAL: Final = 10.0


class Bookie(BookieAdds, BookieReads, BookieMaintenance):
    """One bookie over one data directory. See the module docstring and docs/contracts.md."""

    def __init__(
        self,
        bookie_id: str,
        data_dir: str,
        *,
        fs: FileSystem | None = None,
        config: BookieConfig | None = None,
        cookie_store: MetadataStore | None = None,
        rng: random.Random | None = None,
        stats: BookieStats | None = None,
    ) -> None:
        #: a file system we created ourselves is ours to close on stop (its sync thread)
        self._own_fs = fs is None
        config = config or BookieConfig()
        if fs is None:
            fs = self._new_os_fs(config)
        self.bookie_id = bookie_id
        self.data_dir = data_dir
        self.fs = fs
        self.config = config
        self.cookie_store = cookie_store
        #: the metadata reads of ledgers its checks share (the unknown-ledger check here,
        #: the tenancy gate: pybk.bookie.lookups), None without a metadata store
        self.ledger_lookups = (LedgerLookups(cookie_store) if cookie_store is not None
                               else None)
        #: checks requests about ledgers not held here against the metadata (or None)
        self.unknown_ledgers = (
            UnknownLedgerCheck(cookie_store, lookups=self.ledger_lookups)
            if cookie_store is not None and config.check_unknown_ledgers else None)
        self.rng = rng or random.Random()
        self.instance_id = ""
        self.store: LedgerStorage | None = None
        self.on_state_change: Callable[[str], None] | None = None
        #: the tenancy gate the transports ask before adds and reads (pybk.bookie.tenancy)
        self.tenancy: Any = None
        #: told when a journal operation failed for want of file descriptors (EMFILE,
        #: ENFILE): the owner frees some (a bookie process closes connections); the journal
        #: retries the operation, the bookie stays writable
        self.on_descriptors_exhausted: Callable[[OSError], None] | None = None
        self._state = STOPPED
        self._reason = "not started"
        self._disk_full = False  # read-only because of the disk (recoverable)
        self._journal_failed = False  # read-only for good (until restart)
        self._journal_reason = ""
        self._polls = LongPollWaiters()
        self.deferred = DeferredSyncs()  # adds answered before their fsync (deferred sync)
        self._no_such_entry_on_io_error = NO_SUCH_ENTRY_ON_IO_ERROR in config.mutations
        #: requests, their latency and the journal's batches, recorded when given
        #: (pybk.bookie.metrics exports them); None: nothing is timed
        self.stats = stats
        self._timers: list[asyncio.TimerHandle] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_cp_pos: object = None
        self._fs_closed = False
        #: errors a remote request can cause, logged at most once per interval per kind
        self._remote_log: RateLimitedLog | None = None
        #: the garbage collector (pybk.bookie.gc), while started with a metadata store
        self.gc: GarbageCollector | None = None
        #: batched adds of more entries are admitted over several loop turns (bookie/turns.py)
        self.admit_chunk = ADMIT_CHUNK
        #: entries of such a batch admitted per turn (at most admit_chunk)
        self.admit_step = ADMIT_STEP
        #: their chunks take turns here: one chunk per loop turn in all
        self.admit_turns = TurnQueue()
        self._gc_remote: GcRemote | None = None
        #: the local scrubber (pybk.bookie.scrubbing), while started with a scrub rate
        self.scrubber: Scrubber | None = None

    def _remote_error(self, kind: str, detail: str, exc: BaseException | None = None) -> None:
        """Log an error a remote request caused (a damaged entry read, an unexpected
        failure), rate-limited: a peer repeating the request cannot fill the log."""
        if self._remote_log is None:
            self._remote_log = RateLimitedLog(log, REMOTE_LOG_INTERVAL,
                                              asyncio.get_running_loop().time)
        self._remote_log.event(f"bookie {self.bookie_id}: {kind}", detail, logging.ERROR, exc)

    @staticmethod
    def _new_os_fs(config: BookieConfig) -> FileSystem:
        from pybk.storage import OsFileSystem

        # a sync that starts while the loop is busy needs a helper process (a sync thread
        # would first have to win the GIL, see pybk.storage.syncer); overlapped journal syncs
        # rely on it
        return OsFileSystem(
            sync_process=config.journal_sync_process or config.journal_overlap_syncs)

    # ================================================================== state

    @property
    def state(self) -> BookieState:
        return self._state

    @property
    def state_reason(self) -> str:
        return self._reason

    def _set_state(self, state: BookieState, reason: str) -> None:
        changed = state != self._state
        self._state, self._reason = state, reason
        if changed:
            log.info("bookie %s is %s: %s", self.bookie_id, state, reason)
            if self.on_state_change is not None:
                try:
                    self.on_state_change(state)
                except Exception:  # a listener's bug must not break the bookie
                    log.exception("on_state_change listener failed")

    def _refresh_state(self, reason: str) -> None:
        if self._state == STOPPED:
            return
        if self._journal_failed and reason != self._journal_reason:
            reason = f"{self._journal_reason}; {reason}"  # the journal failure stays named
        if self._journal_failed or self._disk_full:
            self._set_state(READ_ONLY, reason)
        else:
            self._set_state(WRITABLE, reason)

    # ================================================================== life cycle

    async def start(self) -> None:
        """Check the cookie, replay the journal, start serving.

        Raises BookieStateError (identity mismatch) or CorruptRecordError (journal damage)."""
        if self._state != STOPPED:
            raise BookieStateError(f"bookie {self.bookie_id} is already started")
        if self._own_fs and self._fs_closed:
            self.fs, self._fs_closed = self._new_os_fs(self.config), False
        self.fs.makedirs(self.data_dir)
        self.instance_id = await check_cookie(self.fs, self.data_dir, self.bookie_id,
                                              self.cookie_store, self.rng)
        store = make_engine(
            self.fs, self.data_dir, self.instance_id, self.config,
            on_fatal=self._on_journal_fatal, on_write_error=self._on_write_error,
            on_ledger_change=self._polls.wake, watched=self._polls.by_ledger,
            stats=self.stats,
        )
        try:
            await store.open()
        except BaseException:
            store.abandon(BookieStateError(f"bookie {self.bookie_id} failed to start"))
            raise
        self.store = store
        self._journal_failed = False
        self._disk_full = False
        if store.read_only_reason:
            self._journal_failed = True
            self._journal_reason = store.read_only_reason
            self._set_state(READ_ONLY, store.read_only_reason)
        else:
            self._set_state(WRITABLE, "started")
        if self.cookie_store is not None:
            meta = self.cookie_store
            self.gc = GarbageCollector(self, metadata_liveness(meta), meta.list_ledgers)
            self.gc.start()
            self._gc_remote = GcRemote(self.gc, meta)
            await self._gc_remote.start()
        self.scrubber = start_scrubber(self)
        self._check_disk()
        loop = asyncio.get_running_loop()
        if self.config.disk_check_interval > 0:
            self._timers.append(loop.call_later(self.config.disk_check_interval,
                                                self._disk_timer))
        if self.config.checkpoint_interval > 0:
            self._timers.append(loop.call_later(self.config.checkpoint_interval,
                                                self._checkpoint_timer))

    async def stop(self) -> None:
        """Clean shutdown: finish pending writes, checkpoint, close files."""
        if self._state == STOPPED:
            return
        self._set_state(STOPPED, "stopped")
        if self.gc is not None:  # a compaction under way ends its steps first
            self.gc.stop()
            if self._gc_remote is not None:
                await self._gc_remote.drain()
            await self.gc.drain()
        if self.scrubber is not None:
            await self.scrubber.stop()
            self.scrubber = None
        self._cancel_background()
        store = self.store
        try:
            if store is not None:
                await store.close()
        finally:
            self.store = None
            if self._own_fs:
                self.fs.close()
                self._fs_closed = True

    def crash(self) -> None:
        """Abandon at once (in-process kill -9): no sync; pending adds fail."""
        if self._state == STOPPED:
            return
        self._set_state(STOPPED, "crashed")
        self._cancel_background()
        if self.store is not None:
            from pybk.errors import BookieUnavailableError

            self.store.abandon(BookieUnavailableError(f"bookie {self.bookie_id} crashed"))
        self.store = None
        if self._own_fs:  # release the sync thread and descriptors (waits for an in-flight
            self.fs.close()  # fdatasync at most; nothing new is written)
            self._fs_closed = True

    def _cancel_background(self) -> None:
        if self.unknown_ledgers is not None:  # adds and fences waiting for the metadata
            self.unknown_ledgers.abandon(BookieStoppedError(f"bookie {self.bookie_id} stopped"))
        if self._gc_remote is not None:
            self._gc_remote.stop()
            self._gc_remote = None
        if self.gc is not None:
            self.gc.abandon()
        if self.scrubber is not None:
            self.scrubber.abandon()
            self.scrubber = None
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        self._polls.wake_all()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("bookie %s background task failed: %s", self.bookie_id, task.exception())

    # ================================================================== disk / journal state

    def _on_journal_fatal(self, exc: BaseException) -> None:
        self._journal_failed = True
        self._journal_reason = f"journal failed, writes disabled until restart: {exc}"
        self._refresh_state(self._journal_reason)
        self._polls.wake_all()

    def _on_write_error(self, exc: OSError) -> None:
        if exc.errno == errno.ENOSPC:
            self._disk_full = True
            self._refresh_state(f"disk full (ENOSPC) writing the journal: {exc}")
        elif exc.errno in (errno.EMFILE, errno.ENFILE):
            log.warning("bookie %s: the journal is short of file descriptors (%s); "
                        "it retries after the next batch", self.bookie_id, exc)
            if self.on_descriptors_exhausted is not None:
                try:
                    self.on_descriptors_exhausted(exc)
                except Exception:  # a listener's bug must not break the bookie
                    log.exception("on_descriptors_exhausted listener failed")
        else:
            log.warning("bookie %s: journal write failed: %s", self.bookie_id, exc)

    def disk_usage(self) -> tuple[int, int]:
        return self.fs.disk_usage(self.data_dir)

    @property
    def disk_full(self) -> bool:
        """Read-only because of the disk (recoverable by freeing space)."""
        return self._disk_full

    @property
    def journal_failed(self) -> bool:
        """Read-only for good (until a restart)."""
        return self._journal_failed

    def _check_disk(self) -> None:
        if self._state == STOPPED:
            return
        try:
            free, total = self.disk_usage()
        except OSError as exc:
            log.warning("bookie %s: disk usage check failed: %s", self.bookie_id, exc)
            return
        used = 1.0 - free / total if total > 0 else 1.0
        high, low = self.config.disk_usage_threshold, self.config.disk_usage_low_water
        if not self._disk_full and used >= high:
            self._disk_full = True
            self._refresh_state(
                f"disk usage {used:.0%} above the {high:.0%} watermark")
        elif self._disk_full and used < low:
            self._disk_full = False
            self._refresh_state(
                f"disk usage {used:.0%} back below the {low:.0%} low-water mark")
        if self.gc is not None and (self._disk_full or used >= self.config.gc_disk_pressure):
            self.gc.disk_pressure()  # collect and compact now (a no-op while a run is on)

    def _disk_timer(self) -> None:
        if self._state == STOPPED:
            return
        self._check_disk()
        loop = asyncio.get_running_loop()
        self._timers = [t for t in self._timers if not t.cancelled()]
        self._timers.append(loop.call_later(self.config.disk_check_interval, self._disk_timer))

    def check_disk(self) -> str:
        """Check the disk usage now (tests, operators); returns the state."""
        self._check_disk()
        return self._state

    def _checkpoint_timer(self) -> None:
        if self._state == STOPPED or self.store is None:
            return
        store = self.store
        if store.journal.failed is None and store.journal.position != self._last_cp_pos:
            self._last_cp_pos = store.journal.position
            self._spawn(store.checkpoint())
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(self.config.checkpoint_interval,
                                            self._checkpoint_timer))

    # ================================================================== requests

    def _store(self) -> LedgerStorage:
        if self.store is None or self._state == STOPPED:
            raise BookieStoppedError(f"bookie {self.bookie_id} is stopped")
        return self.store

    async def handle(self, request: Request) -> Response:
        """Answer one request (never raises for request-level errors)."""
        if self.stats is not None and not isinstance(request, AddRequest | AddBatchRequest):
            return await self._handle_timed(request, self.stats)  # (adds: add_request times)
        return await self._handle(request)

    async def _handle_timed(self, request: Request, stats: BookieStats) -> Response:
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await self._handle(request)
        elapsed = loop.time() - started
        ok = response.status == _OK
        if isinstance(request, ReadRequest):
            if request.previous_lac is not None and request.timeout > 0:
                stats.long_polls += 1  # its latency is how long it waited: not a read's
            else:
                body = getattr(response, "body", None)
                stats.reads += 1
                if ok:
                    stats.read_bytes += len(body) if body is not None else 0
                    stats.read_latency.observe(elapsed)
                else:
                    stats.read_errors += 1
            if request.fence:
                stats.fences += 1
        elif isinstance(request, ReadBatchRequest):
            entries = getattr(response, "entries", ())
            good = [body for _, status, body in entries if status == _OK and body]
            stats.reads += len(entries) or 1
            stats.read_bytes += sum(len(b) for b in good)
            stats.read_errors += (len(entries) - len(good)) if ok else 1
            if ok:
                stats.read_latency.observe(elapsed, max(1, len(entries)))
        elif isinstance(request, FenceRequest):
            stats.fences += 1
        return response

    async def _handle(self, request: Request) -> Response:
        if self._state == STOPPED or self.store is None:
            return error_response(request, Status.UNAVAILABLE,
                                  f"bookie {self.bookie_id} is stopped")
        try:
            if isinstance(request, AddRequest | AddBatchRequest):
                outcome: asyncio.Future[AddOutcome] = (
                    asyncio.get_running_loop().create_future())
                self.add_request(request, outcome.set_result)
                return add_response(request, await outcome)
            if isinstance(request, ReadRequest):
                return await self._read(request)
            if isinstance(request, ReadBatchRequest):
                return self._read_batch(request)
            if isinstance(request, ReadLacRequest):
                return self._read_lac(request)
            if isinstance(request, WriteLacRequest):
                return await self._write_lac(request)
            if isinstance(request, FenceRequest):
                return await self._fence(request)
            if isinstance(request, ForceRequest):
                return await force_reply(self.deferred, self._store(), request)
            if isinstance(request, ListEntriesRequest):
                st = self._store()
                return ListEntriesResponse(_OK, request.ledger_id,
                                           st.ranges(request.ledger_id))
            if isinstance(request, BookieInfoRequest):
                return self._info()
            return error_response(request, Status.BAD_REQUEST,
                                  f"{type(request).__name__} is not served by a bookie")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self._error_reply(request, exc)

    def _error_reply(self, request: Request, exc: BaseException) -> Response:
        """The response for a request that failed with ``exc`` (:func:`pybk.errors.status_of`,
        the one mapping for every path)."""
        if isinstance(exc, BKError):
            return error_response(request, status_of(exc), str(exc))
        # never crash the bookie on one request; an exception nobody expected is a finding
        self._remote_error("unexpected errors handling requests",
                           f"{type(exc).__name__}: {exc} on {request!r:.200}", exc)
        return error_response(request, status_of(exc), f"unexpected {type(exc).__name__}: {exc}")

    async def _fence(self, req: FenceRequest) -> FenceResponse:
        store = self._store()
        await fence_checked(self.unknown_ledgers, store, req.ledger_id, req.master_key)
        return FenceResponse(_OK, req.ledger_id, lac=store.lac(req.ledger_id))

    async def _write_lac(self, req: WriteLacRequest) -> WriteLacResponse:
        store = self._store()
        if self._journal_failed or self._disk_full:
            raise ReadOnlyBookieError(f"bookie {self.bookie_id} is read-only: {self._reason}")
        await store.write_lac(req.ledger_id, req.lac, req.body, req.master_key)
        return WriteLacResponse(_OK, req.ledger_id)

    def _info(self) -> BookieInfoResponse:
        try:
            free, total = self.disk_usage()
        except OSError as exc:
            raise IOBookieError(f"disk usage: {exc}") from None
        return BookieInfoResponse(_OK, self.bookie_id, free, total, self._state,
                                  state_message(self._reason, self.store))

    def _check(self) -> None:
        """Assert invariants (stateful tests)."""
        if self.store is not None:
            self.store._check()
        assert self._state in (WRITABLE, READ_ONLY, STOPPED)
        if self._state == WRITABLE:
            assert not self._journal_failed and not self._disk_full


__all__ = ["Bookie"]
