"""The bridge between kazoo's threads and the event loop: connection, session, one call.

kazoo runs its own threads. Every operation goes through :meth:`KazooBridge.call`, which uses
kazoo's async API and wakes the loop with ``call_soon_threadsafe``: no operation blocks the
loop. Connection-state callbacks come from kazoo threads and are delivered on the loop the
same way; listeners hear of a lost connection (``on_disconnect``) and of a *new session*
(``on_new_session``: ephemerals of the old one are gone and watches may have missed events).

Operations issued while the client is not connected wait (bounded by ``op_timeout``) for the
connection to come back, then fail with MetadataStoreError; operations in flight when the
connection or session goes away fail with MetadataStoreError ("outcome unknown"), except
reads, which are retried within the same bound. Nothing acts on stale state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    SessionExpiredError,
    ZookeeperError,
)

from pybk.errors import ClientClosedError, MetadataStoreError
from pybk.metadata.zookeeper.paths import Layout

__all__ = ["KazooBridge"]

log = logging.getLogger("pybk.metadata.zookeeper")

#: kazoo calls that are safe to repeat after a lost connection.
_IDEMPOTENT = frozenset({"get", "get_children", "exists"})


class KazooBridge:
    """One kazoo client, its session, and the loop it reports to (see the module doc)."""

    def __init__(
        self,
        hosts: str,
        layout: Layout,
        *,
        session_timeout: float,
        connect_timeout: float,
        op_timeout: float,
        base_dirs: Iterable[str] = (),
    ) -> None:
        self.hosts = hosts
        self.layout = layout
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self.op_timeout = op_timeout
        self._base_dirs = tuple(base_dirs)
        self.zk = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry={"max_tries": -1, "delay": 0.05, "max_delay": 1.0},
            command_retry={"max_tries": 3, "delay": 0.05, "max_delay": 0.5},
        )
        self.zk.add_listener(self._on_state)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._start_lock = asyncio.Lock()
        self._connected_event = asyncio.Event()  # set by the loop when (re)connected
        self.started = False
        self.closed = False
        self.connected = False
        self.session_id: int | None = None
        self._pending_recipes: list[Callable[[], Any]] = []  # watches made before connecting
        self._tasks: set[asyncio.Task[Any]] = set()
        #: called on the loop when a new session replaces the previous one
        self.on_new_session: list[Callable[[], None]] = []
        #: called on the loop when the connection drops (the session may survive)
        self.on_disconnect: list[Callable[[], None]] = []
        #: number of sessions lost (expired); tests and operators look at it
        self.sessions_lost = 0

    @property
    def where(self) -> str:
        return f"{self.hosts}{self.layout.root}"

    @property
    def client_id(self) -> tuple[int, bytes] | None:
        cid = self.zk.client_id
        return None if cid is None else (int(cid[0]), bytes(cid[1]))

    def _is_started(self) -> bool:  # (a method: mypy would narrow the attribute otherwise)
        return self.started

    def _is_connected(self) -> bool:
        return self.connected

    # -- connection and session ----------------------------------------------------------------

    async def ensure_started(self) -> None:
        if self.closed:
            raise ClientClosedError(f"ZooKeeper metadata store {self.where} is closed")
        if self.started:
            return
        async with self._start_lock:
            if self._is_started():  # another task connected while we waited
                return
            self.loop = asyncio.get_running_loop()

            def start() -> None:
                self.zk.start(timeout=self.connect_timeout)
                for sub in self._base_dirs:
                    self.zk.ensure_path(self.layout.p(*sub.split("/")))
                if not self.zk.exists(self.layout.idgen):
                    with contextlib.suppress(NodeExistsError):
                        self.zk.create(self.layout.idgen, b"0")

            try:
                await asyncio.to_thread(start)
            except Exception as exc:
                await asyncio.to_thread(self.zk.stop)
                raise MetadataStoreError(
                    f"cannot connect to ZooKeeper at {self.hosts} (root {self.layout.root}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            cid = self.zk.client_id
            self.session_id = None if cid is None else cid[0]
            self.connected = True
            self.started = True
            pending, self._pending_recipes = self._pending_recipes, []
            for make in pending:
                self._spawn_recipe(make)

    def _on_state(self, state: str) -> None:
        """kazoo connection-state listener (kazoo's thread): must not block or call ZK."""
        if state == KazooState.CONNECTED:
            cid = self.zk.client_id
            self.schedule(self._on_connected, None if cid is None else cid[0])
        else:
            self.connected = False
            self.schedule(self._on_disconnected, state == KazooState.LOST)

    def schedule(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon (from any thread)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)

    def _on_disconnected(self, lost: bool) -> None:
        if self.closed:
            return  # kazoo reports LOST when we close the session ourselves
        if lost:
            self.sessions_lost += 1
            log.warning("ZooKeeper session to %s expired; ephemerals will be re-created",
                        self.hosts)
        for fn in list(self.on_disconnect):
            fn()

    def _on_connected(self, session_id: int | None) -> None:
        if self.closed:
            return
        # re-check: the connection may have dropped again since kazoo's thread queued this
        self.connected = self.zk.state == KazooState.CONNECTED
        if self.connected:
            self._connected_event.set()
        if not self.started:
            # the first session (ensure_started records its id): nothing of ours lived in an
            # earlier one, so there is nothing to restore; reporting it as new would start a
            # re-registration racing the caller's own first registration
            return
        if session_id == self.session_id:
            return
        self.session_id = session_id
        for fn in list(self.on_new_session):
            fn()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A background task owned by the bridge (cancelled on close)."""
        assert self.loop is not None
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- one operation -------------------------------------------------------------------------

    async def call(
        self,
        op: str,
        method: str,
        *args: Any,
        expect: tuple[type[Exception], ...] = (),
        **kwargs: Any,
    ) -> Any:
        """Run ``zk.<method>_async(*args, **kwargs)`` without blocking the loop.

        While the client is disconnected the operation waits for the connection to come
        back, at most ``op_timeout`` seconds in all (ZooKeeper restarts and leader changes
        are absorbed); then it fails with MetadataStoreError, never touching the server.
        Reads interrupted by a lost connection are retried within the same bound; a write
        interrupted that way fails with MetadataStoreError ("outcome unknown").
        kazoo errors listed in ``expect`` propagate (the caller maps them to pybk errors).
        """
        await self.ensure_started()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.op_timeout
        while True:
            await self._wait_connected(op, deadline)
            result = await self._issue(op, method, args, kwargs, deadline)
            try:
                return result.get_nowait()
            except expect:
                raise
            except (ConnectionLoss, SessionExpiredError) as exc:
                if method in _IDEMPOTENT and loop.time() < deadline and not self.closed:
                    await asyncio.sleep(0.02)  # let the state listener report the loss
                    continue
                what = "session expired" if isinstance(exc, SessionExpiredError) else (
                    "connection lost"
                )
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: {what} during {op}; outcome unknown"
                ) from exc
            except ConnectionClosedError as exc:
                raise ClientClosedError(
                    f"ZooKeeper metadata store {self.where} is closed ({op})"
                ) from exc
            except (NoNodeError, NodeExistsError, BadVersionError, NotEmptyError) as exc:
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: {op}: unexpected {type(exc).__name__} "
                    f"(was {self.layout.root} changed by hand?)"
                ) from exc
            except (KazooException, ZookeeperError) as exc:
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: {op} failed ({type(exc).__name__}); "
                    "outcome unknown"
                ) from exc

    async def _wait_connected(self, op: str, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while not self.connected:
            if self.closed:
                raise ClientClosedError(f"ZooKeeper metadata store {self.where} is closed ({op})")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise MetadataStoreError(
                    f"ZooKeeper {self.hosts}: not connected for {self.op_timeout}s "
                    f"(server unreachable or session lost); {op} not attempted"
                )
            self._connected_event.clear()
            if self._is_connected():  # (cannot change in between: both run on the loop)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected_event.wait(), remaining)

    async def _issue(
        self, op: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
        deadline: float,
    ) -> Any:
        """Send one request and wait (bounded) for kazoo to complete it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not fut.done():
                fut.set_result(None)

        try:
            result = getattr(self.zk, method + "_async")(*args, **kwargs)
        except (SessionExpiredError, ConnectionClosedError) as exc:
            raise MetadataStoreError(f"ZooKeeper {self.hosts}: {op}: session lost") from exc
        result.rawlink(lambda _r: loop.call_soon_threadsafe(resolve))
        try:
            await asyncio.wait_for(fut, max(deadline - loop.time(), 0.001))
        except TimeoutError:
            raise MetadataStoreError(
                f"ZooKeeper {self.hosts}: {op} timed out after {self.op_timeout}s; "
                "outcome unknown"
            ) from None
        return result

    async def children(self, op: str, path: str) -> list[str]:
        """Sorted children of ``path`` ([] when it was removed meanwhile)."""
        try:
            return sorted(await self.call(op, "get_children", path, expect=(NoNodeError,)))
        except NoNodeError:
            return []

    def last_zxid(self) -> int:
        """The zxid of the newest server response this client has seen: every change
        committed after it has a greater one (watches compare with it)."""
        return int(getattr(self.zk, "last_zxid", 0) or 0)

    # -- kazoo recipes (watches) -----------------------------------------------------------------

    def watch_loop(self) -> asyncio.AbstractEventLoop:
        """The loop watch callbacks go to; starts connecting in the background if needed."""
        if self.closed:
            raise ClientClosedError(f"ZooKeeper metadata store {self.where} is closed")
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
        if not self.started:
            self.spawn(self._ensure_started_quietly())
        return loop

    async def _ensure_started_quietly(self) -> None:
        try:
            await self.ensure_started()
        except (MetadataStoreError, ClientClosedError) as exc:
            log.warning("ZooKeeper watch could not be established: %s", exc)

    def add_recipe(self, make: Callable[[], Any]) -> None:
        """Make a kazoo recipe (a DataWatch, a ChildrenWatch) once connected."""
        if self.started:
            self._spawn_recipe(make)
        else:
            self._pending_recipes.append(make)

    def _spawn_recipe(self, make: Callable[[], Any]) -> None:
        """kazoo recipes do a blocking round trip in their constructor: run it off the loop."""

        async def establish() -> None:
            try:
                await asyncio.to_thread(make)
            except (KazooException, ZookeeperError) as exc:
                log.warning("ZooKeeper watch could not be established: %r", exc)

        self.spawn(establish())

    # -- lifecycle -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel background tasks and close the session (its ephemerals go at once)."""
        if self.closed:
            return
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

        def stop() -> None:
            self.zk.stop()
            self.zk.close()

        await asyncio.to_thread(stop)
