"""The auditor: finds under-replicated ledgers and marks them (BookKeeper's ``Auditor``).

One auditor acts at a time per cluster (the elected one, see :mod:`pybk.ops.autorecovery`).
It runs two checks and marks what they find with
:meth:`~pybk.metadata.base.MetadataStore.mark_under_replicated` (the ledger and the bookies
it lacks), then bumps the marks counter the replication workers watch (listed in
docs/internals.md, "pybk/ops/auditor.py").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

from pybk.client.context import ClientContext
from pybk.client.quorum import Quorums
from pybk.errors import BKError, DigestMismatchError, NoSuchLedgerError, UnauthorizedError
from pybk.metadata.base import LedgerMetadata, Watch
from pybk.ops.config import AutoRecoveryConfig, AutoRecoveryStats
from pybk.ops.fragments import fragments
from pybk.ops.replicator import LedgerAccess, ledger_access
from pybk.ops.settings import AutoRecoverySettings
from pybk.runtime.eventloop import gather
from pybk.wire import (
    ListEntriesRequest,
    ListEntriesResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    Status,
)

__all__ = ["Auditor", "bookie_index", "holds_all", "merged_ranges", "read_all_metadata"]

log = logging.getLogger(__name__)

_ABSENT = frozenset({Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER})
_DAMAGED = frozenset({Status.IO_ERROR, Status.CORRUPT, Status.DIGEST_MISMATCH})
#: metadata reads in flight while indexing every ledger
_READ_WINDOW = 64
#: entries asked for in one batched read of a scrub
_SCRUB_BATCH = 512
#: seconds within which a lost bookie's delay counts as passed
_SLACK = 0.001


async def read_all_metadata(ctx: ClientContext) -> list[LedgerMetadata]:
    """Every ledger's metadata (ledgers deleted while listing are skipped)."""
    ids = await ctx.store.list_ledgers()
    out: list[LedgerMetadata] = []

    async def read(lid: int) -> LedgerMetadata | None:
        try:
            return await ctx.store.read_ledger(lid)
        except NoSuchLedgerError:
            return None

    for start in range(0, len(ids), _READ_WINDOW):
        for md in await gather(*map(read, ids[start:start + _READ_WINDOW])):
            if md is not None:
                out.append(md)
    return out


def bookie_index(mds: Sequence[LedgerMetadata]) -> dict[str, set[int]]:
    """Bookie id -> ids of the ledgers whose ensembles name it (``BookieLedgerIndexer``)."""
    index: dict[str, set[int]] = {}
    for md in mds:
        for ensemble in md.ensembles.values():
            for bookie in ensemble:
                index.setdefault(bookie, set()).add(md.ledger_id)
    return index


def merged_ranges(held: Iterable[tuple[int, int]]) -> list[list[int]]:
    """The ranges ``(first, last)`` a bookie listed (any order, maybe overlapping or
    adjacent), sorted and merged: ``[[first, last], ...]``, disjoint and ascending."""
    merged: list[list[int]] = []
    for a, b in sorted(held):
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def holds_all(held: Iterable[tuple[int, int]], entries: Sequence[int]) -> bool:
    """Do the ranges ``(first, last)`` a bookie listed (any order, maybe overlapping) cover
    every id of ``entries`` (ascending, distinct)? The ranges are merged, then the ids inside
    each are counted by bisection: a replica's thousands of ids are not each tested against
    every range."""
    merged = merged_ranges(held)
    inside = 0
    for a, b in merged:
        inside += bisect_right(entries, b) - bisect_left(entries, a)
    return inside == len(entries)


