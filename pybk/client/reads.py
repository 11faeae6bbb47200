"""Reading entries and LACs from a ledger's bookies: replica failover, speculative reads,
batched range reads, LAC reads that cover every write set (never fencing).

An entry is read from its write set, one replica at a time: on an error or a digest
mismatch the next replica is asked, and when ``speculative_read_delay`` passes without an
answer the next one is asked too (the first valid copy wins). A corrupted replica is
therefore skipped, never returned. :class:`pybk.client.reader.ReadHandle` is built on these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pybk.client.quorum import Answer, CoverageSet, Quorums
from pybk.client.sticky import StickyReads
from pybk.errors import (
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TimeoutError,
    error_for_status,
)
from pybk.metadata.base import LedgerMetadata
from pybk.runtime import sometimes
from pybk.runtime.eventloop import gather, wait
from pybk.wire import (
    DecodedEntry,
    DigestManager,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Response,
    Status,
)

if TYPE_CHECKING:
    from pybk.client.context import ClientContext
    from pybk.stats import ClientStats

# (a module constant: each ``Status.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_OK = Status.OK

__all__ = [
    "LedgerEntry",
    "consume",
    "drop_pending",
    "in_order",
    "lac_answer",
    "quorums_of",
    "read_entry",
    "read_lac_covered",
    "read_range",
    "summarize",
]

_SPECULATIVE = sometimes.point(
    "client.speculative_read", "a read asked the next replica because the first was slow")


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One entry of a ledger, as returned by reads."""

    ledger_id: int
    entry_id: int
    data: bytes


_ABSENT = (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)
_new = object.__new__
_le_slots: Any = vars(LedgerEntry)  # (frozen: fields set through the slot descriptors)
_set_le_ledger = _le_slots["ledger_id"].__set__
_set_le_entry = _le_slots["entry_id"].__set__
_set_le_data = _le_slots["data"].__set__


def _ledger_entry(d: DecodedEntry) -> LedgerEntry:
    """``LedgerEntry(d.ledger_id, d.entry_id, d.payload)`` without the dataclass's
    ``__init__`` (once per entry read)."""
    entry: LedgerEntry = _new(LedgerEntry)
    _set_le_ledger(entry, d.ledger_id)
    _set_le_entry(entry, d.entry_id)
    _set_le_data(entry, d.payload)
    return entry


def consume(fut: asyncio.Future[Response]) -> None:
    """Done-callback that retrieves a result nobody waits for any more."""
    if not fut.cancelled():
        fut.exception()


def in_order(
    done: set[asyncio.Future[Response]], sent: Mapping[asyncio.Future[Response], object]
) -> list[asyncio.Future[Response]]:
    """``done`` in the order the requests were sent. ``asyncio.wait`` returns a set, whose
    order depends on memory addresses; the simulator needs the same order every run."""
    return [fut for fut in sent if fut in done]


def drop_pending(futures: Iterable[asyncio.Future[Response]]) -> None:
    """Stop caring about replies still in flight (their errors are consumed, not logged).

    A done future is consumed at once: ``add_done_callback`` on it would go through
    ``loop.call_soon``, which fails if this runs while a coroutine is finalized after its
    loop closed (e.g. a simulation that ended with reads in flight)."""
    for fut in futures:
        if fut.done():
            consume(fut)
        else:
            fut.add_done_callback(consume)


def quorums_of(md: LedgerMetadata) -> Quorums:
    return Quorums(md.ensemble_size, md.write_quorum, md.ack_quorum)


def summarize(ledger_id: int, entry_id: int, errors: list[BKError]) -> BKError:
    """The error a failed entry read raises: the most telling of the replicas' errors."""
    detail = "; ".join(str(e) for e in errors) or "no replica asked"
    where = f"ledger {ledger_id} entry {entry_id}"
    if errors and all(isinstance(e, NoSuchEntryError | NoSuchLedgerError) for e in errors):
        return NoSuchEntryError(f"{where}: no replica holds it ({detail})")
    for e in errors:
        if not isinstance(e, NoSuchEntryError | NoSuchLedgerError | DigestMismatchError):
            return type(e)(f"{where}: every replica failed ({detail})")
    return DigestMismatchError(f"{where}: no replica returned a valid copy ({detail})")


