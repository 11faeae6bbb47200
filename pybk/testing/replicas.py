"""Checks that every entry of a ledger is where its metadata says, readable, on live bookies.

The property auto-recovery restores (and the simulator's re-replication invariant): every
entry of every *closed* ledger is held, with a good digest, by each of the ``Qw`` bookies of
its write set in the ledger's current metadata, and each of those bookies is live.
:func:`replication_problems` asks every replica directly (no failover, no speculation), so a
missing copy cannot hide behind a good one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

from pybk.client.quorum import Quorums
from pybk.errors import BKError, DigestMismatchError, NoSuchLedgerError, UnauthorizedError
from pybk.metadata.base import LedgerMetadata, MetadataStore
from pybk.ops.fragments import fragments
from pybk.ops.replicator import ledger_access
from pybk.transport.base import Transport
from pybk.wire import ReadBatchRequest, ReadBatchResponse, ReadRequest, ReadResponse, Status

__all__ = ["ledger_replication_problems", "replication_problems"]

#: entries asked for in one batched read
_BATCH = 512


async def ledger_replication_problems(
    md: LedgerMetadata, transport: Transport, live: Collection[str], *,
    passwords: Sequence[bytes] = (b"",), timeout: float = 10.0, window: int = 128,
) -> list[str]:
    """What is wrong with one closed ledger's replicas (empty: nothing). Each replica is
    asked for all its entries at once, in batched reads (``window``: unused, kept for
    callers that pass it)."""
    if not md.is_closed:
        return []
    try:
        digest = ledger_access(md, passwords).digest
    except UnauthorizedError as exc:
        return [str(exc)]
    quorums = Quorums(md.ensemble_size, md.write_quorum, md.ack_quorum)
    problems: list[str] = []
    wanted: list[tuple[str, int]] = []
    for fragment in fragments(md):
        for index, bookie in enumerate(fragment.ensemble):
            entries = list(fragment.entries_of(index, quorums)) if not fragment.is_open else []
            if entries and bookie not in live:
                problems.append(f"ledger {md.ledger_id} fragment {fragment.first}: slot {index} "
                                f"names {bookie}, which is not live ({len(entries)} entries)")
                continue
            wanted.extend((bookie, e) for e in entries)
    # each bookie asked for all its entries of the ledger in batched reads (more requests
    # only when its answer is full), every entry judged on its own
    by_bookie: dict[str, list[int]] = {}
    for bookie, entry_id in wanted:
        by_bookie.setdefault(bookie, []).append(entry_id)
    found: dict[tuple[str, int], str] = {}
    answers = await asyncio.gather(
        *(_read_replica(transport, md.ledger_id, bookie, ids, timeout)
          for bookie, ids in by_bookie.items()), return_exceptions=True)
    for (bookie, ids), answer in zip(by_bookie.items(), answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, BKError):
                raise answer
            for entry_id in ids:
                found[(bookie, entry_id)] = f"{type(answer).__name__}: {answer}"
            continue
        for entry_id, (status, body, message) in answer.items():
            if status != Status.OK or body is None:
                found[(bookie, entry_id)] = f"{Status(status).name} {message}"
                continue
            try:
                digest.verify(body, entry_id)
            except DigestMismatchError as exc:
                found[(bookie, entry_id)] = str(exc)
    for bookie, entry_id in wanted:
        if (bookie, entry_id) in found:
            problems.append(f"ledger {md.ledger_id} entry {entry_id} on {bookie}: "
                            f"{found[(bookie, entry_id)]}")
    return problems


async def _read_replica(transport: Transport, ledger_id: int, bookie: str, ids: list[int],
                        timeout: float) -> dict[int, tuple[Status, bytes | None, str]]:
    """What ``bookie`` answers for each entry of ``ids``: (status, body, message)."""
    out: dict[int, tuple[Status, bytes | None, str]] = {}
    left = ids
    while left:
        reply = await transport.send(bookie, ReadBatchRequest(ledger_id, left[:_BATCH]), timeout)
        if reply.status != Status.OK or not isinstance(reply, ReadBatchResponse):
            for entry_id in left:
                out[entry_id] = (reply.status, None, reply.message)
            return out
        if not reply.entries:
            break  # nothing fitted in an answer: one entry at a time
        for entry_id, status, body in reply.entries:
            out[entry_id] = (status, body, "")
        left = left[len(reply.entries):]
    for entry_id in left:
        single = await transport.send(bookie, ReadRequest(ledger_id, entry_id), timeout)
        body = single.body if isinstance(single, ReadResponse) else None
        out[entry_id] = (single.status, body, single.message)
    return out


async def replication_problems(
    store: MetadataStore, transport: Transport, *, passwords: Sequence[bytes] = (b"",),
    ledgers: Collection[int] | None = None, timeout: float = 10.0,
) -> list[str]:
    """:func:`ledger_replication_problems` for every closed ledger (or those given)."""
    live = {r.bookie_id for r in await store.list_bookies()}
    problems: list[str] = []
    for lid in sorted(ledgers if ledgers is not None else await store.list_ledgers()):
        try:
            md = await store.read_ledger(lid)
        except NoSuchLedgerError:
            continue
        problems.extend(await ledger_replication_problems(
            md, transport, live, passwords=passwords, timeout=timeout))
    return problems
