"""Asking a bookie's garbage collector from afar, through the metadata store.

Each bookie with a metadata store watches ``bookies/gc/<id>/trigger`` (a JSON ``{"id": n}``
that ``pybk.ops.Admin.collect_garbage`` bumps) and runs its collector, with major compaction,
when ``n`` grows; after every run it publishes its status (:meth:`GarbageCollector.status`,
plus ``"handled"``: the last trigger id it ran for) at ``bookies/gc/<id>/status``. So the CLI
and the admin API reach every kind of bookie (processes, LocalCluster's, simulated ones) the
way the auditor's switches do, without a wire request of their own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from pybk.errors import KeyExistsError, MetadataVersionError, NoSuchKeyError
from pybk.runtime.eventloop import gather

if TYPE_CHECKING:
    from pybk.bookie.gc import GarbageCollector
    from pybk.metadata.base import MetadataStore, Watch

#: seconds (loop time) before a trigger that could not be read is read again
RETRY_AFTER = 1.0

__all__ = ["GcRemote", "read_gc_status", "request_gc", "status_key", "trigger_key"]

log = logging.getLogger(__name__)


def _key_part(bookie_id: str) -> str:
    """A bookie id as one key segment (``host:port`` keeps its colon; ``/`` cannot be)."""
    return bookie_id.replace("/", "_")


def trigger_key(bookie_id: str) -> str:
    return f"bookies/gc/{_key_part(bookie_id)}/trigger"


def status_key(bookie_id: str) -> str:
    return f"bookies/gc/{_key_part(bookie_id)}/status"


async def _put(store: MetadataStore, key: str, value: bytes) -> None:
    """Write ``value`` whatever the key held (create it if absent)."""
    for _ in range(20):
        try:
            current = await store.read_value(key)
        except NoSuchKeyError:
            try:
                await store.create_value(key, value)
                return
            except KeyExistsError:
                continue
        try:
            await store.write_value(key, value, current.version)
            return
        except (MetadataVersionError, NoSuchKeyError):
            continue
    raise MetadataVersionError(f"key {key!r}: gave up after 20 conflicting writes")


async def request_gc(store: MetadataStore, bookie_id: str) -> int:
    """Ask ``bookie_id``'s collector for a run; the request's id (its status's ``handled``
    reaches it once the run is over)."""
    key = trigger_key(bookie_id)
    for _ in range(20):
        try:
            current = await store.read_value(key)
        except NoSuchKeyError:
            try:
                await store.create_value(key, json.dumps({"id": 1}).encode())
                return 1
            except KeyExistsError:
                continue
        n = int(json.loads(current.value)["id"]) + 1
        try:
            await store.write_value(key, json.dumps({"id": n}).encode(), current.version)
            return n
        except (MetadataVersionError, NoSuchKeyError):
            continue
    raise MetadataVersionError(f"key {key!r}: gave up after 20 conflicting writes")


async def read_gc_status(store: MetadataStore, bookie_id: str) -> dict[str, Any] | None:
    """The status ``bookie_id`` last published (None: never)."""
    try:
        value = await store.read_value(status_key(bookie_id))
    except NoSuchKeyError:
        return None
    status: dict[str, Any] = json.loads(value.value)
    return status


class GcRemote:
    """A bookie's end: the trigger's watch and the status's publication."""

    def __init__(self, gc: GarbageCollector, store: MetadataStore) -> None:
        self.gc = gc
        self.store = store
        self.bookie_id = gc.bookie.bookie_id
        self.handled = 0
        self._watch: Watch | None = None
        self._task: asyncio.Task[Any] | None = None
        self._pending = False
        self._retry: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        """Watch the trigger; a trigger made while the bookie was down is answered now."""
        try:
            last = await read_gc_status(self.store, self.bookie_id)
        except Exception as exc:  # (the watch still answers later triggers)
            log.info("bookie %s: gc status unreadable: %s", self.bookie_id, exc)
            last = None
        if last is not None:
            self.handled = int(last.get("handled", 0))
        self.gc.after_run = self.publish
        self._watch = self.store.watch_value(trigger_key(self.bookie_id), self._changed)
        self._changed("")

    async def drain(self) -> None:
        """No more triggers; wait for a run asked for to end."""
        if self._retry is not None:
            self._retry.cancel()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        task, self._task = self._task, None
        if task is not None:
            await gather(task, return_exceptions=True)

    def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _changed(self, _key: str) -> None:
        if self._task is not None and not self._task.done():
            self._pending = True  # read again once the run under way is over
            return
        self._task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        while True:
            self._pending = False
            try:
                value = await self.store.read_value(trigger_key(self.bookie_id))
                wanted = int(json.loads(value.value)["id"])
            except NoSuchKeyError:
                wanted = 0
            except Exception as exc:  # (e.g. a busy SQLite file): look again in a second
                log.info("bookie %s: gc trigger unreadable: %s", self.bookie_id, exc)
                if self._watch is not None:
                    self._retry = asyncio.get_running_loop().call_later(
                        RETRY_AFTER, self._changed, "")
                return
            if wanted > self.handled:
                self.handled = wanted  # (published by the run's end)
                try:
                    await self.gc.run(force=True)
                except Exception as exc:
                    log.warning("bookie %s: asked gc failed: %s", self.bookie_id, exc)
                    await self.publish()
            if not self._pending:
                return

    async def publish(self) -> None:
        """Publish the status (called after every run; a failure is logged, not raised)."""
        status = self.gc.status()
        status["handled"] = self.handled
        for attempt in range(3):  # (a busy SQLite file refuses a write now and then)
            try:
                await _put(self.store, status_key(self.bookie_id), json.dumps(status).encode())
                return
            except Exception as exc:
                log.info("bookie %s: gc status not published: %s", self.bookie_id, exc)
            if attempt < 2:
                await asyncio.sleep(RETRY_AFTER)
