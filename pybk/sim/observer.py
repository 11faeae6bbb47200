"""What a simulated run sees from the outside, recorded in its history for the checker: the
adds clients sent, every answer a bookie produced (delivered or not: an OK add is a durability
promise even if the reply is lost; a read served or found absent), the ensembles and deletions
as the metadata store applied them, and audits of what a bookie holds (after a restart, at the
end, on a scrubber's pass). Apart from the runner (:class:`pybk.sim.runner.SimRun`), which
drives the run: this part only watches it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pybk.errors import BKError, status_of
from pybk.ops.auditor import merged_ranges
from pybk.sim.cluster import SimBookie, SimCluster
from pybk.sim.history import History
from pybk.sim.workload import PASSWORD
from pybk.wire import (
    AddBatchRequest,
    AddLike,
    AddOutcome,
    AddRequest,
    DigestManager,
    ListEntriesRequest,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    Request,
    Response,
    Status,
)

# (a module constant: each ``Status.X`` is a few hundred ns on CPython 3.11, whose enum
# metaclass's ``__getattr__`` takes every class attribute off the fast path)
_OK = Status.OK
_FENCED = Status.FENCED

__all__ = ["RunObserver"]


class RunObserver:
    """Watches one run's cluster (:meth:`watch`) and records what it sees in ``history``;
    ``cover`` counts a coverage marker."""

    def __init__(self, history: History, cover: Callable[[str], None]) -> None:
        self.history = history
        self.cover = cover
        #: ledger entries some client sent an AddRequest for (ever)
        self.sent_adds: set[tuple[int, int]] = set()
        #: ledgers whose metadata was deleted (by anyone: the deleter, a log truncation)
        self.deleted: set[int] = set()
        #: ledger -> the ensembles its metadata named when last recorded in the history
        self._ensembles_seen: dict[int, Mapping[int, tuple[str, ...]]] = {}
        self._digests: dict[int, DigestManager] = {}
        self._served: set[tuple[str, int, int, bytes]] = set()
        self._bodies: set[tuple[str, int, int, bytes]] = set()
        self._cluster: SimCluster | None = None

    def watch(self, cluster: SimCluster) -> None:
        """Observe ``cluster``: bookies as they start, the metadata changes it applies, the
        requests its network carries and the answers its bookies produce."""
        self._cluster = cluster
        cluster.on_bookie_started.append(self._audit_restart)
        cluster.on_meta_applied.append(self._meta_applied)
        network = cluster.network
        network.add_observers.append(self._observe_add)
        network.reply_observers.append(self._observe)
        network.send_observers.append(self._sent)

    def was_sent(self, lid: int, entry: int) -> bool:
        """Did some client ever send an add of ``entry`` of ledger ``lid``?"""
        return (lid, entry) in self.sent_adds

    def _sent(self, client: str, bookie: str, req: Request) -> None:
        kind = type(req)
        if kind is AddRequest:
            self.sent_adds.add((req.ledger_id, req.entry_id))  # type: ignore[union-attr]
        elif kind is AddBatchRequest:  # (a writer's batch: one request, its entries)
            lid = req.ledger_id  # type: ignore[union-attr]
            self.sent_adds.update((lid, e) for e in req.entry_ids)  # type: ignore[union-attr]

    def _meta_applied(self, op: str, key: object) -> None:
        if op in ("create_ledger", "write_ledger") and isinstance(key, int):
            assert self._cluster is not None  # (only the cluster watched calls this)
            try:
                md = self._cluster.store.peek_ledger(key)
            except (KeyError, BKError):
                return
            ens = md.ensembles
            if self._ensembles_seen.get(key) != ens:  # (most writes change other things)
                self._ensembles_seen[key] = ens
                self.history.ensembles(key, md.ensemble_size, md.write_quorum, ens)
            return
        if op == "delete_ledger" and isinstance(key, int) and key not in self.deleted:
            self.deleted.add(key)
            self.history.delete("meta", key, "applied")

    def _observe_add(self, bookie: str, client: str, req: AddLike, outcome: AddOutcome) -> None:
        """A bookie answered an add (a batch: entry by entry, as the single adds it is made
        of): an OK is a durability promise, even if the answer is lost on its way. A
        deferred-sync add's OK is none (it becomes durable on a FORCE: pybk.sim.ledger_modes
        checks those)."""
        if req.deferred_sync:
            return
        lid = req.ledger_id
        ids = (req.entry_id,) if type(req) is AddRequest else req.entry_ids  # type: ignore[union-attr]
        whole = outcome is None or isinstance(outcome, BaseException)
        for i, entry in enumerate(ids):
            result = outcome if whole else outcome[i]  # type: ignore[index]
            if result is None:
                self.history.bookie_acked(bookie, lid, entry, req.recovery)
                if req.recovery:
                    self.cover("recovery_write_back")
            elif status_of(result) == _FENCED:  # type: ignore[arg-type]
                self.cover("add_rejected_by_fenced_bookie")

    def _observe(self, bookie: str, client: str, req: Request, resp: Response) -> None:
        """A bookie answered a request other than an add (a batched read: entry by entry,
        as the single reads it stands for)."""
        kind = type(req)
        if kind is ReadRequest:
            if req.previous_lac is not None:  # type: ignore[union-attr]
                return
            if req.fence:  # type: ignore[union-attr]
                self.cover("fencing_read")
            self._observe_read(bookie, req.ledger_id, req.entry_id,  # type: ignore[union-attr]
                               resp.status, getattr(resp, "body", None), "read")
        elif kind is ReadBatchRequest:
            lid = req.ledger_id  # type: ignore[union-attr]
            if type(resp) is not ReadBatchResponse or resp.status != _OK:
                status = resp.status
                for entry in req.entry_ids:  # type: ignore[union-attr]
                    self._observe_read(bookie, lid, entry, status, None, "read")
                return
            for entry, status, body in resp.entries:
                self._observe_read(bookie, lid, entry, status, body, "read")

    def _observe_read(self, bookie: str, lid: int, entry: int, status: Status,
                      body: bytes | None, how: str) -> None:
        if status == _OK:
            if body is None:
                return
            bodies = self._bodies
            known = len(bodies)
            bodies.add((bookie, lid, entry, body))
            if len(bodies) == known:
                return  # (the same bytes from the same bookie again: nothing new to check)
            digest = self._digests.get(lid)
            if digest is None:  # (CRC32C: the password plays no part)
                digest = self._digests[lid] = DigestManager(lid, "CRC32C", PASSWORD)
            expected = entry if entry >= 0 else None
            good = digest.crc_checked(body, expected)  # (the common case: no object made)
            if good is not None:
                entry_id, payload = good[0], good[3]
            else:
                try:
                    dec = digest.verify(body, expected)
                except Exception:
                    self.history.bookie_served(bookie, lid, entry, None, how)
                    return
                entry_id, payload = dec.entry_id, dec.payload
            served = self._served
            known = len(served)
            served.add((bookie, lid, entry_id, payload))
            if len(served) == known:
                return  # (the same bytes again: nothing new for the checker)
            self.history.bookie_served(bookie, lid, entry_id, payload, how)
        elif status in (Status.NO_SUCH_ENTRY, Status.NO_SUCH_LEDGER):
            if entry >= 0:
                self.history.bookie_absent(bookie, lid, entry, f"{how} {status.name}")
        elif status in (Status.IO_ERROR, Status.CORRUPT, Status.UNKNOWN_LEDGER_STATE):
            self.cover(f"bookie_read_{status.name.lower()}")

    async def _audit_restart(self, sb: SimBookie) -> None:
        """After a restart, before the bookie is reachable: does it hold what it acked?"""
        if sb.incarnation > 1:
            self.cover("bookie_restarted")
            if sb.fs.counters.get("truncate", 0) > getattr(sb, "_truncates", 0):
                self.cover("journal_tail_truncated")
            sb._truncates = sb.fs.counters.get("truncate", 0)  # type: ignore[attr-defined]
        await self.audit(sb, "restart")

    async def audit(self, sb: SimBookie, how: str) -> None:
        """Ask a bookie whether it holds every entry it acknowledged (the ledgers not deleted
        since); read back a sample (all of it on a damaged bookie: a scrubber's pass)."""
        bookie = sb.bookie
        if bookie is None:
            return
        acked: dict[int, list[int]] = {}
        for ev in self.history.acks.get(sb.bookie_id, ()):
            if ev.ledger not in self.deleted:
                acked.setdefault(ev.ledger, []).append(ev.entry)
        for lid in sorted(acked):
            entries = sorted(set(acked[lid]))
            resp = await bookie.handle(ListEntriesRequest(lid))
            if resp.status == _OK:
                for e in _not_held(entries, getattr(resp, "ranges", ())):
                    self.history.bookie_absent(sb.bookie_id, lid, e, f"{how} audit list")
                if how != "final" and not sb.damaged:
                    continue
            sample = entries if sb.damaged else entries[-3:]
            for e in sample:
                r = await bookie.handle(ReadRequest(lid, e))
                self._observe_read(sb.bookie_id, lid, e, r.status, getattr(r, "body", None),
                                   f"{how} audit")


def _not_held(entries: list[int], held: Any) -> list[int]:
    """The entries (ascending) that no range ``(first, last)`` of ``held`` covers: one walk
    over both, the ranges sorted and merged first (a bookie's list may come in any order)."""
    merged = merged_ranges(held)
    out = []
    i = 0
    for e in entries:
        while i < len(merged) and merged[i][1] < e:
            i += 1
        if i == len(merged) or e < merged[i][0]:
            out.append(e)
    return out