class Auditor:
    """Runs the checks while its task runs (the caller cancels it when leadership goes)."""

    def __init__(self, ctx: ClientContext, settings: AutoRecoverySettings,
                 config: AutoRecoveryConfig, stats: AutoRecoveryStats) -> None:
        self.ctx = ctx
        self.settings = settings
        self.config = config
        self.stats = stats
        self._wake = asyncio.Event()
        #: bookie -> loop time it was first seen missing
        self.lost_since: dict[str, float] = {}
        self._seen_requests = -1

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        watches: list[Watch] = [self.ctx.store.watch_bookies(self.wake),
                                *self.settings.watch(self.wake)]
        interval = self.config.ledger_check_interval
        next_ledger_check = loop.time() + interval if interval > 0 else float("inf")
        self._seen_requests = await self.settings.audit_requests()
        established = False
        try:
            while True:
                self._wake.clear()
                next_due = float("inf")
                try:
                    requests = await self.settings.audit_requests()
                    forced = requests != self._seen_requests
                    if forced:
                        log.info("auditor: audit requested")
                    next_due = await self.check_bookies(force=forced)
                    if forced or loop.time() + _SLACK >= next_ledger_check:
                        await self.check_ledgers()
                        if interval > 0:
                            next_ledger_check = loop.time() + interval
                    self._seen_requests = requests  # served only once both checks ran
                    self.stats.audit_request_served = max(
                        self.stats.audit_request_served, requests)
                except BKError as exc:  # a store or network fault: try again soon
                    self.stats.last_error = f"audit: {type(exc).__name__}: {exc}"
                    log.warning("auditor: check failed: %s", exc)
                    next_due = min(loop.time() + self.config.retry_backoff, next_due)
                if not established:
                    # the first check may have run before the store's watches were
                    # established (a polling backend, a ZooKeeper watch on its way): once
                    # they are, look once more, so that nothing between the two is left to
                    # the periodic check (the watch guarantee covers it too; this is a
                    # second line for backends that only approach it)
                    established = True
                    if await self.ctx.store.sync_watches():
                        log.info("auditor: watches established; checking again")
                        continue
                wait = min(next_due, next_ledger_check) - loop.time()
                wait = min(max(wait, 0.0), self.config.bookie_check_interval)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):  # (no task per wait, as wait_for)
                        await self._wake.wait()
        finally:
            for w in watches:
                w.cancel()

    # -- bookie check --------------------------------------------------------------------------

    async def check_bookies(self, *, force: bool = False) -> float:
        """Mark the ledgers of every lost bookie whose delay has passed; returns the loop
        time the next pending one becomes due (infinity when none is pending)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.stats.audits += 1
        self.stats.bookie_checks += 1
        live = {r.bookie_id for r in await self.ctx.store.list_bookies()}
        index = bookie_index(await read_all_metadata(self.ctx))
        delay = await self.settings.lost_bookie_recovery_delay()
        if delay is None:
            delay = self.config.lost_bookie_recovery_delay
        now = loop.time()
        missing = set(index) - live
        for bookie in list(self.lost_since):
            if bookie not in missing:
                del self.lost_since[bookie]  # back (a restart), or named by no ledger
        marks = await self.ctx.store.list_under_replicated()
        next_due = float("inf")
        newly = 0
        for bookie in sorted(missing):
            since = self.lost_since.setdefault(bookie, now)
            if not force and now - since + _SLACK < delay:  # (due within 1 ms: due now)
                next_due = min(next_due, since + delay)
                continue
            for lid in sorted(index[bookie]):
                if bookie not in marks.get(lid, ()):
                    await self.ctx.store.mark_under_replicated(lid, [bookie])
                    marks.setdefault(lid, []).append(bookie)
                    newly += 1
            if newly:
                log.info("auditor: bookie %s lost; marked its ledgers", bookie)
        if newly:
            self.stats.ledgers_marked += newly
            await self.settings.marks_added()
        self.stats.under_replicated = len(marks)
        self.stats.durations["bookie_check"] = loop.time() - started
        return next_due

    # -- ledger check --------------------------------------------------------------------------

    async def check_ledgers(self) -> int:
        """Look at every replica of every closed fragment; mark what is absent or damaged.
        Returns the number of ledgers marked."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.stats.ledger_checks += 1
        live = {r.bookie_id for r in await self.ctx.store.list_bookies()}
        marked = 0
        for md in await read_all_metadata(self.ctx):
            bad = await self.check_ledger(md, live)
            if bad:
                await self.ctx.store.mark_under_replicated(md.ledger_id, sorted(bad))
                marked += 1
        if marked:
            self.stats.ledgers_marked += marked
            await self.settings.marks_added()
        self.stats.durations["ledger_check"] = loop.time() - started
        self.stats.ledger_checks_completed += 1
        return marked

    async def check_ledger(self, md: LedgerMetadata, live: set[str]) -> set[str]:
        """The live bookies of ``md``'s closed fragments that lack or damaged an entry they
        should hold."""
        quorums = Quorums(md.ensemble_size, md.write_quorum, md.ack_quorum)
        try:
            access: LedgerAccess | None = ledger_access(md, self.config.passwords)
        except UnauthorizedError:
            access = None  # presence only: the digests cannot be checked
        bad: set[str] = set()
        for fragment in fragments(md):
            if fragment.is_open or fragment.is_empty:
                continue
            for index, bookie in enumerate(fragment.ensemble):
                if bookie not in live or bookie in bad:
                    continue
                entries = list(fragment.entries_of(index, quorums))
                if not entries:
                    continue
                if not await self._replica_sound(md, access, bookie, entries):
                    bad.add(bookie)
        return bad

    async def _replica_sound(self, md: LedgerMetadata, access: LedgerAccess | None,
                             bookie: str, entries: list[int]) -> bool:
        how = self.config.ledger_check
        if how == "entries":
            try:
                reply = await self.ctx.transport.send(
                    bookie, ListEntriesRequest(md.ledger_id), self.ctx.config.read_timeout)
            except BKError:
                return True  # unreachable: not a verdict
            if reply.status in _ABSENT:
                return False
            if reply.status != Status.OK or not isinstance(reply, ListEntriesResponse):
                return True
            return holds_all(reply.ranges, entries)
        if how == "scrub":
            return await self._scrub(md, access, bookie, entries)
        return await self._read_each(md, access, bookie, sorted({entries[0], entries[-1]}))

    async def _scrub(self, md: LedgerMetadata, access: LedgerAccess | None, bookie: str,
                     entries: list[int]) -> bool:
        """Every entry, digest checked, asked for in batched reads: one request per replica
        (more only when the bookie's answer is full), each entry judged as its own read
        would be. What a batch leaves unanswered is read entry by entry."""
        left = entries
        while left:
            try:
                reply = await self.ctx.transport.send(
                    bookie, ReadBatchRequest(md.ledger_id, left[:_SCRUB_BATCH]),
                    self.ctx.config.read_timeout)
            except BKError:
                return True  # unreachable: not a verdict
            if reply.status in _ABSENT or reply.status in _DAMAGED:
                log.info("auditor: ledger %s on %s: %s", md.ledger_id, bookie,
                         Status(reply.status).name)
                return False
            if reply.status != Status.OK or not isinstance(reply, ReadBatchResponse) \
                    or not reply.entries:
                break  # refused as a whole, or nothing fitted: entry by entry
            for entry_id, status, body in reply.entries:
                if not self._entry_sound(md, access, bookie, entry_id, status, body):
                    return False
            left = left[len(reply.entries):]
        return await self._read_each(md, access, bookie, left) if left else True

    async def _read_each(self, md: LedgerMetadata, access: LedgerAccess | None, bookie: str,
                         wanted: list[int]) -> bool:
        for entry_id in wanted:
            try:
                reply = await self.ctx.transport.send(
                    bookie, ReadRequest(md.ledger_id, entry_id), self.ctx.config.read_timeout)
            except BKError:
                return True
            body = reply.body if isinstance(reply, ReadResponse) else None
            if reply.status == Status.OK and not isinstance(reply, ReadResponse):
                continue
            if not self._entry_sound(md, access, bookie, entry_id, reply.status, body):
                return False
        return True

    @staticmethod
    def _entry_sound(md: LedgerMetadata, access: LedgerAccess | None, bookie: str,
                     entry_id: int, status: Status, body: bytes | None) -> bool:
        """One entry's answer: False when it is absent, damaged or fails its digest."""
        if status in _ABSENT or status in _DAMAGED:
            log.info("auditor: ledger %s entry %d on %s: %s", md.ledger_id, entry_id,
                     bookie, Status(status).name)
            return False
        if status != Status.OK:
            return True
        if body is None:
            return False
        if access is not None:
            try:
                access.digest.verify(body, entry_id)
            except DigestMismatchError:
                log.info("auditor: ledger %s entry %d on %s: bad digest", md.ledger_id,
                         entry_id, bookie)
                return False
        return True
