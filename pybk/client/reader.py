"""The read path: entries with replica failover, LAC reads, long polls, tailing.

An entry is read from its write set, one replica at a time: on an error or a digest
mismatch the next replica is asked, and when ``speculative_read_delay`` passes without an
answer the next one is asked too (the first valid copy wins). A corrupted replica is
therefore skipped, never returned.

A non-recovery LAC read asks every bookie of the last ensemble for its LAC and completes
once the answers cover every write set (:class:`~pybk.client.quorum.CoverageSet`);
it never fences, so the writer is not disturbed.

A long poll (``read_last_add_confirmed_and_entry``) asks the last ensemble's bookies to
answer once their LAC passes the entry before the one wanted, with that entry when they hold
it: one bookie at a time by default (BookKeeper's ``parallel=false``: the next one on a
failure, an early empty answer or silence past the timeout), or all of them at once
(``ClientConfig.long_poll_parallel``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pybk.client.quorum import Answer, CoverageSet, Quorums
from pybk.errors import (
    BKError,
    BookieUnavailableError,
    DigestMismatchError,
    EntryNotConfirmedError,
    NoSuchEntryError,
    NoSuchLedgerError,
    TimeoutError,
    error_for_status,
)
from pybk.metadata.base import LedgerMetadata
from pybk.runtime.eventloop import gather, wait
from pybk.wire import (
    LAST_ENTRY,
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

__all__ = [
    "LedgerEntry",
    "ReadHandle",
    "consume",
    "drop_pending",
    "in_order",
    "quorums_of",
    "read_entry",
    "read_lac_covered",
    "read_range",
    "summarize",
]


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One entry of a ledger, as returned by reads."""

    ledger_id: int
    entry_id: int
    data: bytes


_ABSENT = (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER)
#: what one long-poll answer says (besides the entry itself): the LAC covers the entry but
#: the answer did not bring it; the LAC is not there yet; an error or a bad body
_CONFIRMED, _EMPTY, _FAILED = object(), object(), object()
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


def _replicas(ctx: ClientContext, md: LedgerMetadata, entry_id: int) -> list[str]:
    """The replicas of an entry in the order a read tries them: the write set's, or the
    placement policy's when it prefers a local rack."""
    ensemble = md.ensemble_for(entry_id)
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
) -> DecodedEntry:
    """Read one entry from its write set with failover and speculative reads.

    ``first_request``: a read already sent to the first replica. ``start``: the replica to
    ask first (the batched fast path already heard from the ones before it: their
    ``errors``)."""
    order = _replicas(ctx, md, entry_id)
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
                ask_next()  # speculative: the current replica is slow
                if ctx.stats is not None:
                    ctx.stats.speculative_reads += 1
                continue
            for fut in in_order(done, pending):
                bookie = pending.pop(fut)
                try:
                    response = fut.result()
                except BKError as exc:
                    errors.append(exc)
                    continue
                if response.status == Status.OK:
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
            if not pending:
                if next_index >= len(order):
                    raise summarize(md.ledger_id, entry_id, errors)
                ask_next()
    finally:
        drop_pending(pending)


async def read_range(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, first: int, last: int
) -> tuple[list[LedgerEntry], int]:
    """Read entries ``first..last`` (inclusive), a batch at a time, in order: (the entries,
    the highest LAC their bodies carry, -1 if none)."""
    stats = ctx.stats
    if stats is not None:
        return await _timed_read_range(ctx, stats, md, digest, first, last)
    return await _read_range(ctx, md, digest, first, last)


async def _read_range(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, first: int, last: int
) -> tuple[list[LedgerEntry], int]:
    step = ctx.config.read_batch_size
    if last - first < step:
        return await _read_batch(ctx, md, digest, first, last)
    out: list[LedgerEntry] = []
    top = -1
    for start in range(first, last + 1, step):
        stop = min(last, start + step - 1)
        got, lac = await _read_batch(ctx, md, digest, start, stop)
        out += got
        top = max(top, lac)
    return out, top


async def _timed_read_range(
    ctx: ClientContext, stats: ClientStats, md: LedgerMetadata, digest: DigestManager,
    first: int, last: int,
) -> tuple[list[LedgerEntry], int]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        out = await _read_range(ctx, md, digest, first, last)
    except BKError:
        stats.read_errors += 1
        raise
    stats.reads += 1
    stats.read_entries += len(out[0])
    stats.read_latency.observe(loop.time() - started)
    return out


