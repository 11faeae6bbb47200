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

from pybk.errors import BKError, DigestMismatchError, NoSuchLedgerError, UnauthorizedError
from pybk.metadata.base import LedgerMetadata, MetadataStore
from pybk.ops.fragments import fragments
from pybk.ops.replicator import ledger_access
from pybk.protocol import ReadRequest, ReadResponse, Status
from pybk.replication.quorum import Quorums
from pybk.transport.base import Transport

__all__ = ["ledger_replication_problems", "replication_problems"]


async def ledger_replication_problems(
    md: LedgerMetadata, transport: Transport, live: Collection[str], *,
    passwords: Sequence[bytes] = (b"",), timeout: float = 10.0, window: int = 128,
) -> list[str]:
    """What is wrong with one closed ledger's replicas (empty: nothing)."""
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
    for start in range(0, len(wanted), window):
        chunk = wanted[start:start + window]
        replies = await asyncio.gather(
            *(transport.send(b, ReadRequest(md.ledger_id, e), timeout) for b, e in chunk),
            return_exceptions=True)
        for (bookie, entry_id), reply in zip(chunk, replies, strict=True):
            where = f"ledger {md.ledger_id} entry {entry_id} on {bookie}"
            if isinstance(reply, BaseException):
                if not isinstance(reply, BKError):
                    raise reply
                problems.append(f"{where}: {type(reply).__name__}: {reply}")
            elif reply.status != Status.OK or not isinstance(reply, ReadResponse) \
                    or reply.body is None:
                problems.append(f"{where}: {Status(reply.status).name} {reply.message}")
            else:
                try:
                    digest.verify(reply.body, entry_id)
                except DigestMismatchError as exc:
                    problems.append(f"{where}: {exc}")
    return problems


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
