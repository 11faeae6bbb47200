"""A simulated object store for tiered storage: objects by name on virtual time, with faults of
its own, behind the offload seam (:class:`pybk.logs.tier_access.TierAccess`).

An object appears whole when its upload completes (an object store's PUT) and is read,
sized, listed and deleted by name. Until the liveness phase disarms them, the store's faults
are: a latency on every call, errors (a call refused before anything happened), an upload
that completed but whose answer was lost (the object is there, the caller gets an error) and
a listing that lags behind the uploads. Its own generator (``derive_rng(seed, "tier")``)
draws them, so other seeds' traces stay as they were. Given a generator of their own
(``derive_rng(seed, "tier-torn")``), uploads are also cut short: the caller gets an error and
the store keeps a prefix under the object's name, an abandoned multipart upload (no listing
of objects shows it; the orphan sweep lists and aborts them), or the whole object, landing
later (docs/internals.md). Objects are dated by the
run's wall clock (what the orphan sweep lists).

:meth:`SimObjectStore.verified` says whether a segment's objects are complete and match (the
offload's own verification, done from outside for the invariants TS1/TS2 of
:mod:`pybk.sim.logs`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import crc32c

from pybk.errors import BKError, CorruptRecordError
from pybk.logs.tier_access import TierAccess
from pybk.logs.tier_store import SegmentIndex, attempt_base
from pybk.sim.checker import Violation
from pybk.sim.history import OK, History

__all__ = ["SimObjectStore", "SimTierAccess", "SimTierError", "TierWatch", "check_tier"]

_VERIFY_CHUNK = 4096
#: objects with their modification times (``list`` is also a method of the store)
_Dated = list[tuple[str, float]]
#: unfinished uploads: (object name, upload id, when begun)
_Uploads = list[tuple[str, str, float]]


class SimTierError(OSError):
    """An injected object store failure (the call may or may not have taken effect)."""


class SimObjectStore:
    """The objects of one simulated run's tier (see the module docstring)."""

    def __init__(self, rng: random.Random, count: Callable[[str], None] | None = None,
                 cover: Callable[[str], None] | None = None, *,
                 clock: Callable[[], float] | None = None,
                 torn: random.Random | None = None) -> None:
        self.rng = rng
        self.objects: dict[str, tuple[bytes, float]] = {}  # name -> (bytes, when stored)
        self.mtimes: dict[str, float] = {}  # name -> the wall clock when it landed
        #: abandoned multipart uploads: (object name, upload id) -> (parts, when begun, by
        #: the run's wall clock as objects are dated)
        self.uploads: dict[tuple[str, str], tuple[bytes, float]] = {}
        self._upload_ids = 0
        self.clock = clock or self._now
        self.torn = torn
        self.torn_rate = 0.0 if torn is None else torn.choice((0.0, 0.05, 0.15))
        #: awaited before a sweeping access deletes an object (the name; the TS3 watch)
        self.before_sweep_delete: Callable[[str], Awaitable[None]] | None = None
        self.armed = True
        self.error_rate = rng.choice((0.0, 0.02, 0.08))
        self.lost_answer_rate = rng.choice((0.0, 0.05, 0.15))
        self.latency = rng.choice(((0.001, 0.01), (0.01, 0.2), (0.05, 0.8)))
        self.list_lag = rng.choice((0.0, 0.5, 3.0))
        self._count = count or (lambda kind: None)
        self._cover = cover or (lambda marker: None)
        #: whether a process (a client's name) died: its calls stop where they are
        self.dead: Callable[[str], bool] = lambda owner: False

    def cover(self, marker: str) -> None:
        """Count a coverage marker of the run."""
        self._cover(marker)

    def disarm(self) -> None:
        """Faults stop (the liveness phase)."""
        self.armed = False

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _call(self, what: str) -> None:
        await asyncio.sleep(self.rng.uniform(*self.latency))
        if self.armed and self.rng.random() < self.error_rate:
            self._count("tier_error")
            raise SimTierError(f"simulated object store: {what} failed")

    def _land(self, name: str, data: bytes) -> None:
        self.objects[name] = (bytes(data), self._now())
        self.mtimes[name] = self.clock()

    async def put(self, name: str, data: bytes, owner: str | None = None) -> None:
        await self._call(f"put {name}")
        if owner is not None and self.dead(owner):
            self._cover("tier_uploads_of_dead_processes")
            await _never()  # (its process died before the upload completed: nothing lands)
        if self.armed and self.torn is not None and self.torn_rate \
                and self.torn.random() < self.torn_rate:
            self._cut(name, bytes(data))
        self._land(name, data)
        self._cover("tier_objects_put")
        if self.armed and self.rng.random() < self.lost_answer_rate:
            self._count("tier_lost_answer")
            raise SimTierError(f"simulated object store: put {name} answer lost")

    def _cut(self, name: str, data: bytes) -> None:
        """An upload cut short (see the module docstring); raises the caller's error."""
        assert self.torn is not None
        how = self.torn.choice(("partial", "abandoned", "late"))
        self._count(f"tier_torn_{how}")
        part = data[: self.torn.randrange(len(data))] if data else b""
        if how == "partial":
            self._land(name, part)
        elif how == "abandoned":
            self._upload_ids += 1
            self.uploads[(name, str(self._upload_ids))] = (part, self.clock())
        else:
            asyncio.get_running_loop().call_later(self.torn.uniform(0.1, 4.0), self._land,
                                                  name, data)
        raise SimTierError(f"simulated object store: put {name} cut short ({how})")

    async def get(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        await self._call(f"get {name}")
        found = self.objects.get(name)
        if found is None:
            raise FileNotFoundError(name)
        return found[0][start:end]

    async def size(self, name: str) -> int:
        await self._call(f"size {name}")
        found = self.objects.get(name)
        if found is None:
            raise FileNotFoundError(name)
        return len(found[0])

    async def delete(self, name: str, *, sweeping: bool = False) -> None:
        await self._call(f"delete {name}")
        if sweeping and self.before_sweep_delete is not None and name in self.objects:
            await self.before_sweep_delete(name)
        self.objects.pop(name, None)
        self.mtimes.pop(name, None)

    async def list(self, prefix: str) -> list[str]:
        return [n for n, _ in await self.list_dated(prefix)]

    async def list_dated(self, prefix: str) -> _Dated:
        """The objects under ``prefix`` with their modification times (lagging, armed)."""
        await self._call(f"list {prefix}")
        seen_before = self._now() - (self.list_lag if self.armed else 0.0)
        return sorted((n, self.mtimes[n]) for n, (_, t) in self.objects.items()
                      if n.startswith(prefix) and t <= seen_before)

    async def list_uploads(self, prefix: str) -> _Uploads:
        """The abandoned uploads under ``prefix``: (object name, upload id, when begun). A
        store that never cuts uploads short has none, and answers at once (its generator
        is left as it was); otherwise the call's latency and errors come from the torn
        uploads' generator."""
        if self.torn is None:
            return []
        await asyncio.sleep(self.torn.uniform(*self.latency))
        if self.armed and self.torn.random() < self.error_rate:
            self._count("tier_error")
            raise SimTierError(f"simulated object store: list uploads {prefix} failed")
        return sorted((n, u, t) for (n, u), (_, t) in self.uploads.items()
                      if n.startswith(prefix))

    async def abort_upload(self, name: str, upload_id: str, *, sweeping: bool = False) -> None:
        """Abort one abandoned upload (one already gone is no error)."""
        assert self.torn is not None  # (only listed uploads are aborted)
        await asyncio.sleep(self.torn.uniform(*self.latency))
        if self.armed and self.torn.random() < self.error_rate:
            self._count("tier_error")
            raise SimTierError(f"simulated object store: abort {name} failed")
        if sweeping and self.before_sweep_delete is not None \
                and (name, upload_id) in self.uploads:
            await self.before_sweep_delete(name)
        if self.uploads.pop((name, upload_id), None) is not None:
            self._cover("tier_uploads_aborted")

    def verified(self, base: str, seq: int, ledger: int) -> bool:
        """Both objects of ``base`` are there, the index names ``seq``/``ledger`` and the
        data object matches its length and CRC32C (no faults, no time: the checker's view)."""
        index, data = self.objects.get(base + ".index"), self.objects.get(base + ".data")
        if index is None or data is None:
            return False
        try:
            idx = SegmentIndex.from_bytes(index[0])
        except CorruptRecordError:
            return False
        return (idx.seq == seq and idx.ledger == ledger and len(data[0]) == idx.data_length
                and crc32c.crc32c(data[0]) == idx.data_crc32c)

    async def open(self, url: str, options: dict[str, Any], *,
                   owner: str | None = None) -> TierAccess:
        """The namespace's tier opener (``client.namespace(..., tiers=store.open)``); with
        ``owner`` (a process's name) its calls stop where they are once that process dies."""
        return SimTierAccess(self, url, owner=owner)

    async def open_sweeping(self, url: str, options: dict[str, Any]) -> TierAccess:
        """The opener of the orphan sweep's namespace: its deletions are watched (TS3)."""
        return SimTierAccess(self, url, sweeping=True)


class SimTierAccess:
    """:class:`pybk.logs.tier_access.TierAccess` on a :class:`SimObjectStore` (the same
    object names, format and verification as :class:`pybk.logs.tier_store.TierStore`)."""

    def __init__(self, store: SimObjectStore, url: str, *, sweeping: bool = False,
                 owner: str | None = None) -> None:
        self.store = store
        self.url = url.rstrip("/")
        self.sweeping = sweeping
        self.owner = owner

    async def _alive(self) -> None:
        """A dead process's call never goes on (nor does its caller hear back)."""
        if self.owner is not None and self.store.dead(self.owner):
            self.store.cover("tier_calls_of_dead_processes")
            await _never()

    def base(self, namespace: str, log: str, seq: int, ledger: int, uid: str) -> str:
        return f"{namespace}/{log}/{seq}-{ledger}-{uid}"

    async def write_data(self, path: str, chunks: Iterable[list[bytes]]) -> tuple[int, int]:
        await self._alive()
        data = b"".join(part for frames in chunks for part in frames)
        await self.store.put(path + ".data", data, self.owner)
        return len(data), crc32c.crc32c(data)

    async def write_index(self, path: str, index: SegmentIndex) -> None:
        await self._alive()
        await self.store.put(path + ".index", index.to_bytes(), self.owner)

    async def read_index(self, path: str) -> SegmentIndex:
        await self._alive()
        found = await self.store.get(path + ".index")
        await self._alive()
        return SegmentIndex.from_bytes(found)

    async def verify(self, path: str, seq: int, ledger: int) -> SegmentIndex:
        idx = await self.read_index(path)
        if idx.seq != seq or idx.ledger != ledger:
            raise CorruptRecordError(f"offload {path}: index names segment {idx.seq} "
                                     f"ledger {idx.ledger}")
        await self._alive()
        size = await self.store.size(path + ".data")
        if size != idx.data_length:
            raise CorruptRecordError(f"offload {path}: data object has {size} bytes, the "
                                     f"index says {idx.data_length}")
        crc, off = 0, 0
        while off < size:
            chunk = await self.store.get(path + ".data", off, min(size, off + _VERIFY_CHUNK))
            if not chunk:
                break
            crc = crc32c.crc32c(chunk, crc)
            off += len(chunk)
        if crc != idx.data_crc32c:
            raise CorruptRecordError(f"offload {path}: data object checksum mismatch")
        return idx

    async def read_range(self, path: str, start: int, end: int) -> bytes:
        await self._alive()
        found = await self.store.get(path + ".data", start, end)
        await self._alive()
        return found

    async def delete(self, path: str) -> None:
        for suffix in (".index", ".data"):
            await self._alive()
            await self.store.delete(path + suffix, sweeping=self.sweeping)

    async def list_segments(self, namespace: str, log: str) -> list[str]:
        await self._alive()
        names = await self.store.list(f"{namespace}/{log}/")
        return sorted({n.rsplit(".", 1)[0] for n in names if n.endswith((".data", ".index"))})

    async def list_objects(self, namespace: str, log: str) -> list[tuple[str, float]]:
        await self._alive()
        found = await self.store.list_dated(f"{namespace}/{log}/")
        return [(n, t) for n, t in found if attempt_base(n) is not None]

    async def list_uploads(self, namespace: str, log: str) -> list[tuple[str, str, float]]:
        await self._alive()
        found = await self.store.list_uploads(f"{namespace}/{log}/")
        return [(n, u, t) for n, u, t in found if attempt_base(n) is not None]

    async def abort_upload(self, name: str, upload_id: str) -> None:
        await self._alive()
        await self.store.abort_upload(name, upload_id, sweeping=self.sweeping)


async def _never() -> None:
    await asyncio.get_running_loop().create_future()


# -- the tiered-storage invariants ------------------------------------------------------------


class TierWatch:
    """Checks, each at its instant, what tiered storage promises of the simulated log:

    * **TS1** a segment's bookie copy is deleted only once its recorded offload's objects are
      complete and match (checked when the ledger's deletion is applied);
    * **TS2** every segment of the log not truncated is readable from at least one tier: its
      ledger still exists, or its recorded offload is complete and its objects match (checked
      at the end, after the last reader).
    """

    def __init__(self, run: Any, store: SimObjectStore, key: str, namespace: str,
                 log: str) -> None:
        self.run = run
        self.store = store
        self.key = key
        self.namespace = namespace
        self.log = log
        self._checked: set[int] = set()

    def base(self, seq: int, ledger: int, uid: str) -> str:
        return f"{self.namespace}/{self.log}/{seq}-{ledger}-{uid}"

    async def _metadata(self) -> Any:
        from pybk.logs.meta import LogMetadata

        value = await self.run.cluster.admin.read_value(self.key)
        return LogMetadata.from_bytes(value.value, value.version)

    def meta_applied(self, op: str, key: object) -> Any:
        if op == "delete_ledger" and isinstance(key, int) and key not in self._checked:
            return self._deleted(key)
        return None

    async def _deleted(self, ledger: int) -> None:
        from pybk.logs.meta import TRUNCATED

        try:
            md = await self._metadata()
        except Exception:  # (the log deleted: never here, it lives for the run)
            return
        seg = next((s for s in md.segments if s.ledger_id == ledger), None)
        if seg is None or seg.state == TRUNCATED or seg.offload is None \
                or not seg.offload.bk_deleted:
            return  # not a bookie copy deleted for an offload (a cursor's, a truncation...)
        self._checked.add(ledger)
        self.run.cover("tier_bookie_copies_deleted")
        ok = self.store.verified(self.base(seg.seq, ledger, seg.offload.uid), seg.seq, ledger)
        self.run.history.tier_check("TS1", ok, f"segment {seg.seq} ledger L{ledger} bookie "
                                    f"copy deleted, offload {seg.offload.uid} "
                                    + ("verified" if ok else "NOT complete and verified"))

    async def final_check(self) -> None:
        """TS2 over the log as it ends."""
        md = await self._metadata()
        for seg in md.live_segments:
            if seg.last_entry < 0:
                continue
            try:
                self.run.cluster.store.peek_ledger(seg.ledger_id)
                continue  # the bookies' copy
            except (KeyError, BKError):
                pass
            o = seg.offload
            ok = o is not None and o.complete and self.store.verified(
                self.base(seg.seq, seg.ledger_id, o.uid), seg.seq, seg.ledger_id)
            if ok:
                self.run.cover("tier_segments_read_from_tier")
            self.run.history.tier_check("TS2", ok, f"segment {seg.seq} (L{seg.ledger_id}) is "
                                        + ("in the tier" if ok else "in NO tier"))


def check_tier(history: History, max_per_invariant: int = 5) -> list[Violation]:
    """TS1/TS2 (see :class:`TierWatch`): every check that failed."""
    out: list[Violation] = []
    counts: dict[str, int] = {}
    for ev in history.of_kind("tier_check"):
        if ev.outcome == OK:
            continue
        inv, _, detail = ev.detail.partition("|")
        counts[inv] = counts.get(inv, 0) + 1
        if counts[inv] <= max_per_invariant:
            out.append(Violation(inv, -1, -1, detail, (ev.line,) if ev.line >= 0 else ()))
    return out