async def _read_batch(
    ctx: ClientContext, md: LedgerMetadata, digest: DigestManager, first: int, last: int
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
        again = await gather(*(
            read_entry(ctx, md, digest, e, start=retry[e][0], errors=retry[e][1])
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
    verify, crc_checked, ok = digest.verify, digest.crc_checked, Status.OK
    new, set_ledger, set_entry, set_data = _new, _set_le_ledger, _set_le_entry, _set_le_data
    top = -1
    for expected, (eid, status, body) in zip(ids, answered, strict=False):  # (answers: a prefix)
        if eid != expected:
            retry[expected] = (1, [DigestMismatchError(
                f"{bookie}: answered entry {eid} in place of entry {expected}")])
            continue
        if status != ok or body is None:
            retry[eid] = (1, [error_for_status(status, f"{bookie}: no entry {eid}")])
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
    if response.status != Status.OK:
        return error_for_status(response.status, f"{bookie}: {response.message}".strip())
    return None


def lac_answer(
    digest: DigestManager, response: ReadLacResponse | ReadResponse
) -> tuple[Answer, int]:
    """Classify one LAC reply: (answer, LAC it proves)."""
    if response.status in _ABSENT:
        return Answer.ABSENT, -1
    if response.status != Status.OK:
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


class ReadHandle:
    """A ledger opened for reading (after recovery, or without it).

    ``last_add_confirmed`` is what this handle knows; reads beyond it are refused unless
    unconfirmed reads are asked for. It rises as entries are read (their piggybacked LAC),
    on :meth:`read_last_add_confirmed`, on long polls and when the ledger is closed.
    """

    def __init__(
        self, ctx: ClientContext, metadata: LedgerMetadata, digest: DigestManager, lac: int
    ) -> None:
        self._ctx = ctx
        self._md = metadata
        self._digest = digest
        self._lac = metadata.last_entry_id if metadata.is_closed else lac
        self._closed = False
        #: how far a sequential long poll's first bookie is moved on: one more after each
        #: poll that ended without the entry
        self._poll_turn = 0

    @property
    def id(self) -> int:
        return self._md.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._md

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def is_closed(self) -> bool:
        """Is the *ledger* closed (sealed), as far as this handle knows?"""
        return self._md.is_closed

    @property
    def length(self) -> int:
        return self._md.length

    def _raise_lac(self, lac: int) -> None:
        if not self._md.is_closed and lac > self._lac:
            self._lac = lac

    def _check_range(self, first: int, last: int) -> None:
        for name, value in (("first", first), ("last", last)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, not {value!r}")
        if first < 0:
            raise ValueError(f"first must be >= 0, got {first}")
        if last < first:
            raise ValueError(f"last ({last}) must be >= first ({first})")

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` inclusive; ``last`` must be <= the last add confirmed."""
        self._check_range(first, last)
        if last > self._lac:
            raise EntryNotConfirmedError(
                f"ledger {self.id} has no confirmed entry {last}: its last add confirmed is "
                f"{self._lac}"
            )
        return await self._read(first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` without the LAC check (they may not be confirmed yet)."""
        self._check_range(first, last)
        if self._md.is_closed and last > self._md.last_entry_id:
            raise NoSuchEntryError(
                f"ledger {self.id} is closed at entry {self._md.last_entry_id}; "
                f"entry {last} does not exist"
            )
        return await self._read(first, last)

    async def _read(self, first: int, last: int) -> list[LedgerEntry]:
        try:
            entries, lac = await read_range(self._ctx, self._md, self._digest, first, last)
        except BKError:
            # the writer may have moved entries to a new ensemble since we last looked
            before = dict(self._md.ensembles)
            if self._md.is_closed or dict((await self._refresh_metadata()).ensembles) == before:
                raise
            entries, lac = await read_range(self._ctx, self._md, self._digest, first, last)
        self._raise_lac(lac)
        return entries

    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies for the LAC (covering every write set) and return it."""
        if self._md.is_closed:
            return self._lac
        md = await self._refresh_metadata()
        if md.is_closed:
            return self._lac
        self._raise_lac(await read_lac_covered(self._ctx, self._md, self._digest))
        return self._lac

    async def _refresh_metadata(self) -> LedgerMetadata:
        md = await self._ctx.store.read_ledger(self.id)
        self._md = md
        if md.is_closed:
            self._lac = md.last_entry_id
        return md

    async def read_last_add_confirmed_and_entry(
        self, entry_id: int, timeout: float = 1.0, *, parallel: bool | None = None
    ) -> LedgerEntry | None:
        """Long poll: wait (up to ``timeout``) until ``entry_id`` is confirmed, then return it.

        Returns None on timeout, or when the ledger is closed before ``entry_id``.
        ``parallel``: ask every bookie of the last ensemble at once, or one at a time
        (None: the client's ``ClientConfig.long_poll_parallel``).
        """
        if entry_id < 0:
            raise ValueError(f"entry_id must be >= 0, got {entry_id}")
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout}")
        if parallel is not None and not isinstance(parallel, bool):
            raise TypeError(f"parallel must be a bool or None, not {parallel!r}")
        if entry_id <= self._lac:
            return (await self._read(entry_id, entry_id))[0]
        if self._md.is_closed:
            return None
        if parallel if parallel is not None else self._ctx.config.long_poll_parallel:
            return await self._poll_parallel(entry_id, timeout)
        return await self._poll_sequential(entry_id, timeout)

    def _poll_request(self, entry_id: int, timeout: float) -> ReadRequest:
        return ReadRequest(self._md.ledger_id, entry_id, previous_lac=entry_id - 1,
                           timeout=timeout)

    def _poll_reply(self, fut: asyncio.Future[Response], entry_id: int) -> object:
        """What one long-poll answer says: the entry (a :class:`LedgerEntry`),
        :data:`_CONFIRMED` (the LAC it brought covers ``entry_id``, without the entry),
        :data:`_EMPTY` (an answer whose LAC is not there yet) or :data:`_FAILED` (an error,
        a bad body). Raises the handle's LAC to what the answer proves."""
        try:
            response = fut.result()
        except BKError:
            return _FAILED
        if response.status != Status.OK or not isinstance(response, ReadResponse):
            return _FAILED
        self._raise_lac(response.lac)
        if response.body is not None:
            try:
                decoded = self._digest.verify(response.body)
            except DigestMismatchError:
                return _FAILED
            self._raise_lac(decoded.lac)
            if decoded.entry_id == entry_id and entry_id <= self._lac:
                return LedgerEntry(self.id, entry_id, decoded.payload)
        return _CONFIRMED if entry_id <= self._lac else _EMPTY

    async def _poll_parallel(self, entry_id: int, timeout: float) -> LedgerEntry | None:
        """The long poll sent to every bookie of the last ensemble at once."""
        request = self._poll_request(entry_id, timeout)
        futures = {
            self._ctx.transport.send(b, request, timeout + self._ctx.config.read_timeout): b
            for b in self._md.last_ensemble
        }
        pending = set(futures)
        try:
            while pending:
                done, pending = await wait(pending, first=True)
                for fut in in_order(done, futures):
                    got = self._poll_reply(fut, entry_id)
                    if got is _CONFIRMED:
                        return (await self._read(entry_id, entry_id))[0]
                    if isinstance(got, LedgerEntry):
                        return got
        finally:
            # every reply, also those answered in the same batch as the one returned
            drop_pending(futures)
        return None

    async def _poll_sequential(self, entry_id: int, timeout: float) -> LedgerEntry | None:
        """The long poll sent to one bookie of the last ensemble at a time.

        The first asked is the first of the write set of ``entry_id + 1`` (the earliest to
        hear, piggybacked on that entry, that ``entry_id`` is confirmed, and, with a write
        quorum above 1, a holder of ``entry_id`` itself, which then comes in the answer).
        The next bookie is asked, with what is left of ``timeout`` (none left: a probe
        answered at once), when the one asked fails, answers without the entry before the
        timeout (a fenced ledger, a bookie stopping or holding too many polls), or has not
        answered ``speculative_read_delay`` after the timeout (a silent bookie: the
        transport's own timeout comes ``read_timeout`` later). An answer without the entry at
        the timeout ends the poll (None); this handle's next poll then starts one bookie
        further on, so a bookie whose view of the LAC lags cannot hold a tail back."""
        md = self._md
        ensemble = md.last_ensemble
        size = len(ensemble)
        first = (entry_id + (1 if md.write_quorum > 1 else 0) + self._poll_turn) % size
        order = [ensemble[(first + i) % size] for i in range(size)]
        ctx = self._ctx
        if ctx.policy.local_rack is not None:
            order = ctx.policy.read_order(order, ctx.topology)
        cfg = ctx.config
        spec = cfg.speculative_read_delay
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pending: dict[asyncio.Future[Response], str] = {}
        asked = 0
        speculate_at = 0.0

        def ask_next() -> None:
            nonlocal asked, speculate_at
            now = loop.time()
            wait = max(deadline - now, 0.0)
            bookie = order[asked]
            asked += 1
            pending[ctx.transport.send(bookie, self._poll_request(entry_id, wait),
                                       wait + cfg.read_timeout)] = bookie
            speculate_at = now + wait + spec

        ask_next()
        try:
            while pending:
                wait_for = None
                if spec > 0 and asked < size:
                    wait_for = max(speculate_at - loop.time(), 0.0)
                done, _ = await wait(list(pending), wait_for, first=True)
                if not done:
                    ask_next()  # speculative: the bookie asked is silent past its timeout
                    if ctx.stats is not None:
                        ctx.stats.speculative_reads += 1
                    continue
                for fut in in_order(done, pending):
                    del pending[fut]
                    got = self._poll_reply(fut, entry_id)
                    if got is _CONFIRMED:
                        return (await self._read(entry_id, entry_id))[0]
                    if isinstance(got, LedgerEntry):
                        return got
                    if got is _EMPTY and loop.time() >= deadline:
                        self._poll_turn += 1
                        return None  # answered at the timeout without it: timed out
                if not pending and asked < size:
                    ask_next()
            self._poll_turn += 1
            return None
        finally:
            drop_pending(pending)

    async def tail(self, start: int = 0) -> AsyncGenerator[LedgerEntry, None]:
        """Every entry from ``start`` on, following the writer; ends when the ledger closes.

        Long polls follow the writer; one the bookies answer at once without the entry (a
        fenced ledger whose recovery has not closed it yet, bookies stopping) is followed by
        polls spaced out exponentially up to the long-poll timeout until something changes
        (an entry, the ledger's metadata), not by polls as fast as the round trips allow."""
        next_id = start
        changed = asyncio.Event()
        watch = self._ctx.store.watch_ledger(self.id, lambda _lid: changed.set())
        loop = asyncio.get_running_loop()
        backoff = 0.0  # before the next poll, after polls answered at once without the entry
        try:
            while True:
                if next_id <= self._lac:
                    backoff = 0.0
                    last = min(self._lac, next_id + self._ctx.config.read_batch_size - 1)
                    for entry in await self._read(next_id, last):
                        yield entry
                        next_id = entry.entry_id + 1
                    continue
                if self._md.is_closed:
                    return
                wake = asyncio.ensure_future(changed.wait())
                try:
                    if backoff:
                        await asyncio.wait({wake}, timeout=backoff)
                    if wake.done():  # the metadata changed meanwhile: look at it first
                        polled = None
                    else:
                        timeout = self._ctx.config.long_poll_timeout
                        started = loop.time()
                        polled = await self._poll_or_change(next_id, timeout, wake)
                        quick = loop.time() - started < timeout / 10
                        if polled is not None:
                            backoff = 0.0
                            yield polled
                            next_id = polled.entry_id + 1
                            continue
                        # answered at once, empty: poll less often until something changes
                        backoff = (min(max(backoff * 2, 0.01), timeout)
                                   if quick and not wake.done() else 0.0)
                finally:
                    wake.cancel()
                changed.clear()
                await self._refresh_metadata()
        finally:
            watch.cancel()

    async def _poll_or_change(self, entry_id: int, timeout: float,
                              wake: asyncio.Future[Any]) -> LedgerEntry | None:
        """A long poll for ``entry_id``, given up when ``wake`` (a metadata change) comes
        first: the entry, or None."""
        poll = asyncio.ensure_future(self.read_last_add_confirmed_and_entry(entry_id, timeout))
        try:
            await asyncio.wait({poll, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not poll.done():
                poll.cancel()
        if not poll.cancelled() and poll.done():
            return poll.result()
        try:
            await poll
        except (asyncio.CancelledError, BKError):
            pass
        return None

    async def read_last_entry_id_unconfirmed(self) -> int:
        """The highest entry id any bookie of the last ensemble holds (no fencing)."""
        md = self._md
        request = ReadRequest(md.ledger_id, LAST_ENTRY)
        best = -1
        for bookie in md.last_ensemble:
            try:
                response = await self._ctx.transport.send(
                    bookie, request, self._ctx.config.read_timeout
                )
            except BKError:
                continue
            ok = response.status == Status.OK and isinstance(response, ReadResponse)
            if ok and isinstance(response, ReadResponse) and response.body:
                try:
                    best = max(best, self._digest.verify(response.body).entry_id)
                except DigestMismatchError:
                    continue
        return best

    async def close(self) -> None:
        """Release the handle (local only: a reader never changes the ledger)."""
        self._closed = True

    async def __aenter__(self) -> ReadHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<ReadHandle {self.id} lac={self._lac} state={self._md.state}>"