def _replicas(ctx: ClientContext, md: LedgerMetadata, entry_id: int,
              sticky: StickyReads | None = None) -> list[str]:
    """The replicas of an entry in the order a read tries them: the write set's, the sticky
    bookie's first (sticky reads), or the placement policy's when it prefers a local rack."""
    ensemble = md.ensemble_for(entry_id)
    if sticky is not None:
        return sticky.order(ensemble)
    replicas = [ensemble[i] for i in quorums_of(md).write_set(entry_id)]
    policy = ctx.policy
    if policy.local_rack is not None:
        return policy.read_order(replicas, ctx.topology)
    return replicas


async def read_entry(
    ctx: ClientContext,
    md: LedgerMetadata,
    digest: DigestManager,
    entry_id: int,
    first_request: asyncio.Future[Response] | None = None,
    *,
    start: int = 0,
    errors: list[BKError] | None = None,
    sticky: StickyReads | None = None,
) -> DecodedEntry:
    """Read one entry from its write set with failover and speculative reads.

    ``first_request``: a read already sent to the first replica. ``start``: the replica to
    ask first (the batched fast path already heard from the ones before it: their
    ``errors``). ``sticky``: the handle's sticky reads (told of the bookies that fail)."""
    order = _replicas(ctx, md, entry_id, sticky)
    cfg = ctx.config
    request = ReadRequest(md.ledger_id, entry_id)
    pending: dict[asyncio.Future[Response], str] = {}
    errors = [] if errors is None else errors
    next_index = min(start, len(order) - 1)
    if first_request is not None:
        pending[first_request] = order[0]
        next_index = 1

    def ask_next() -> None:
        nonlocal next_index
        bookie = order[next_index]
        next_index += 1
        pending[ctx.transport.send(bookie, request, cfg.read_timeout)] = bookie

    if first_request is None:
        ask_next()
    try:
        while True:
            spec = cfg.speculative_read_delay
            wait_for = spec if spec > 0 and next_index < len(order) else None
            done, _ = await wait(list(pending), wait_for, first=True)
            if not done:
                if sticky is not None:  # slow: the next read starts at the next bookie
                    sticky.failed(md.ensemble_for(entry_id), order[next_index - 1])
                ask_next()  # speculative: the current replica is slow
                _SPECULATIVE()
                if ctx.stats is not None:
                    ctx.stats.speculative_reads += 1
                continue
            for fut in in_order(done, pending):
                bookie = pending.pop(fut)
                try:
                    response = fut.result()
                except BKError as exc:
                    errors.append(exc)
                    if sticky is not None:
                        sticky.failed(md.ensemble_for(entry_id), bookie)
                    continue
                if response.status == _OK:
                    assert isinstance(response, ReadResponse)
                    if response.body is None:
                        errors.append(DigestMismatchError(f"{bookie}: OK without a body"))
                        continue
                    try:
                        return digest.verify(response.body, entry_id)
                    except DigestMismatchError as exc:
                        errors.append(DigestMismatchError(f"{bookie}: {exc}"))
                        continue
                errors.append(
                    error_for_status(response.status, f"{bookie}: {response.message}".strip())
                )
                if sticky is not None:
                    sticky.failed(md.ensemble_for(entry_id), bookie)
            if not pending:
                if next_index >= len(order):
                    raise summarize(md.ledger_id, entry_id, errors)
                ask_next()
    finally:
        drop_pending(pending)


async def read_range(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, first: int, last: int,
    sticky: StickyReads | None = None,
) -> tuple[list[LedgerEntry], int]:
    """Read entries ``first..last`` (inclusive), a batch at a time, in order: (the entries,
    the highest LAC their bodies carry, -1 if none). ``sticky``: the reader's sticky reads."""
    stats = ctx.stats
    if stats is not None:
        return await _timed_read_range(ctx, stats, md, digest, first, last, sticky)
    return await _read_range(ctx, md, digest, first, last, sticky)


async def _read_range(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, first: int, last: int,
    sticky: StickyReads | None = None,
) -> tuple[list[LedgerEntry], int]:
    step = ctx.config.read_batch_size
    if last - first < step:
        return await _read_batch(ctx, md, digest, first, last, sticky)
    out: list[LedgerEntry] = []
    top = -1
    for start in range(first, last + 1, step):
        stop = min(last, start + step - 1)
        got, lac = await _read_batch(ctx, md, digest, start, stop, sticky)
        out += got
        top = max(top, lac)
    return out, top


async def _timed_read_range(
    ctx: ClientContext, stats: ClientStats, md: LedgerMetadata, digest: DigestManager,
    first: int, last: int, sticky: StickyReads | None,
) -> tuple[list[LedgerEntry], int]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        out = await _read_range(ctx, md, digest, first, last, sticky)
    except BKError:
        stats.read_errors += 1
        raise
    stats.reads += 1
    stats.read_entries += len(out[0])
    stats.read_latency.observe(loop.time() - started)
    return out


