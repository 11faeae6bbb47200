"""The client side of the TCP transport: :class:`TcpTransport`.

One connection per bookie, opened on first use, carrying any number of pipelined requests
matched to responses by request id. Requests sent in one loop iteration leave in one
``write()`` (coalescing). Failures map onto the :class:`pybk.transport.base.Transport`
contract so the replication code reacts exactly as it does in-process:

* cannot resolve / connect / handshake, or the connection drops -> every request pending on
  it fails with :class:`pybk.errors.BookieUnavailableError`;
* no answer within the request's timeout -> :class:`pybk.errors.TimeoutError`;
* the peer breaks the framing -> the connection is dropped (BookieUnavailableError).

Design notes: docs/internals.md, "pybk/transport/tcp.py".
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, cast

from pybk.errors import (
    BKError,
    BookieUnavailableError,
    EntryTooLargeError,
    ProtocolError,
    TimeoutError,
)
from pybk.transport import codec
from pybk.transport.base import (
    Transport,
    read_batch_by_singles,
    settle_add,
    split_batch,
    split_callback,
)
from pybk.transport.deadlines import Deadlines
from pybk.transport.refusals import NEEDS_TOKEN, TLS_VERIFY, TOKEN_REFUSED, Refusal, RefusalLog
from pybk.wire import (
    AddBatchRequest,
    AddCallback,
    AddLike,
    AddRequest,
    AuthRequest,
    BookieInfoRequest,
    BookieInfoResponse,
    ReadBatchRequest,
    ReadRequest,
    Request,
    Response,
    Status,
    add_outcome,
    error_response,
)

if TYPE_CHECKING:
    from pybk.metadata.base import MetadataStore

__all__ = [
    "Resolver",
    "TcpTransport",
    "parse_address",
    "registry_resolver",
]

log = logging.getLogger("pybk.tcp")

Resolver = Callable[[str], Awaitable[str]]

_RESPONSE_SLACK = 64 * 1024
#: an ADD_BATCH frame's length field without its entries: CRC, header, ledger id, key
#: length, count; each entry then adds its id, its length and its body
_BATCH_FIXED = 4 + codec.HEADER_SIZE + 8 + 4 + 4
_BATCH_PER_ENTRY = 12


def _frame_groups(request: AddBatchRequest, max_frame: int) -> list[list[int]]:
    """The entries of ``request`` (by index) in runs whose ADD_BATCH frames fit
    ``max_frame`` (an entry too big for any frame is a run of its own: refused when sent)."""
    fixed = _BATCH_FIXED + len(request.master_key)
    groups: list[list[int]] = []
    run: list[int] = []
    size = fixed
    for i, body in enumerate(request.bodies):
        n = _BATCH_PER_ENTRY + len(body)
        if run and size + n > max_frame:
            groups.append(run)
            run, size = [], fixed
        run.append(i)
        size += n
    groups.append(run)
    return groups


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port); ValueError naming the address."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bookie address must look like host:port, not {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def registry_resolver(store: MetadataStore) -> Resolver:
    """A resolver reading bookie addresses from the metadata store's registry.

    Asked on every (re)connect, so a bookie restarted on another port is found again.
    """

    async def resolve(bookie_id: str) -> str:
        for registration in await store.list_bookies():
            if registration.bookie_id == bookie_id:
                if not registration.address:
                    raise BookieUnavailableError(
                        f"bookie {bookie_id} is registered without a network address: "
                        "it runs inside a LocalCluster's process; reach it with "
                        "cluster.client() or transport=cluster.transport"
                    )
                return registration.address
        raise BookieUnavailableError(f"bookie {bookie_id} is not registered (not running?)")

    return resolve


class _Pending:
    """A request waiting for its answer: settled once (``on_answer(response)`` or
    ``on_fail(error)``), and out of the connection's deadlines when it is."""

    __slots__ = ("on_answer", "on_fail", "request", "token")

    def __init__(self, request: Request, on_answer: Callable[[Response], None],
                 on_fail: Callable[[BKError], None]) -> None:
        self.request = request
        self.on_answer = on_answer
        self.on_fail = on_fail
        self.token = 0


def _future_pending(request: Request, future: asyncio.Future[Response]) -> _Pending:
    def answer(response: Response) -> None:
        if not future.done():
            future.set_result(response)

    def fail(exc: BKError) -> None:
        if not future.done():
            future.set_exception(exc)

    return _Pending(request, answer, fail)


