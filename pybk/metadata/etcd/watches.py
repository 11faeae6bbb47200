"""One etcd watch stream per store, over its whole root, shared by every watch it hands out.

How no change is missed (the watch guarantee, ``docs/contracts.md``): etcd numbers every
change with a revision and a watch stream replays every change after the revision it starts
from. The stream starts from the first revision this store saw (every subject it returned,
it returned at a revision at least that), and resumes after a lost connection from the
revision after the last one it delivered. Each subject (a key, or the bookie registry, a
prefix) remembers the revision the store last returned it at (its *baseline*) and the
revision of the last change the stream delivered for it (kept only for subjects returned:
memory follows what the store returned, as in the other stores). A new watch fires at once
when the stream already delivered a change after the baseline, and for every change it
delivers from then on. A subject never returned gets the store's latest revision as baseline (at or
before the moment the watch was set). If etcd compacted the history the stream needed,
every watch fires (extra fires are allowed) and the stream resumes at the compaction point.
A stream on a member cut off from its cluster is cancelled by it ("no leader": the client
requires one) and resumes on the next member, so a partition cannot silence it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp

from pybk.errors import ClientClosedError, MetadataStoreError
from pybk.metadata._common import CallbackWatch
from pybk.metadata.base import Watch
from pybk.metadata.etcd.client import EtcdClient, unb64

__all__ = ["EtcdWatcher"]

log = logging.getLogger("pybk.metadata.etcd")


class EtcdWatcher:
    """Watches on subjects under ``prefix``: a subject is a full key, or one of
    ``subject_prefixes`` (keys ending in ``/``) that stands for every key below it."""

    def __init__(self, client: EtcdClient, prefix: bytes, subject_prefixes: tuple[bytes, ...]
                 ) -> None:
        self._client = client
        self._prefix = prefix
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watches: dict[bytes, dict[CallbackWatch, int]] = {}  # watch -> its baseline
        self._baseline: dict[bytes, int] = {}
        self._last_change: dict[bytes, int] = {}  # subject -> revision of its last change
        self._prefix_subjects = subject_prefixes
        self._task: asyncio.Task[None] | None = None
        self._next = 0  # the next revision the stream delivers
        self._created = asyncio.Event()
        self.delivered = 0  # revision up to which every change was dispatched
        self.resumes = 0  # streams opened again after a loss (tests read it)

    def returned(self, subject: bytes, revision: int) -> None:
        """The store returned ``subject`` as of ``revision``."""
        if revision > self._baseline.get(subject, 0):
            self._baseline[subject] = revision
            if self.delivered > revision:
                # the stream already passed this answer and recorded no change for a
                # subject it did not know: count one (an extra fire at worst)
                self._last_change[subject] = max(self._last_change.get(subject, 0),
                                                 self.delivered)

    def watch(self, subject: bytes, callback: Callable[[], None]) -> Watch:
        loop = asyncio.get_running_loop()
        self._loop = loop
        w = CallbackWatch(loop, callback, self._forget(subject))
        base = self._baseline.get(subject, self._client.revision)
        self._watches.setdefault(subject, {})[w] = base
        if self._task is None:
            self._task = loop.create_task(self._run(), name="pybk-etcd-watch")
        if self._next == 0:
            w.fire()  # the stream is not running yet: nothing known; an extra fire is fine
        elif self._last_change.get(subject, 0) > base:
            w.fire()
        return w

    def _forget(self, subject: bytes) -> Callable[[CallbackWatch], None]:
        def drop(w: CallbackWatch) -> None:
            watches = self._watches.get(subject)
            if watches is not None:
                watches.pop(w, None)
                if not watches:
                    del self._watches[subject]
        return drop

    async def established(self, bound: float) -> bool:
        if self._task is None:
            return False
        if self._created.is_set():
            return False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                await self._created.wait()
        return True

    def _dispatch(self, key: bytes, revision: int) -> None:
        subjects = [key] + [p for p in self._prefix_subjects if key.startswith(p)]
        for s in subjects:
            if s in self._baseline or s in self._prefix_subjects:  # (memory: only these)
                self._last_change[s] = revision
            for w, base in list(self._watches.get(s, {}).items()):
                if revision > base:
                    w.fire()

    def _fire_all(self) -> None:
        for watches in list(self._watches.values()):
            for w in list(watches):
                w.fire()

    async def _run(self) -> None:
        client = self._client
        if client.first_revision == 0:
            try:
                await self._learn_revision()
            except ClientClosedError:
                return
        # every subject was returned at a revision >= the first one this client saw
        self._next = client.first_revision + 1
        backoff = 0.05
        while True:
            try:
                async for result in client.watch(self._prefix, self._next):
                    backoff = 0.05
                    if result.get("created"):
                        self._created.set()
                    compact = int(result.get("compact_revision", 0))
                    if compact:
                        log.warning("etcd history compacted at %d; firing every watch", compact)
                        self._next = max(self._next, compact)
                        self._fire_all()
                        break
                    if result.get("canceled"):
                        break
                    for ev in result.get("events") or ():
                        kv = ev["kv"]
                        rev = int(kv.get("mod_revision", 0))
                        self._dispatch(unb64(kv.get("key")), rev)
                        self._next = max(self._next, rev + 1)
                    self.delivered = self._next - 1
            except asyncio.CancelledError:
                raise
            except ClientClosedError:
                return
            except (aiohttp.ClientError, MetadataStoreError, ValueError, OSError) as exc:
                log.info("etcd watch stream lost (%s); resuming at revision %d", exc, self._next)
            self.resumes += 1
            await asyncio.sleep(backoff)
            backoff = min(1.0, backoff * 2)

    async def _learn_revision(self) -> None:
        delay = 0.05
        while True:
            try:
                await self._client.get(self._prefix)
                return
            except MetadataStoreError as exc:
                log.info("etcd watch: no revision yet (%s)", exc)
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._watches.clear()
