"""Re-replication of one ledger: copy what a lost (or damaged) bookie held, then update the
ensemble (BookKeeper's ``LedgerFragmentReplicator`` + the worker's ledger logic).

For each slot of the ledger that names a bookie of its under-replication mark
(:func:`~pybk.ops.fragments.plan_repairs`) (listed in docs/internals.md, "pybk/ops/replicator.py").
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Final

from pybk.client.batching import batch_spans
from pybk.client.context import ClientContext
from pybk.client.isolation import placement_for
from pybk.client.placement import writable_nodes
from pybk.client.quorum import Quorums
from pybk.client.reads import summarize
from pybk.client.recovery import recover
from pybk.errors import (
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    LedgerFencedError,
    NoSuchLedgerError,
    UnauthorizedError,
    error_for_status,
    status_of,
)
from pybk.errors import TimeoutError as BKTimeoutError
from pybk.metadata.base import LedgerMetadata
from pybk.ops.fragments import Fragment, Repair, plan_repairs
from pybk.runtime.eventloop import gather
from pybk.wire import (
    AddBatchRequest,
    AddLike,
    AddOutcome,
    AddRequest,
    DigestManager,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    Status,
    master_key,
    outcome_of,
    password_hash,
)

__all__ = [
    "ENSEMBLE_BEFORE_COPY_DURABLE",
    "LedgerAccess",
    "Outcome",
    "RepairResult",
    "ledger_access",
    "repair_ledger",
]

log = logging.getLogger(__name__)

#: mutation switch (a name in ``config.mutations``; registry: ``pybk.testing.mutations``):
#: re-replication swaps the new bookie into the ensemble without waiting for its copies to
#: be acknowledged (durable), so a copy lost on the way leaves entries on too few bookies
ENSEMBLE_BEFORE_COPY_DURABLE: Final = "ensemble_before_copy_durable"

#: statuses that say a replica is damaged rather than unreachable
_DAMAGED = frozenset({Status.IO_ERROR, Status.CORRUPT, Status.DIGEST_MISMATCH})
_ABSENT = frozenset({Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER})


class Outcome(enum.Enum):
    REPAIRED = "repaired"  # every marked slot was repaired
    CLEAN = "clean"  # nothing named a marked bookie (any more)
    DELETED = "deleted"  # the ledger is gone
    DEFERRED = "deferred"  # an open last fragment is inside its grace period


@dataclass
class RepairResult:
    outcome: Outcome
    entries_copied: int = 0
    bytes_copied: int = 0
    slots_replaced: list[tuple[int, int, str, str]] = field(default_factory=list)
    #: (fragment first entry, slot, old bookie, new bookie)


@dataclass(frozen=True)
class LedgerAccess:
    """What touching a ledger's entries takes: its digest and the bookies' master key."""

    digest: DigestManager
    master_key: bytes


def ledger_access(md: LedgerMetadata, passwords: Sequence[bytes] = (b"",)) -> LedgerAccess:
    """The ledger's keys, from its metadata, else from a configured password that matches
    its password hash; UnauthorizedError naming the ledger when neither works."""
    lid = md.ledger_id
    if md.master_key and (md.digest_type != "MAC" or md.mac_key):
        return LedgerAccess(DigestManager.from_mac_key(lid, md.digest_type, md.mac_key),
                            md.master_key)
    for password in passwords:
        if password_hash(password) == md.password_hash:
            return LedgerAccess(DigestManager(lid, md.digest_type, password),
                                master_key(password))
    raise UnauthorizedError(
        f"ledger {lid}: its metadata has no recovery keys and none of the "
        f"{len(passwords)} configured password(s) matches; give auto-recovery its password")


async def read_body(ctx: ClientContext, md: LedgerMetadata, digest: DigestManager,
                    entry_id: int, sources: Sequence[str],
                    errors: Sequence[BKError] = ()) -> bytes:
    """The exact stored bytes of an entry from the first of ``sources`` that returns a copy
    with a good digest (the bytes are copied as they are: duplicates stay identical).
    ``errors``: what replicas asked before said (they count in the error raised)."""
    errors = list(errors)
    request = ReadRequest(md.ledger_id, entry_id)
    for bookie in sources:
        try:
            response = await ctx.transport.send(bookie, request, ctx.config.read_timeout)
        except BKError as exc:
            errors.append(exc)
            continue
        if response.status == Status.OK and isinstance(response, ReadResponse) \
                and response.body is not None:
            try:
                digest.verify(response.body, entry_id)
            except DigestMismatchError as exc:
                errors.append(DigestMismatchError(f"{bookie}: {exc}"))
                continue
            return response.body
        errors.append(error_for_status(response.status, f"{bookie}: {response.message}"))
    raise summarize(md.ledger_id, entry_id, errors)


class _Copier:
    """Copies entries to one target, ``window`` at a time, counting what it moved. The
    entries of a window are read from their first replicas in batched reads (one request per
    source); an entry that did not come back whole fails over entry by entry. They are
    written to the target in batched recovery adds (one request, one journal append and one
    answer for the window's entries, within the client's batch limits), each entry answered
    on its own: one refused fails the copy."""

    def __init__(self, ctx: ClientContext, md: LedgerMetadata, access: LedgerAccess,
                 target: str, window: int) -> None:
        self.ctx = ctx
        self.md = md
        self.access = access
        self.target = target
        self.window = window
        self.entries = 0
        self.bytes = 0

    async def copy(self, entries: Sequence[int], sources_of: dict[int, list[str]]) -> None:
        for start in range(0, len(entries), self.window):
            chunk = entries[start:start + self.window]
            read = await self._read_chunk(chunk, sources_of)
            # the entries the batched reads did not bring whole, each from its next source
            # (a task each only for those)
            good = {e: body for e, body in read.items() if isinstance(body, bytes)}
            again = [e for e in chunk if e not in good]
            if again:
                bodies = await gather(
                    *(self._body(e, read.get(e), sources_of[e]) for e in again),
                    return_exceptions=True)
                for e, body in zip(again, bodies, strict=True):
                    if isinstance(body, BaseException):
                        raise body
                    good[e] = body
            await self._write(chunk, [good[e] for e in chunk])

    async def _read_chunk(self, chunk: Sequence[int], sources_of: dict[int, list[str]],
                          ) -> dict[int, bytes | tuple[int, list[BKError]]]:
        """Each entry's first source is asked for its entries of ``chunk`` in one batched
        read. Per entry: its bytes (a good digest), or where to go on with the entry's own
        reads (the next source after an error, the first when the answer had no room)."""
        lid = self.md.ledger_id
        by_source: dict[str, list[int]] = {}
        for e in chunk:
            if sources_of[e]:
                by_source.setdefault(sources_of[e][0], []).append(e)
        sent = [(source, ids, self.ctx.transport.send(source, ReadBatchRequest(lid, ids),
                                                       self.ctx.config.read_timeout))
                for source, ids in by_source.items()]
        replies = await gather(*(f for _s, _i, f in sent), return_exceptions=True)
        out: dict[int, bytes | tuple[int, list[BKError]]] = {}
        verify = self.access.digest.verify
        for (source, ids, _f), reply in zip(sent, replies, strict=True):
            if isinstance(reply, BaseException):
                if not isinstance(reply, BKError):
                    raise reply
                out.update((e, (1, [reply])) for e in ids)
                continue
            if reply.status != Status.OK or not isinstance(reply, ReadBatchResponse):
                problem = error_for_status(reply.status, f"{source}: {reply.message}")
                out.update((e, (1, [problem])) for e in ids)
                continue
            for e, status, body in reply.entries:
                if status == Status.OK and body is not None:
                    try:
                        verify(body, e)
                    except DigestMismatchError as exc:
                        out[e] = (1, [DigestMismatchError(f"{source}: {exc}")])
                        continue
                    out[e] = body
                else:
                    out[e] = (1, [error_for_status(status, f"{source}: no entry {e}")])
        return out

    async def _body(self, entry_id: int, read: bytes | tuple[int, list[BKError]] | None,
                    sources: list[str]) -> bytes:
        if isinstance(read, bytes):
            return read
        start, errors = read if read is not None else (0, [])
        return await read_body(self.ctx, self.md, self.access.digest, entry_id,
                               sources[start:], errors)

    async def _write(self, entry_ids: Sequence[int], bodies: Sequence[bytes]) -> None:
        """Recovery adds of ``bodies`` (entry ``entry_ids[i]`` is ``bodies[i]``) to the
        target, in batches within the client's limits; raises the first entry's error."""
        cfg = self.ctx.config
        for start, end in batch_spans(bodies, cfg.add_batch_max_entries,
                                      cfg.add_batch_max_bytes):
            await self._add(entry_ids[start:end], bodies[start:end])
            self.entries += end - start
            self.bytes += sum(map(len, bodies[start:end]))

    async def _add(self, entry_ids: Sequence[int], bodies: Sequence[bytes]) -> None:
        lid, key = self.md.ledger_id, self.access.master_key
        request: AddLike = (
            AddRequest(lid, entry_ids[0], key, bodies[0], recovery=True) if len(bodies) == 1
            else AddBatchRequest(lid, key, tuple(entry_ids), tuple(bodies), recovery=True))
        done: asyncio.Future[AddOutcome] = asyncio.get_running_loop().create_future()

        def settle(outcome: AddOutcome) -> None:
            if not done.done():
                done.set_result(outcome)

        self.ctx.transport.add(self.target, request, settle, self.ctx.config.add_timeout)
        outcome = await done
        for index, entry_id in enumerate(entry_ids):
            error = outcome_of(outcome, index)
            if error is not None:
                if isinstance(error, BookieUnavailableError | BKTimeoutError):
                    raise error  # (the target could not be reached: as a send raises)
                raise error_for_status(
                    status_of(error),
                    f"copying entry {entry_id} of ledger {lid} to {self.target}: {error}")


def _sources(fragment: Fragment, quorums: Quorums, index: int, entry_id: int,
             usable: Collection[str]) -> list[str]:
    """The other replicas of ``entry_id`` in its write set, usable ones only."""
    return [fragment.ensemble[i] for i in quorums.write_set(entry_id)
            if i != index and fragment.ensemble[i] in usable]


async def repair_ledger(
    ctx: ClientContext,
    ledger_id: int,
    marked: Collection[str],
    *,
    live: Collection[str],
    grace_over: bool,
    passwords: Sequence[bytes] = (b"",),
    window: int = 64,
) -> RepairResult:
    """Repair every slot of ledger ``ledger_id`` naming a bookie of ``marked`` (see the
    module doc). ``live``: bookies registered now (writable or read-only). Raises on any
    failure (the caller backs off and retries: nothing half done is ever recorded)."""
    result = RepairResult(Outcome.CLEAN)
    try:
        md = await ctx.store.read_ledger(ledger_id)
    except NoSuchLedgerError:
        return RepairResult(Outcome.DELETED)
    # a live bookie of the open last fragment is the writer's business: only a lost one
    # there makes the ledger worth fencing
    repairs = [r for r in plan_repairs(md, marked, live) if r.replace or not r.fragment.is_open]
    if not repairs:
        return result
    access = ledger_access(md, passwords)
    deferred = False
    if any(r.fragment.is_open for r in repairs) and not grace_over:
        deferred = True  # the closed fragments now, the open one after its grace period
    elif any(r.fragment.is_open for r in repairs):
        log.info("ledger %s: its open last fragment names lost %s; recovering (fencing) it",
                 ledger_id, sorted({r.bookie for r in repairs if r.fragment.is_open}))
        try:
            md = await recover(ctx, md, access.digest, access.master_key)
        except NoSuchLedgerError:
            return RepairResult(Outcome.DELETED)
    done: set[tuple[int, int]] = set()
    for _ in range(len(md.ensembles) * md.ensemble_size + 1):
        try:
            md = await ctx.store.read_ledger(ledger_id)
        except NoSuchLedgerError:
            return RepairResult(Outcome.DELETED, result.entries_copied, result.bytes_copied,
                                result.slots_replaced)
        todo = [r for r in plan_repairs(md, marked, live)
                if (r.fragment.first, r.index) not in done and not r.fragment.is_open]
        if not todo:
            break
        repair = todo[0]
        await _repair_slot(ctx, md, access, repair, live, window, result)
        done.add((repair.fragment.first, repair.index))
        result.outcome = Outcome.REPAIRED
    if deferred:
        result.outcome = Outcome.DEFERRED
        return result
    left = [r for r in plan_repairs(md, marked, live) if r.replace]
    if left:  # a racing change, or a lost bookie the writer put in its open fragment
        raise BookieUnavailableError(
            f"ledger {ledger_id}: slots still name lost bookies after repair: "
            f"{[(r.fragment.first, r.index, r.bookie) for r in left]}")
    return result


async def _repair_slot(ctx: ClientContext, md: LedgerMetadata, access: LedgerAccess,
                       repair: Repair, live: Collection[str], window: int,
                       result: RepairResult) -> None:
    quorums = Quorums(md.ensemble_size, md.write_quorum, md.ack_quorum)
    fragment, index = repair.fragment, repair.index
    entries = list(fragment.entries_of(index, quorums))
    usable = set(live) - {repair.bookie}
    if not repair.replace:
        missing, damaged = await _verify(ctx, md, access, repair.bookie, entries)
        if not damaged:
            if not missing:
                return
            copier = _Copier(ctx, md, access, repair.bookie, window)
            try:
                await copier.copy(missing, {e: _sources(fragment, quorums, index, e, usable)
                                            for e in missing})
            except (NoSuchLedgerError, LedgerFencedError):
                # a recovery add is refused only when the bookie deleted the ledger (fenced
                # ledgers take them): it will take no more of its entries
                damaged = missing
            finally:
                result.entries_copied += copier.entries
                result.bytes_copied += copier.bytes
            if not damaged:
                log.info("ledger %s: copied %d missing entries back to %s", md.ledger_id,
                         copier.entries, repair.bookie)
                return
        log.warning("ledger %s: %s cannot serve entries %s; moving slot %d of fragment %d",
                    md.ledger_id, repair.bookie, damaged[:10], index, fragment.first)
    policy = await placement_for(ctx, md.custom_metadata, rereplication=True)
    nodes = await writable_nodes(ctx, policy, exclude=[repair.bookie])
    not_live = [b for b in fragment.ensemble if b not in live]
    target = policy.replace_bookie(
        nodes, fragment.ensemble, index, md.write_quorum, ctx.rng,
        exclude=[repair.bookie, *not_live])
    copier = _Copier(ctx, md, access, target, window)
    sources = {e: _sources(fragment, quorums, index, e, usable) for e in entries}
    if ENSEMBLE_BEFORE_COPY_DURABLE in ctx.config.mutations:  # a deliberately broken build
        task = asyncio.ensure_future(copier.copy(entries, sources))
        task.add_done_callback(_ignore)
    else:
        await copier.copy(entries, sources)
    await _swap(ctx, md.ledger_id, fragment.first, index, repair.bookie, target)
    result.entries_copied += copier.entries
    result.bytes_copied += copier.bytes
    result.slots_replaced.append((fragment.first, index, repair.bookie, target))
    log.info("ledger %s: fragment %d slot %d moved from %s to %s (%d entries copied)",
             md.ledger_id, fragment.first, index, repair.bookie, target, copier.entries)


def _ignore(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


async def _verify(ctx: ClientContext, md: LedgerMetadata, access: LedgerAccess, bookie: str,
                  entries: Sequence[int]) -> tuple[list[int], list[int]]:
    """Read every entry ``bookie`` should hold, in batched reads: (absent ones, damaged
    ones). An unreachable bookie raises (the repair is retried later)."""
    missing: list[int] = []
    damaged: list[int] = []
    for entry_id, status, body, message in await _read_all(ctx, md.ledger_id, bookie,
                                                           list(entries)):
        if status == Status.OK and body is not None:
            try:
                access.digest.verify(body, entry_id)
            except DigestMismatchError:
                damaged.append(entry_id)
        elif status in _ABSENT:
            missing.append(entry_id)
        elif status in _DAMAGED:
            damaged.append(entry_id)
        else:
            raise BookieUnavailableError(
                f"ledger {md.ledger_id}: cannot verify {bookie}: "
                f"{Status(status).name} {message}")
    return missing, damaged


#: entries asked for in one batched read of a verification
_VERIFY_BATCH = 512


async def _read_all(ctx: ClientContext, ledger_id: int, bookie: str, entries: list[int],
                    ) -> list[tuple[int, Status, bytes | None, str]]:
    """What ``bookie`` answers for each of ``entries`` (in their order): batched reads, a
    request refused as a whole answering for each of its entries, and entry by entry what
    no batch answer had room for. BookieUnavailableError when it cannot be asked."""
    out: list[tuple[int, Status, bytes | None, str]] = []
    left = entries
    try:
        while left:
            reply = await ctx.transport.send(
                bookie, ReadBatchRequest(ledger_id, left[:_VERIFY_BATCH]),
                ctx.config.read_timeout)
            if reply.status != Status.OK or not isinstance(reply, ReadBatchResponse):
                asked = left[:_VERIFY_BATCH]
                out.extend((e, reply.status, None, reply.message) for e in asked)
                left = left[len(asked):]
                continue
            if not reply.entries:
                break  # nothing fitted in an answer: one entry at a time
            out.extend((e, status, body, "") for e, status, body in reply.entries)
            left = left[len(reply.entries):]
        for entry_id in left:
            single = await ctx.transport.send(bookie, ReadRequest(ledger_id, entry_id),
                                              ctx.config.read_timeout)
            body = single.body if isinstance(single, ReadResponse) else None
            out.append((entry_id, single.status, body, single.message))
    except BKError as exc:
        raise BookieUnavailableError(
            f"ledger {ledger_id}: cannot verify {bookie}: {exc}") from exc
    return out


async def _swap(ctx: ClientContext, ledger_id: int, first: int, index: int, old: str,
                new: str) -> None:
    """CAS: slot ``index`` of fragment ``first`` from ``old`` to ``new`` (no-op when someone
    changed it already)."""

    def transform(md: LedgerMetadata) -> LedgerMetadata | None:
        ensemble = md.ensembles.get(first)
        if ensemble is None or index >= len(ensemble) or ensemble[index] != old:
            return None
        if not md.is_closed and first == md.last_ensemble_start:
            return None  # the open last fragment is the writer's (never reached: see plan)
        swapped = list(ensemble)
        swapped[index] = new
        ensembles = dict(md.ensembles)
        ensembles[first] = tuple(swapped)
        return md.with_changes(ensembles=ensembles)

    await ctx.store.update_ledger(ledger_id, transform)
