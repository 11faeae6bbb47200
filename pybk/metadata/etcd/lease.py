"""The store's etcd lease: what makes its bookie registrations and locks vanish with it.

Granted on first need, renewed every third of its TTL. Each renewal remembers when it was
sent: the lease is trusted until that moment plus the TTL etcd answered (etcd counts from
the renewal's arrival, later). TTLs are whole seconds: a fraction is dropped, so the lease
never outlives what the caller asked for by more than etcd's own minimum. A renewal one
member holds for a third of the TTL (it just lost its leader and waits for one) is given up
for the next member, in time to renew before the lease runs out. When a renewal
finds the lease gone (it expired during a pause or an outage), the store is told
(``on_lost``) and a new lease is granted at the next need; the store re-creates its
registrations under it, as the ZooKeeper store does after a new session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from pybk.errors import ClientClosedError, MetadataStoreError
from pybk.metadata.etcd.client import EtcdClient

__all__ = ["EtcdLease"]

log = logging.getLogger("pybk.metadata.etcd")


class EtcdLease:
    """One lease at a time; ``on_lost`` runs (on the loop) when it is found lost."""

    def __init__(self, client: EtcdClient, ttl: float,
                 on_lost: Callable[[], Awaitable[None]]) -> None:
        if not ttl >= 1:
            raise ValueError(f"etcd lease TTL must be >= 1 s, got {ttl!r}")
        self._client = client
        self.ttl = ttl
        self._on_lost = on_lost
        self.id = 0
        self._valid_until = 0.0
        self._task: asyncio.Task[None] | None = None
        self._granting = asyncio.Lock()
        self.losses = 0

    def alive(self) -> bool:
        """Whether the lease is trusted now (no I/O)."""
        return self.id != 0 and asyncio.get_running_loop().time() < self._valid_until

    async def ensure(self) -> int:
        """The current lease id, granted now when there is none."""
        async with self._granting:
            if self.id == 0:
                loop = asyncio.get_running_loop()
                sent = loop.time()
                self.id, granted = await self._client.grant(self.ttl)
                self._valid_until = sent + granted
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(
                    self._renew(), name="pybk-etcd-lease")
            return self.id

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        while self.id:
            await asyncio.sleep(self.ttl / 3)
            lease = self.id
            sent = loop.time()
            try:
                # a member that holds a renewal for a third of the TTL is given up for
                # the next one, in time to renew before the lease runs out
                left = await self._client.keepalive(lease, attempt=self.ttl / 3)
            except ClientClosedError:
                return
            except MetadataStoreError as exc:
                log.warning("etcd lease %x: renewal failed: %s", lease, exc)
                continue
            if lease != self.id:
                continue
            if left > 0:
                self._valid_until = sent + left  # etcd's own count, from after we sent
                continue
            log.warning("etcd lease %x expired: registrations and locks are gone", lease)
            self.id = 0
            self._valid_until = 0.0
            self.losses += 1
            self._task = None  # the next ensure() starts a renewer for the new lease
            await self._on_lost()
            return

    def forget(self) -> None:
        """Stop renewing without revoking (a crash: the lease lapses after its TTL)."""
        if self._task is not None:
            self._task.cancel()
        self._task = None

    async def stop(self, *, revoke: bool) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        lease, self.id = self.id, 0
        self._valid_until = 0.0
        if revoke and lease:
            try:
                await self._client.revoke(lease)
            except MetadataStoreError as exc:
                log.warning("etcd lease %x: revoke failed (it lapses by itself): %s", lease, exc)