def _add_pending(request: AddLike, on_done: AddCallback) -> _Pending:
    count = len(request.bodies) if type(request) is AddBatchRequest else 1
    return _Pending(request, lambda response: settle_add(on_done, add_outcome(response, count)),
                    lambda exc: settle_add(on_done, exc))


class _ClientConnection(asyncio.Protocol):
    """One TCP connection to one bookie; lives from connect attempt to loss."""

    def __init__(self, owner: TcpTransport, bookie_id: str, slot: int = 0) -> None:
        self.owner = owner
        self.bookie_id = bookie_id
        self.slot = slot  # which of the bookie's pooled connections this is
        self.loop = asyncio.get_running_loop()
        # Responses may carry a little more than a request of the cap (e.g. READ_LAC: the
        # last entry plus the explicit LAC body), hence the slack on the receiving side.
        self.codec = codec.Connection("client", max_frame=owner.max_frame + _RESPONSE_SLACK)
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, _Pending] = {}
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.next_id = 1
        self.closed = False
        self.address = "?"
        self.answered = False  # has the bookie answered anything on this connection?
        self.last_used = self.loop.time()
        self.idle_timer: asyncio.TimerHandle | None = None
        self.auth_id: int | None = None
        #: the newest protocol version the bookie speaks, once it said: the first batch of
        #: adds asks (BOOKIE_INFO with the versions flag); until the answer, and for a bookie
        #: that refuses the flag (version 1), adds go as single ADDs, which every bookie serves
        self.peer_version = 1
        self.versions_id: int | None = None
        self.asked_versions = False
        #: request timeouts: one loop timer for all (pybk.transport.deadlines)
        self.deadlines = Deadlines(self.loop)
        if owner.auth_token is not None:
            self.auth_id = self._enqueue(AuthRequest(owner.auth_token), None, None)

    # -- sending -----------------------------------------------------------------------------

    def _enqueue(self, request: Request, pending: _Pending | None, timeout: float | None,
                 ) -> int:
        request_id = self.next_id
        self.next_id += 1
        self.last_used = self.loop.time()
        frame = codec.encode_request(request_id, request)  # ValueError: caller's bad request
        if len(frame) - 4 > self.owner.max_frame:
            # The bookie would drop the whole connection (and every request on it) for this.
            raise ValueError(
                f"{request.op.name} request of {len(frame)} bytes exceeds the "
                f"{self.owner.max_frame}-byte frame cap"
            )
        if pending is not None:
            self.pending[request_id] = pending
            if timeout is not None:
                pending.token = self.deadlines.add(
                    timeout, lambda: self._expire(request_id))
        if self.transport is not None and not self.flush_scheduled:
            if len(self.pending) <= 1 and not self.out and not self.transport.is_closing():
                # nothing else outstanding (a lone writer): write now, a loop pass sooner;
                # what else this pass sends still goes in one write, at the next one
                self.transport.write(frame)
            else:
                self.out.append(frame)
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)
        else:
            self.out.append(frame)
        return request_id

    def send(
        self, request: Request, future: asyncio.Future[Response], timeout: float | None
    ) -> None:
        if type(request) is ReadBatchRequest and self.peer_version < 2:
            # an older bookie reads one entry per request; the answer is put together here
            self._ask_versions(len(request.entry_ids))

            def single(read: ReadRequest) -> asyncio.Future[Response]:
                fut: asyncio.Future[Response] = self.loop.create_future()
                self._enqueue(read, _future_pending(read, fut), timeout)
                return fut

            _chain(read_batch_by_singles(single, request), future)
            return
        self._enqueue(request, _future_pending(request, future), timeout)

    def _ask_versions(self, entries: int) -> None:
        """Ask the bookie which protocol version it speaks, once, when batching would pay."""
        if not self.asked_versions and entries > 1:
            self.asked_versions = True
            self.versions_id = self._enqueue(BookieInfoRequest(versions=True), None, None)

    def add(self, request: AddLike, on_done: AddCallback, timeout: float | None) -> None:
        """Send an add: one ADD_BATCH frame (or as many as the frame cap needs) to a bookie
        that speaks protocol version 2, else one ADD frame per entry. Never raises: an entry
        no frame can carry is answered EntryTooLargeError."""
        if type(request) is AddRequest:
            self._add_frames([request], [on_done], timeout)
            return
        assert isinstance(request, AddBatchRequest)
        if self.peer_version < 2:
            if len(request.bodies) == 1:  # (a lone writer's: one single ADD, nothing to split)
                self._add_frames(split_batch(request), [on_done], timeout)
                return
            self._ask_versions(len(request.bodies))
            singles = split_batch(request)
            parts = split_callback(on_done, len(singles), [[i] for i in range(len(singles))])
            self._add_frames(singles, parts, timeout)
            return
        groups = _frame_groups(request, self.owner.max_frame)
        if len(groups) == 1:
            self._add_frames([request], [on_done], timeout)
            return
        parts = split_callback(on_done, len(request.bodies), groups)
        chunks = [request if len(g) == len(request.bodies) else AddBatchRequest(
            request.ledger_id, request.master_key, [request.entry_ids[i] for i in g],
            [request.bodies[i] for i in g], request.recovery, request.deferred_sync)
            for g in groups]
        self._add_frames(chunks, parts, timeout)

    def _add_frames(self, requests: Sequence[AddLike], callbacks: Sequence[AddCallback],
                    timeout: float | None) -> None:
        for request, on_done in zip(requests, callbacks, strict=True):
            try:
                self._enqueue(request, _add_pending(request, on_done), timeout)
            except ValueError as exc:  # over the frame cap (or not encodable): refused here
                settle_add(on_done, EntryTooLargeError(
                    f"bookie {self.bookie_id}: {exc} (an entry must fit one frame: see "
                    "ClientConfig.max_entry_size and the transport's max_frame)"))

    def _flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.out[0] if len(self.out) == 1 else b"".join(self.out))
        self.out.clear()

    def _expire(self, request_id: int) -> None:
        entry = self.pending.pop(request_id, None)
        if entry is not None:
            entry.on_fail(TimeoutError(
                f"bookie {self.bookie_id}: no answer to {entry.request.op.name} in time"))

    # -- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; not an asyncio.Transport subclass on every loop (uvloop's is not)
        self.transport = cast(asyncio.Transport, transport)
        if self.out and not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)
        if self.owner.idle_timeout is not None:
            self.idle_timer = self.loop.call_later(self.owner.idle_timeout, self._idle_check)

    def _idle_check(self) -> None:
        """Close the connection ourselves once idle, before the bookie's (longer) idle timeout
        would: a close from the server could race a new request, which would then fail."""
        self.idle_timer = None
        idle_timeout = self.owner.idle_timeout
        if self.closed or idle_timeout is None:
            return
        quiet = self.loop.time() - self.last_used
        if self.pending or self.out or quiet < idle_timeout:
            self.idle_timer = self.loop.call_later(
                max(idle_timeout - quiet, 0.01), self._idle_check
            )
            return
        self.closed = True
        self.owner._forget(self)
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.last_used = self.loop.time()
        try:
            events = self.codec.receive_data(data)
        except ProtocolError as exc:
            self.fail(f"bookie {self.bookie_id} at {self.address} broke the protocol: {exc}")
            return
        for event in events:
            if not isinstance(event, codec.ResponseReceived):
                self.fail(
                    f"bookie {self.bookie_id} at {self.address} sent a malformed response: "
                    f"{getattr(event, 'error', event)}"
                )
                return
            if not self.answered:
                self.answered = True
                self.owner._note_success(self.bookie_id)
            if event.request_id == self.auth_id:
                self.auth_id = None
                if event.response.status != Status.OK:
                    self._refuse_all(event.response.message or "authentication failed",
                                     TOKEN_REFUSED)
                    return
                continue
            if event.request_id == self.versions_id:
                self.versions_id = None
                response = event.response
                if response.status == Status.UNAUTHORIZED:
                    # the bookie wants a token first: it refuses whatever comes before AUTH
                    # and closes, so every request on this connection is refused the same way
                    self._refuse_all(response.message or "authentication required",
                                     NEEDS_TOKEN)
                    return
                if isinstance(response, BookieInfoResponse) and response.protocol_version:
                    self.peer_version = min(response.protocol_version, codec.PROTOCOL_VERSION)
                continue  # (an older bookie refuses the flag: it speaks version 1)
            entry = self.pending.pop(event.request_id, None)
            if entry is None:
                continue  # timed out already
            if event.response.op is not entry.request.op:
                self.fail(
                    f"bookie {self.bookie_id} answered {entry.request.op.name} with "
                    f"{event.response.op.name}"
                )
                return
            self.deadlines.discard(entry.token)
            if event.response.status == Status.UNAUTHORIZED and self.owner.auth_token is None \
                    and "authenticate" in (msg := event.response.message or ""):
                self.owner.refusal_log.record(self.bookie_id, self.address, NEEDS_TOKEN, msg)
            entry.on_answer(event.response)

    def connection_lost(self, exc: Exception | None) -> None:
        why = f": {exc}" if exc else ""
        if not self.answered and not self.closed and self.owner.ssl_context is None:
            self.owner._probe(self)  # dropped unanswered: does the bookie want TLS?
        self.fail(f"connection to bookie {self.bookie_id} at {self.address} lost{why}")

    # -- failure -----------------------------------------------------------------------------

    def _refuse_all(self, message: str, kind: str) -> None:
        """The bookie refused our token: every pending request gets an UNAUTHORIZED answer."""
        self.owner.refusal_log.record(self.bookie_id, self.address, kind, message)
        pending, self.pending = self.pending, {}
        self.deadlines.close()
        for entry in pending.values():
            entry.on_answer(error_response(entry.request, Status.UNAUTHORIZED, message))
        self.fail(message)

    def fail(self, message: str) -> None:
        """Drop the connection; pending requests fail with BookieUnavailableError."""
        if not self.closed:
            self.closed = True
            self.owner._forget(self)
            if not self.answered:  # refused, TLS rejection after connect, reset at once...
                self.owner._note_failure(self.bookie_id)
        if self.transport is not None:
            self.transport.abort()
        pending, self.pending = self.pending, {}
        self.out.clear()
        self.deadlines.close()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        for entry in pending.values():
            entry.on_fail(BookieUnavailableError(message))


