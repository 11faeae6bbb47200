"""pybk for synchronous code: the async client driven by an event loop in a background thread.

::

    with pybk.sync.LocalCluster(root) as cluster:
        lh = cluster.client().create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        entry_id = lh.append(b"x")          # returns once the entry is durable
        rh = cluster.client().open_ledger(lh.id)
        print(rh.read(0, rh.last_add_confirmed))

Every call hops to the loop thread and waits for the result, so it costs one thread
round trip; for throughput use ``append_async`` (a ``concurrent.futures.Future``) or
``append_many``.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pybk import client as _client
from pybk import cluster as _cluster
from pybk.client.reader import LedgerEntry
from pybk.metadata.base import LedgerMetadata, MetadataStore
from pybk.sync.runner import LoopThread

T = TypeVar("T")


class LedgerHandle:
    """Synchronous wrapper of :class:`pybk.LedgerHandle`: a ledger open for writing by this
    client, its only writer (``Client.create_ledger`` makes one)."""

    def __init__(self, runner: LoopThread, handle: _client.LedgerHandle) -> None:
        self._runner = runner
        self._h = handle

    @property
    def id(self) -> int:
        """The ledger's id."""
        return self._h.id

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as this writer last saw it (ensembles, quorums, state)."""
        return self._h.metadata

    @property
    def last_add_pushed(self) -> int:
        """The id of the last entry handed to the bookies (-1: none yet)."""
        return self._h.last_add_pushed

    @property
    def last_add_confirmed(self) -> int:
        """The id of the last entry durable on Qa bookies, with every earlier one (-1: none)."""
        return self._h.last_add_confirmed

    @property
    def length(self) -> int:
        """Bytes of the entries confirmed so far (payloads, without framing)."""
        return self._h.length

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` has sealed the ledger (no more appends)."""
        return self._h.is_closed

    def append(self, data: bytes) -> int:
        """Add one entry; returns its id once it is durable on Qa bookies."""
        return self._runner.run(self._append(data))

    def append_async(self, data: bytes) -> concurrent.futures.Future[int]:
        """Add one entry without waiting; the future holds its id."""
        return self._runner.submit(self._append(data))

    async def _append(self, data: bytes) -> int:
        return await self._h.append(data)

    def append_many(self, items: Sequence[bytes]) -> list[int]:
        """Add several entries (pipelined); returns their ids once all are durable."""
        return self._runner.run(self._h.append_many(items))

    def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Read back confirmed entries ``first..last`` (inclusive; ``last`` at most
        :attr:`last_add_confirmed`, else EntryNotConfirmedError)."""
        return self._runner.run(self._h.read(first, last))

    def close(self) -> None:
        """Wait for pending appends, then seal the ledger at the last confirmed entry."""
        self._runner.run(self._h.close())

    def __enter__(self) -> LedgerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        h = self._h
        return (f"<pybk.sync.LedgerHandle {h.id} lac={h.last_add_confirmed} "
                f"lap={h.last_add_pushed} {'closed' if h.is_closed else 'open'}>")


class LedgerHandleAdv(LedgerHandle):
    """Synchronous wrapper of :class:`pybk.LedgerHandleAdv`: the caller chooses each entry's
    id (``Client.create_ledger_adv`` makes one)."""

    _h: _client.LedgerHandleAdv

    def append(self, entry_id: int, data: bytes) -> int:  # type: ignore[override]
        """Add ``data`` as entry ``entry_id``; returns the id once it and every smaller id
        are durable (DuplicateEntryIdError for an id added before)."""
        return self._runner.run(self._append_adv(entry_id, data))

    def append_async(self, entry_id: int, data: bytes,  # type: ignore[override]
                     ) -> concurrent.futures.Future[int]:
        """Add entry ``entry_id`` without waiting; the future holds its id. Appends made
        from one thread are taken in the order made."""
        return self._runner.submit(self._append_adv(entry_id, data))

    async def _append_adv(self, entry_id: int, data: bytes) -> int:
        return await self._h.append(entry_id, data)


class DeferredSyncLedgerHandle(LedgerHandle):
    """Synchronous wrapper of :class:`pybk.DeferredSyncLedgerHandle` (``create_ledger(...,
    write_flags={"deferred_sync"})``): appends return once written, :meth:`force` makes
    them durable."""

    _h: _client.DeferredSyncLedgerHandle

    @property
    def last_add_written(self) -> int:
        """The last entry Qa bookies acknowledged (written, maybe not yet durable)."""
        return self._h.last_add_written

    def force(self) -> int:
        """Make every entry appended so far durable; returns the LAC now durable."""
        return self._runner.run(self._h.force())


class ReadHandle:
    """Synchronous wrapper of :class:`pybk.ReadHandle`: a ledger open for reading
    (``Client.open_ledger`` makes one)."""

    def __init__(self, runner: LoopThread, handle: _client.ReadHandle) -> None:
        self._runner = runner
        self._h = handle

    @property
    def id(self) -> int:
        """The ledger's id."""
        return self._h.id

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as last read."""
        return self._h.metadata

    @property
    def last_add_confirmed(self) -> int:
        """The last entry known confirmed (the last entry, once the ledger is closed)."""
        return self._h.last_add_confirmed

    @property
    def length(self) -> int:
        """The ledger's length in bytes once it is closed (0 while it is open)."""
        return self._h.metadata.length

    @property
    def is_closed(self) -> bool:
        """Whether the ledger is closed (sealed: its content is final)."""
        return self._h.is_closed

    def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` inclusive; ``last`` at most :attr:`last_add_confirmed`
        (else EntryNotConfirmedError)."""
        return self._runner.run(self._h.read(first, last))

    def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` without the LAC check (they may not be confirmed yet)."""
        return self._runner.run(self._h.read_unconfirmed(first, last))

    def read_last_add_confirmed(self) -> int:
        """Ask the bookies for the LAC (it only grows) and return it."""
        return self._runner.run(self._h.read_last_add_confirmed())

    def read_last_add_confirmed_and_entry(
        self, entry_id: int, timeout: float = 1.0, *, parallel: bool | None = None
    ) -> LedgerEntry | None:
        """Long poll: wait up to ``timeout`` seconds for ``entry_id`` to be confirmed and
        return it; None on timeout or when the ledger closes before it. ``parallel``: ask
        every bookie at once or one at a time (None: ``ClientConfig.long_poll_parallel``)."""
        return self._runner.run(
            self._h.read_last_add_confirmed_and_entry(entry_id, timeout, parallel=parallel))

    def tail(self, start: int = 0) -> Iterator[LedgerEntry]:
        """Entries from ``start`` on, following the writer, until the ledger closes."""
        agen = self._h.tail(start)
        try:
            while True:
                try:
                    yield self._runner.run(_anext(agen))
                except StopAsyncIteration:
                    return
        finally:
            self._runner.run(agen.aclose())

    def close(self) -> None:
        """Release the handle (a reader never changes the ledger)."""
        self._runner.run(self._h.close())

    def __enter__(self) -> ReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        h = self._h
        return (f"<pybk.sync.ReadHandle {h.id} lac={h.last_add_confirmed} "
                f"{'closed' if h.is_closed else 'open'}>")


class Client:
    """Synchronous wrapper of :class:`pybk.Client`.

    Built by :meth:`LocalCluster.client`, or on its own (``pybk.sync.Client(metadata=...)``)
    with a private loop thread (``loop="uvloop"`` runs it on uvloop: :mod:`pybk.runtime.eventloop`).
    """

    def __init__(
        self,
        metadata: str | MetadataStore | None = None,
        *,
        loop: str | None = None,
        _runner: LoopThread | None = None,
        _client: _client.Client | None = None,
        **kwargs: Any,
    ) -> None:
        if _runner is not None and loop is not None:
            raise TypeError("loop= is for a client with its own loop thread")
        self._own_runner = _runner is None
        self._runner = _runner if _runner is not None else LoopThread(loop)
        if _client is None:
            if metadata is None:
                raise TypeError("Client() needs a metadata URI or store")
            _client = self._runner.run(_make_client(metadata, kwargs))
        self._c = _client

    def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest_type: str = "CRC32C",
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        *,
        write_flags: Iterable[str] | None = None,
    ) -> LedgerHandle:
        """Create a ledger on ``ensemble_size`` writable bookies and open it for writing:
        each entry goes to ``write_quorum`` bookies and is acknowledged by ``ack_quorum``.
        ``write_flags={"deferred_sync"}``: a :class:`DeferredSyncLedgerHandle`."""
        handle = self._runner.run(
            self._c.create_ledger(
                ensemble_size, write_quorum, ack_quorum, digest_type, password, custom_metadata,
                write_flags=write_flags,
            )
        )
        if isinstance(handle, _client.DeferredSyncLedgerHandle):
            return DeferredSyncLedgerHandle(self._runner, handle)
        return LedgerHandle(self._runner, handle)

    def create_ledger_adv(
        self,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest_type: str = "CRC32C",
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
    ) -> LedgerHandleAdv:
        """:meth:`create_ledger` for a writer that chooses each entry's id."""
        handle = self._runner.run(
            self._c.create_ledger_adv(
                ensemble_size, write_quorum, ack_quorum, digest_type, password, custom_metadata
            )
        )
        return LedgerHandleAdv(self._runner, handle)

    def open_ledger(
        self, ledger_id: int, password: bytes = b"", recovery: bool = True
    ) -> ReadHandle:
        """Open a ledger for reading. ``recovery=True`` fences and seals it (its writer's
        next append fails); ``recovery=False`` reads without disturbing the writer."""
        handle = self._runner.run(self._c.open_ledger(ledger_id, password, recovery))
        return ReadHandle(self._runner, handle)

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger (its entries are garbage-collected on the bookies)."""
        self._runner.run(self._c.delete_ledger(ledger_id))

    def list_ledgers(self) -> list[int]:
        """Every ledger id, ascending."""
        return self._runner.run(self._c.list_ledgers())

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """A ledger's metadata (NoSuchLedgerError if it does not exist)."""
        return self._runner.run(self._c.ledger_metadata(ledger_id))

    def namespace(self, name: str = "default", **kwargs: Any) -> Any:
        """The logs of a namespace, synchronously (:class:`pybk.sync.logs.SyncNamespace`)."""
        from pybk.sync.logs import SyncNamespace

        return SyncNamespace(self._runner, self._c.namespace(name, **kwargs))

    def close(self) -> None:
        """Release what the client opened (and its loop thread, if it has its own)."""
        self._runner.run(self._c.close())
        if self._own_runner:
            self._runner.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<pybk.sync.Client {self._c!r}>"