async def _read_batch(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, first: int, last: int,
    sticky: StickyReads | None = None,
) -> tuple[list[LedgerEntry], int]:
    """Fast path: each entry's first replica is asked for all its entries of the range in one
    :class:`~pybk.wire.ReadBatchRequest` (one request and one answer per bookie, not per
    entry); an entry whose answer is missing, late or bad goes through :func:`read_entry`
    (failover to the next replica, speculative reads). (the entries, their highest LAC)"""
    cfg = ctx.config
    ledger_id = md.ledger_id
    wanted: dict[str, list[int]] = {}
    starts = sorted(md.ensembles)
    e_size = md.ensemble_size
    local = ctx.policy.local_rack is not None  # (then each entry's preferred replica first)
    for k, fragment_start in enumerate(starts):
        lo = max(first, fragment_start)
        hi = min(last, starts[k + 1] - 1) if k + 1 < len(starts) else last
        if hi < lo:
            continue
        ensemble = md.ensembles[fragment_start]
        if sticky is not None:  # every bookie holds every entry: all from the sticky one
            wanted.setdefault(sticky.order(ensemble)[0], []).extend(range(lo, hi + 1))
            continue
        if local:
            for e in range(lo, hi + 1):
                wanted.setdefault(_replicas(ctx, md, e)[0], []).append(e)
            continue
        for slot in range(min(e_size, hi - lo + 1)):  # ids of one first replica: a stride
            e0 = lo + slot
            wanted.setdefault(ensemble[e0 % e_size], []).extend(range(e0, hi + 1, e_size))
    sent: dict[asyncio.Future[Response], tuple[str, list[int]]] = {}
    for bookie, ids in wanted.items():
        fut = ctx.transport.send(bookie, ReadBatchRequest(ledger_id, ids), cfg.read_timeout)
        sent[fut] = (bookie, ids)
    spec = cfg.speculative_read_delay
    try:
        await wait(list(sent), spec if spec > 0 else None)
    except BaseException:  # cancelled: nobody will look at these answers
        drop_pending(sent)
        raise
    out: list[LedgerEntry | None] = [None] * (last - first + 1)
    retry: dict[int, tuple[int, list[BKError]]] = {}  # entry -> (replica to start at, errors)
    top = -1
    for fut, (bookie, ids) in sent.items():
        problem = _batch_problem(fut, bookie)
        if problem is not None:  # late, unreachable, or refused as a whole: next replica
            for e in ids:
                retry[e] = (1, [problem])
            continue
        response = fut.result()
        assert isinstance(response, ReadBatchResponse)
        top = max(top, _take_answer(digest, bookie, ids, response.entries, out, first, retry))
    drop_pending(sent)
    if retry:
        ordered = sorted(retry)
        if sticky is not None:  # the sticky bookie failed these: move on, read from the next
            asked = {e: b for b, ids in wanted.items() for e in ids}
            for e in (e for e in ordered if retry[e][0]):  # (0: the answer just stopped short)
                sticky.failed(md.ensemble_for(e), asked[e])
                break
            retry = {e: (0 if sticky.order(md.ensemble_for(e))[0] != asked[e] else start, errs)
                     for e, (start, errs) in retry.items()}
        again = await gather(*(
            read_entry(ctx, md, digest, e, start=retry[e][0], errors=retry[e][1], sticky=sticky)
            for e in ordered))
        for e, decoded in zip(ordered, again, strict=True):
            out[e - first] = _ledger_entry(decoded)
            top = max(top, decoded.lac)
    return out, top  # type: ignore[return-value]  # (every id was asked of one bookie, and
    # its entry is set by its answer or by the failover read, which raises if it cannot)