class TcpTransport(Transport):
    """:class:`Transport` over asyncio TCP (optionally TLS and token auth).

    ``resolve(bookie_id) -> "host:port"``; :func:`registry_resolver` builds one from a
    metadata store (see :meth:`from_store`). ``timeout=None`` in :meth:`send` means
    ``default_timeout`` (None: wait forever).
    """

    def __init__(
        self,
        resolve: Resolver,
        *,
        ssl_context: ssl.SSLContext | None = None,
        auth_token: bytes | None = None,
        connect_timeout: float = 5.0,
        default_timeout: float | None = 30.0,
        max_frame: int = codec.DEFAULT_MAX_FRAME,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        server_hostname: str | None = None,
        idle_timeout: float | None = 240.0,
        connections_per_bookie: int = 1,
    ) -> None:
        if connect_timeout <= 0:
            raise ValueError(f"connect_timeout must be positive, not {connect_timeout}")
        if auth_token is not None and not auth_token:
            raise ValueError("auth_token must be non-empty (or None)")
        if not isinstance(connections_per_bookie, int) or connections_per_bookie < 1:
            raise ValueError(
                f"connections_per_bookie must be an int >= 1, not {connections_per_bookie!r}"
            )
        self.resolve = resolve
        self.ssl_context = ssl_context
        self.auth_token = auth_token
        self.connect_timeout = connect_timeout
        self.default_timeout = default_timeout
        self.max_frame = max_frame
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.server_hostname = server_hostname
        #: close connections idle this long (below the server's 300 s default); None: never
        self.idle_timeout = idle_timeout
        #: The pool: up to ``connections_per_bookie`` connections per bookie. A request goes to
        #: the connection chosen by its ledger id (BookKeeper's ``numChannelsPerBookie``), so
        #: one ledger's requests to one bookie stay in order on one connection.
        self.connections_per_bookie = connections_per_bookie
        self._conns: dict[tuple[str, int], _ClientConnection] = {}
        self._backoff: dict[str, tuple[float, float]] = {}  # bookie -> (retry_at, next delay)
        self._connects: set[asyncio.Task[None]] = set()
        self._closed = False
        #: bookies that refused this client's credentials (pybk.transport.refusals)
        self.refusal_log = RefusalLog()

    @classmethod
    def from_store(cls, store: MetadataStore, **kwargs: object) -> TcpTransport:
        """A transport resolving bookie ids through ``store``'s registry."""
        return cls(registry_resolver(store), **kwargs)  # type: ignore[arg-type]

    def send(
        self, bookie_id: str, request: Request, timeout: float | None = None
    ) -> asyncio.Future[Response]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Response] = loop.create_future()
        try:
            conn = self._connection(bookie_id, getattr(request, "ledger_id", 0))
        except BookieUnavailableError as exc:
            future.set_exception(exc)
            return future
        conn.send(request, future, self.default_timeout if timeout is None else timeout)
        return future

    def add(self, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None = None) -> None:
        try:
            conn = self._connection(bookie_id, request.ledger_id)
        except BookieUnavailableError as exc:
            settle_add(on_done, exc)
            return
        conn.add(request, on_done, self.default_timeout if timeout is None else timeout)

    def _connection(self, bookie_id: str, ledger_id: int) -> _ClientConnection:
        """The pooled connection a ledger's requests to ``bookie_id`` use, opened on first use;
        BookieUnavailableError when closed or backing off after a failed connect."""
        if self._closed:
            raise BookieUnavailableError("transport is closed")
        slot = ledger_id % self.connections_per_bookie
        conn = self._conns.get((bookie_id, slot))
        if conn is None:
            loop = asyncio.get_running_loop()
            retry_at, _ = self._backoff.get(bookie_id, (0.0, 0.0))
            if loop.time() < retry_at:
                self.refusal_log.touch(bookie_id)  # (a refusal is why it backs off)
                raise BookieUnavailableError(f"bookie {bookie_id} unreachable (backing off)")
            conn = _ClientConnection(self, bookie_id, slot)
            self._conns[(bookie_id, slot)] = conn
            task = loop.create_task(self._connect(conn))
            self._connects.add(task)
            task.add_done_callback(self._connects.discard)
        return conn

    async def _connect(self, conn: _ClientConnection) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                address = await self.resolve(conn.bookie_id)
                conn.address = address
                host, port = parse_address(address)
                await loop.create_connection(
                    lambda: conn,
                    host,
                    port,
                    ssl=self.ssl_context,
                    server_hostname=(
                        (self.server_hostname or host) if self.ssl_context is not None else None
                    ),
                )
        except asyncio.CancelledError:
            conn.fail(f"connecting to bookie {conn.bookie_id} was cancelled")
            raise
        except Exception as exc:  # refused, unreachable, TLS handshake, resolver/metadata...
            log.info("cannot connect to bookie %s (%s): %r", conn.bookie_id, conn.address, exc)
            if isinstance(exc, ssl.SSLCertVerificationError):
                self.refusal_log.record(conn.bookie_id, conn.address, TLS_VERIFY,
                                        str(exc.verify_message or exc))
            elif self.ssl_context is not None and isinstance(
                    exc, ssl.SSLError | ConnectionResetError | ConnectionAbortedError):
                self._probe(conn)  # the handshake failed: is the bookie plain TCP?
            elif not isinstance(exc, ssl.SSLError | ConnectionResetError | ConnectionAbortedError):
                self.refusal_log.forget(conn.bookie_id)  # unreachable: its refusal is moot
            if isinstance(exc, BookieUnavailableError):
                conn.fail(str(exc))
            else:
                reason = str(exc) or type(exc).__name__
                conn.fail(f"cannot connect to bookie {conn.bookie_id} at {conn.address}: {reason}")
            return
        if conn.closed and conn.transport is not None:  # lost while connecting (close())
            conn.transport.abort()

    def _note_failure(self, bookie_id: str) -> None:
        """A connection failed before any answer: back off (doubling) before the next try."""
        _, delay = self._backoff.get(bookie_id, (0.0, self.backoff_initial))
        loop = asyncio.get_running_loop()
        self._backoff[bookie_id] = (loop.time() + delay, min(delay * 2, self.backoff_max))

    def _note_success(self, bookie_id: str) -> None:
        """The bookie answered: the next failure starts backing off from the beginning."""
        self._backoff.pop(bookie_id, None)
        self.refusal_log.forget(bookie_id)

    def _probe(self, conn: _ClientConnection) -> None:  # (conn.address: it connected)
        self.refusal_log.probe(conn.bookie_id, conn.address, *parse_address(conn.address),
                               self.connect_timeout, tls=self.ssl_context is None)

    async def refusals(self, since: float | None = None) -> list[Refusal]:
        return await self.refusal_log.settled(since)

    def _forget(self, conn: _ClientConnection) -> None:
        if self._conns.get((conn.bookie_id, conn.slot)) is conn:
            del self._conns[(conn.bookie_id, conn.slot)]

    def connected_bookies(self) -> list[str]:
        """Bookies with an open connection (sorted)."""
        return sorted({b for (b, _), c in self._conns.items() if c.transport is not None})

    async def close(self) -> None:
        self._closed = True
        for task in list(self._connects):
            task.cancel()
        for conn in list(self._conns.values()):
            conn.fail("transport closed")
        if self._connects:
            await asyncio.gather(*self._connects, return_exceptions=True)
        await self.refusal_log.close()


def _chain(src: asyncio.Future[Response], dst: asyncio.Future[Response]) -> None:
    """Settle ``dst`` as ``src`` settles."""

    def copy(f: asyncio.Future[Response]) -> None:
        if dst.done():
            return
        exc = f.exception()
        if exc is not None:
            dst.set_exception(exc)
        else:
            dst.set_result(f.result())

    src.add_done_callback(copy)