async def _anext(agen: AsyncGenerator[LedgerEntry, None]) -> LedgerEntry:
    return await agen.__anext__()


async def _make_client(metadata: str | MetadataStore, kwargs: dict[str, Any]) -> _client.Client:
    return await _client.Client(metadata, **kwargs).start()


class LocalCluster:
    """Synchronous :class:`pybk.LocalCluster`: ``with pybk.sync.LocalCluster(root) as c:``.

    ``loop`` names the kind of the background loop (:mod:`pybk.runtime.eventloop`;
    ``"uvloop"`` needs
    ``pybk[speed]``); the other keyword arguments are :class:`pybk.LocalCluster`'s."""

    def __init__(self, root: str | os.PathLike[str], bookies: int = 3, *,
                 loop: str | None = None, **kwargs: Any) -> None:
        from pybk.runtime.eventloop import loop_factory

        loop_factory(loop)  # an unknown or missing loop is refused here, not at start()
        self._args = (root, bookies)
        self._loop = loop
        self._kwargs = kwargs
        self._runner: LoopThread | None = None
        self._cluster: _cluster.LocalCluster | None = None

    def start(self) -> LocalCluster:
        """Start the bookies (``with`` does it); returns the cluster."""
        self._runner = LoopThread(self._loop)
        try:
            self._cluster = self._runner.run(self._astart())
        except BaseException:
            self._runner.stop()
            self._runner = None
            raise
        return self

    async def _astart(self) -> _cluster.LocalCluster:
        return await _cluster.LocalCluster(*self._args, **self._kwargs).start()

    def _parts(self) -> tuple[LoopThread, _cluster.LocalCluster]:
        if self._runner is None or self._cluster is None:
            raise RuntimeError("the cluster is not started (use it in a with block)")
        return self._runner, self._cluster

    def close(self) -> None:
        """Stop every bookie and the loop thread (``with`` does it). Idempotent."""
        if self._runner is None:
            return
        runner, cluster = self._parts()
        try:
            runner.run(cluster.close())
        finally:
            runner.stop()
            self._runner = None
            self._cluster = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def bookie_ids(self) -> list[str]:
        """The cluster's bookies (running or stopped), by id."""
        return self._parts()[1].bookie_ids

    def bookie_dir(self, bookie_id: str) -> os.PathLike[str]:
        """A bookie's data directory."""
        return self._parts()[1].bookie_dir(bookie_id)

    def client(self, **kwargs: Any) -> Client:
        """A client of this cluster (keyword arguments: :class:`pybk.Client`'s); it shares
        the cluster's loop thread and needs no close of its own."""
        runner, cluster = self._parts()
        return Client(_runner=runner, _client=cluster.client(**kwargs))

    def stop_bookie(self, bookie_id: str) -> None:
        """Crash-stop a bookie (unsynced data is lost as after ``kill -9``) and unregister it;
        :meth:`start_bookie` brings it back on its data."""
        runner, cluster = self._parts()
        runner.run(cluster.stop_bookie(bookie_id))

    def start_bookie(self, bookie_id: str) -> None:
        """Start a stopped bookie again on its data."""
        runner, cluster = self._parts()
        runner.run(cluster.start_bookie(bookie_id))

    def add_bookie(self) -> str:
        """Start one more bookie; returns its id."""
        runner, cluster = self._parts()
        return runner.run(cluster.add_bookie())

    def __repr__(self) -> str:
        if self._cluster is not None:
            return f"<pybk.sync {self._cluster!r}>"
        return f"<pybk.sync.LocalCluster {self._args[0]} (not started)>"


__all__ = ["Client", "DeferredSyncLedgerHandle", "LedgerHandle", "LedgerHandleAdv", "LocalCluster",
           "ReadHandle"]
