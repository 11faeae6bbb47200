"""Ledger recovery: fence the last ensemble, find the end, write it back, close.

BookKeeper's ``ReadOnlyLedgerHandle.recover`` / ``LedgerRecoveryOp``, step by step (listed in
docs/internals.md, "pybk/client/recovery.py").
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final

from pybk.client.quorum import Answer, CoverageSet, EntryState, RecoveryReadDecision
from pybk.client.reads import drop_pending, in_order, lac_answer, quorums_of, read_entry
from pybk.client.writer import AddPipeline
from pybk.errors import (
    BKError,
    DigestMismatchError,
    LedgerRecoveryError,
    UnauthorizedError,
    UnexpectedConditionError,
)
from pybk.errors import TimeoutError as BKTimeoutError
from pybk.metadata.base import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from pybk.runtime import sometimes
from pybk.runtime.eventloop import gather, wait
from pybk.wire import LAST_ENTRY, DecodedEntry, DigestManager, ReadRequest, ReadResponse, Status

if TYPE_CHECKING:
    from pybk.client.context import ClientContext

__all__ = [
    "RECOVERY_READS_DONT_FENCE",
    "RECOVERY_TIMEOUT_AS_ABSENT",
    "fence_and_read_lac",
    "mark_in_recovery",
    "recover",
    "recovery_read",
]

log = logging.getLogger(__name__)

_ABSENT = sometimes.point(
    "client.recovery_entry_proven_absent",
    "recovery proved an entry absent from Qw - Qa + 1 negative answers of its write set")

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``):
#: recovery's forward reads (after the LAC) do not fence (BookKeeper issue #2614)
RECOVERY_READS_DONT_FENCE: Final = "recovery_reads_dont_fence"
#: mutation switch: a recovery read that times out counts as "absent" (a negative), not as
#: "don't know": a bookie that holds the entry but is slow to answer truncates the ledger
RECOVERY_TIMEOUT_AS_ABSENT: Final = "recovery_timeout_as_absent"


async def fence_and_read_lac(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, master_key: bytes
) -> int:
    """Fence the last ensemble and return the highest LAC heard, once every write set is
    covered. Raises LedgerRecoveryError when coverage cannot be reached,
    UnauthorizedError at once on a wrong master key."""
    q = quorums_of(md)
    ensemble = md.last_ensemble
    coverage = CoverageSet(q)
    request = ReadRequest(md.ledger_id, LAST_ENTRY, fence=True, master_key=master_key)
    futures = {
        ctx.transport.send(b, request, ctx.config.read_timeout): i for i, b in enumerate(ensemble)
    }
    pending = set(futures)
    best = -1
    valid = False
    errors: list[str] = []
    try:
        while pending and not (valid and coverage.covered()):
            done, pending = await wait(pending, first=True)
            for fut in in_order(done, futures):
                index = futures[fut]
                try:
                    response = fut.result()
                except BKError as exc:
                    errors.append(f"{ensemble[index]}: {exc}")
                    continue
                if response.status == Status.UNAUTHORIZED:
                    raise UnauthorizedError(
                        f"ledger {md.ledger_id}: bookie {ensemble[index]} refused to fence "
                        f"(wrong password): {response.message}"
                    )
                assert isinstance(response, ReadResponse)
                answer, lac = lac_answer(digest, response)
                if answer is Answer.UNKNOWN:
                    errors.append(
                        f"{ensemble[index]}: {Status(response.status).name} {response.message}"
                    )
                    continue
                valid = True
                coverage.answer(index, answer)
                best = max(best, lac)
    finally:
        drop_pending(pending)
    if not (valid and coverage.covered()):
        raise LedgerRecoveryError(
            f"ledger {md.ledger_id}: could not fence enough bookies of {list(ensemble)} "
            f"({'; '.join(errors)}); the ledger stays IN_RECOVERY"
        )
    return best


async def recovery_read(
    ctx: ClientContext,
    md: LedgerMetadata,
    digest: DigestManager,
    master_key: bytes,
    entry_id: int,
) -> DecodedEntry | None:
    """Read ``entry_id`` from its whole write set, fencing; None when proven absent."""
    q = quorums_of(md)
    ensemble = md.ensemble_for(entry_id)
    decision = RecoveryReadDecision(q)
    fence = RECOVERY_READS_DONT_FENCE not in ctx.config.mutations
    timeout_is_absent = RECOVERY_TIMEOUT_AS_ABSENT in ctx.config.mutations
    request = ReadRequest(
        md.ledger_id, entry_id, fence=fence, master_key=master_key if fence else b""
    )
    futures = {
        ctx.transport.send(ensemble[i], request, ctx.config.read_timeout): i
        for i in q.write_set(entry_id)
    }
    pending = set(futures)
    errors: list[str] = []
    try:
        while pending:
            done, pending = await wait(pending, first=True)
            for fut in in_order(done, futures):
                index = futures[fut]
                bookie = ensemble[index]
                try:
                    response = fut.result()
                except BKError as exc:
                    errors.append(f"{bookie}: {exc}")
                    if timeout_is_absent and isinstance(exc, BKTimeoutError):  # broken build
                        if decision.answer(index, Answer.ABSENT) is EntryState.ABSENT:
                            return None
                        continue
                    decision.answer(index, Answer.UNKNOWN)
                    continue
                if response.status == Status.OK and isinstance(response, ReadResponse):
                    if response.body is not None:
                        try:
                            return digest.verify(response.body, entry_id)
                        except DigestMismatchError as exc:
                            errors.append(f"{bookie}: {exc}")
                    decision.answer(index, Answer.UNKNOWN)
                elif response.status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
                    errors.append(f"{bookie}: {Status(response.status).name}")
                    if decision.answer(index, Answer.ABSENT) is EntryState.ABSENT:
                        _ABSENT()
                        return None
                else:
                    errors.append(f"{bookie}: {Status(response.status).name} {response.message}")
                    decision.answer(index, Answer.UNKNOWN)
    finally:
        drop_pending(pending)
    raise LedgerRecoveryError(
        f"ledger {md.ledger_id}: cannot tell whether entry {entry_id} exists "
        f"({'; '.join(errors)}); the ledger stays IN_RECOVERY"
    )


async def mark_in_recovery(ctx: ClientContext, ledger_id: int) -> LedgerMetadata:
    """Step 1: OPEN -> IN_RECOVERY (CAS). Returns the metadata after the update."""

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        if md.state == OPEN:
            return md.with_changes(state=IN_RECOVERY)
        return None

    return await ctx.store.update_ledger(ledger_id, transform)


async def recover(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, master_key: bytes
) -> LedgerMetadata:
    """Recover and close ledger ``md.ledger_id``; returns the closed metadata."""
    md = await mark_in_recovery(ctx, md.ledger_id)
    if md.state == CLOSED:
        return md
    start = md
    ledger_id = md.ledger_id
    lac = max(await fence_and_read_lac(ctx, md, digest, master_key), md.last_ensemble_start - 1)
    log.info("ledger %s: recovery starts after LAC %d", ledger_id, lac)

    pipeline: AddPipeline | None = None
    writes: list[asyncio.Future[int]] = []
    next_id = lac + 1
    batch = ctx.config.recovery_read_batch_size
    done = False
    while not done:
        ids = list(range(next_id, next_id + batch))
        results = await gather(
            *(recovery_read(ctx, start, digest, master_key, e) for e in ids),
            return_exceptions=True,
        )
        for entry_id, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException):
                raise result
            if result is None:
                done = True
                break
            if pipeline is None:
                base_length = result.length - len(result.payload)
                pipeline = AddPipeline(
                    ctx, start, digest, master_key, recovery=True, lac=lac, length=base_length
                )
            assert result.entry_id == entry_id
            writes.append(pipeline.push_framed(entry_id, _reframe(digest, result), result.length))
        next_id += batch

    if pipeline is None:
        # nothing after the LAC: the length is the one recorded in entry LAC itself
        length = 0 if lac < 0 else (await read_entry(ctx, start, digest, lac)).length
        last, ensembles = lac, dict(start.ensembles)
    else:
        await gather(*writes)
        last, length, ensembles = pipeline.lac, pipeline.lac_length, pipeline.ensembles

    def close(current: LedgerMetadata) -> LedgerMetadata | None:
        if current.state == CLOSED:
            return None  # someone else closed it: adopt their result
        if current.state != IN_RECOVERY:
            raise UnexpectedConditionError(
                f"ledger {ledger_id} is {current.state} while being recovered"
            )
        tail = start.last_ensemble_start
        if sorted(current.ensembles) != sorted(start.ensembles) or \
                current.ensembles[tail] != start.ensembles[tail]:
            raise UnexpectedConditionError(
                f"ledger {ledger_id}: an ensemble was added while it was being recovered"
            )
        # earlier fragments may have been re-replicated meanwhile (auto-recovery swaps a
        # lost bookie there): keep those, take the recovered tail from the write-back
        merged = {k: v for k, v in current.ensembles.items() if k < tail}
        merged.update({k: v for k, v in ensembles.items() if k >= tail})
        return current.with_changes(
            state=CLOSED, last_entry_id=last, length=length, ensembles=merged
        )

    closed = await ctx.store.update_ledger(ledger_id, close)
    log.info(
        "ledger %s: recovered, closed at entry %d (length %d)",
        ledger_id, closed.last_entry_id, closed.length,
    )
    return closed


def _reframe(digest: DigestManager, entry: DecodedEntry) -> bytes:
    """The exact bytes of a recovered entry (frame is deterministic: same header, same
    payload, same digest), so write-backs are byte-identical duplicates (R10)."""
    return digest.frame(entry.entry_id, entry.lac, entry.length, entry.payload)