def _take_answer(
    digest: DigestManager, bookie: str, ids: list[int],
    answered: tuple[tuple[int, Status, bytes | None], ...], out: list[LedgerEntry | None],
    first: int, retry: dict[int, tuple[int, list[BKError]]],
) -> int:
    """Verify one bookie's answer to a batched read of ``ids``: each good entry put in
    ``out`` (at its id minus ``first``), each other one in ``retry`` (from the next replica,
    with why; from this one again when the answer stopped before it). The highest LAC the
    good entries carry.

    The read path's hot loop (once per entry read): for the default digest (CRC32C) the entry
    is checked with :meth:`DigestManager.crc_checked` and made without a
    :class:`DecodedEntry`; a body that does not check out goes through ``verify`` for its
    error."""
    ledger_id = digest.ledger_id
    verify, crc_checked, ok = digest.verify, digest.crc_checked, _OK
    new, set_ledger, set_entry, set_data = _new, _set_le_ledger, _set_le_entry, _set_le_data
    top = -1
    for expected, (eid, status, body) in zip(ids, answered, strict=False):  # (answers: a prefix)
        if eid != expected:
            retry[expected] = (1, [DigestMismatchError(
                f"{bookie}: answered entry {eid} in place of entry {expected}")])
            continue
        if status != ok or body is None:
            said = ("no entry" if status in _ABSENT or status == ok
                    else f"{Status(status).name} for entry")
            retry[eid] = (1, [error_for_status(status, f"{bookie}: {said} {eid}")])
            continue
        good = crc_checked(body, eid)
        if good is not None:
            entry: LedgerEntry = new(LedgerEntry)
            set_ledger(entry, ledger_id)
            set_entry(entry, eid)
            set_data(entry, good[3])
            out[eid - first] = entry
            if good[1] > top:
                top = good[1]
            continue
        try:
            decoded = verify(body, eid)
        except DigestMismatchError as exc:
            retry[eid] = (1, [DigestMismatchError(f"{bookie}: {exc}")])
            continue
        out[eid - first] = _ledger_entry(decoded)
        if decoded.lac > top:
            top = decoded.lac
    for e in ids[len(answered):]:  # the bookie stopped early (its answer was full): ask again
        retry[e] = (0, [])
    return top


def _batch_problem(fut: asyncio.Future[Response], bookie: str) -> BKError | None:
    """Why a batched read's answer cannot be used as a whole (None: it can)."""
    if not fut.done():
        return TimeoutError(f"{bookie}: no answer within the speculative read delay")
    if fut.cancelled():
        return BookieUnavailableError(f"{bookie}: read cancelled")
    exc = fut.exception()
    if exc is not None:
        return exc if isinstance(exc, BKError) else BookieUnavailableError(repr(exc))
    response = fut.result()
    if not isinstance(response, ReadBatchResponse):
        return BookieUnavailableError(f"{bookie}: answered a batched read with {response.op}")
    if response.status != _OK:
        return error_for_status(response.status, f"{bookie}: {response.message}".strip())
    return None


def lac_answer(
    digest: DigestManager, response: ReadLacResponse | ReadResponse
) -> tuple[Answer, int]:
    """Classify one LAC reply: (answer, LAC it proves)."""
    if response.status in _ABSENT:
        return Answer.ABSENT, -1
    if response.status != _OK:
        return Answer.UNKNOWN, -1
    lac = -1
    try:
        if isinstance(response, ReadLacResponse):
            if response.lac_body:
                lac = max(lac, digest.verify_lac(response.lac_body))
            if response.last_entry_body:
                lac = max(lac, digest.verify(response.last_entry_body).lac)
        elif response.body:
            lac = max(lac, digest.verify(response.body).lac)
    except DigestMismatchError:
        return Answer.UNKNOWN, -1
    return Answer.OK, lac


async def read_lac_covered(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager
) -> int:
    """The LAC as the last ensemble's bookies know it, once every write set is covered.

    Never below ``last_ensemble_start - 1`` (earlier fragments are fully confirmed).
    Raises BookieUnavailableError (or the replies' error) when coverage is impossible.
    """
    q = quorums_of(md)
    ensemble = md.last_ensemble
    coverage = CoverageSet(q)
    request = ReadLacRequest(md.ledger_id)
    futures = {
        ctx.transport.send(b, request, ctx.config.read_timeout): i for i, b in enumerate(ensemble)
    }
    pending = set(futures)
    best = -1
    errors: list[str] = []
    try:
        while pending and not coverage.covered():
            done, pending = await wait(pending, first=True)
            for fut in in_order(done, futures):
                index = futures[fut]
                try:
                    response = fut.result()
                except BKError as exc:
                    errors.append(f"{ensemble[index]}: {exc}")
                    continue
                assert isinstance(response, ReadLacResponse | ReadResponse)
                answer, lac = lac_answer(digest, response)
                if answer is Answer.UNKNOWN:
                    errors.append(f"{ensemble[index]}: {Status(response.status).name}")
                coverage.answer(index, answer)
                best = max(best, lac)
    finally:
        drop_pending(pending)
    if not coverage.covered():
        raise BookieUnavailableError(
            f"ledger {md.ledger_id}: cannot read the LAC, too few bookies of "
            f"{list(ensemble)} answered ({'; '.join(errors)})"
        )
    return max(best, md.last_ensemble_start - 1)
