"""What every ``pybk`` command shares: connection options, running a coroutine, failing.

Conventions, so shell users can rely on them: data goes to stdout, progress and diagnostics to
stderr; exit status 0 = done, 1 = the operation failed (one line on stderr naming the cause,
e.g. ``pybk: error: NoSuchLedgerError: ledger 7 does not exist``), 2 = bad usage (click's),
130 = interrupted (Ctrl-C: the command stops cleanly, its ``finally`` blocks run), 141 = the
reader of stdout went away (``pybk ledger tail 7 | head``: quietly). Every client-side command
takes ``--metadata URI`` (or ``$PYBK_METADATA``), the TLS / token options and ``--timeout``,
which bounds the whole command, connecting to the metadata store included. A ``sqlite:///``
store must exist (only ``pybk cluster up`` and ``pybk bookie`` create one), so a mistyped path
is an error rather than a new, empty cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

import pybk
from pybk.errors import BKError

__all__ = [
    "Conn",
    "StdoutClosed",
    "bounded",
    "check_metadata_uri",
    "client_options",
    "echo_data",
    "fail",
    "optional_client_options",
    "printing",
    "read_token",
    "require_existing_store",
    "run_async",
    "serve_metrics",
    "stderr_console",
    "with_client",
    "write_data",
]

T = TypeVar("T")


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def fail(message: str) -> NoReturn:
    click.echo(f"pybk: error: {message}", err=True)
    raise SystemExit(1)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; turn the errors a user can act on into one line and exit status 1,
    Ctrl-C into a clean stop and status 130, a closed stdout into a quiet status 141."""
    try:
        return asyncio.run(_interruptible(coro))
    except _Interrupted:
        click.echo("pybk: interrupted", err=True)
        raise SystemExit(130) from None
    except StdoutClosed:
        _quit_on_closed_stdout()
    except BKError as exc:
        fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except (ValueError, OSError) as exc:
        fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except KeyboardInterrupt:  # (before the loop ran, or a SIGINT handler could not be set)
        click.echo("pybk: interrupted", err=True)
        raise SystemExit(130) from None
    raise AssertionError("unreachable")


class _Interrupted(BaseException):
    """Ctrl-C reached a command: it stopped cleanly and exits 130."""


async def _interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` so that SIGINT cancels it (its ``finally`` blocks and ``async with``
    exits run: writers close, readers stop) and then raises :class:`_Interrupted`. A SIGINT
    that the process inherited as ignored stays ignored."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        if task is not None:
            task.cancel()

    installed = False
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGINT, on_sigint)  # main thread only
            installed = True
    try:
        result = await coro
    except asyncio.CancelledError:
        if interrupted:
            raise _Interrupted() from None
        raise
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)
    if interrupted:
        raise _Interrupted()
    return result


class StdoutClosed(BaseException):
    """Whoever reads our stdout went away (``pybk ledger tail 7 | head``)."""


def echo_data(text: str) -> None:
    """Print a line (or lines) of data on stdout (StdoutClosed if nobody reads it)."""
    try:
        click.echo(text)
    except BrokenPipeError:
        raise StdoutClosed() from None


def write_data(data: bytes) -> None:
    """Write raw data to stdout and flush it (StdoutClosed if nobody reads it)."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        raise StdoutClosed() from None


@contextlib.contextmanager
def printing() -> Iterator[None]:
    """Around printing done after ``run_async``: a closed stdout ends the command quietly."""
    try:
        yield
    except StdoutClosed:
        _quit_on_closed_stdout()


def _quit_on_closed_stdout() -> NoReturn:
    with contextlib.suppress(OSError, ValueError):  # what is still buffered goes nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    raise SystemExit(141) from None


async def bounded(conn: Conn, aw: Awaitable[T], what: str = "not done") -> T:
    """Wait for ``aw`` at most ``--timeout`` seconds (pybk.TimeoutError past it, saying
    ``what`` did not happen)."""
    if conn.timeout == float("inf"):
        return await aw
    try:
        return await asyncio.wait_for(aw, conn.timeout)
    except TimeoutError as exc:
        if isinstance(exc, BKError):
            raise
        raise pybk.TimeoutError(
            f"{what} within {conn.timeout:g} s (raise --timeout to wait longer)"
        ) from None


def check_metadata_uri(ctx: click.Context | None, param: click.Parameter | None,
                       value: str | None) -> str | None:
    """The callback of every ``--metadata`` option: a malformed URI (``sqlite://tmp/x``,
    ``foo://bar``, a bare path) is bad usage (exit 2) naming the URI and the expected forms,
    before the command does anything."""
    if not value:
        return value
    from pybk.metadata.registry import parse_uri

    try:
        parse_uri(value)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


def require_existing_store(uri: str) -> None:
    """A ``sqlite:///path`` URI whose file does not exist is refused (click.BadParameter):
    client commands must not make a new, empty cluster out of a mistyped path."""
    from pybk.metadata.registry import parse_uri

    try:
        scheme, rest = parse_uri(uri)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint="--metadata") from None
    path = scheme.local_path(rest)
    if path is not None and not path.exists():
        raise click.BadParameter(
            f"{path} does not exist (a cluster made with `pybk cluster up --root DIR` keeps "
            "its metadata in DIR/metadata.db)", param_hint="--metadata")


class Conn:
    """Client connection options shared by every client-side command."""

    def __init__(
        self,
        metadata: str,
        tls_ca: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        auth_token_file: str | None,
        timeout: float,
    ) -> None:
        self.metadata = metadata
        self.tls_ca = tls_ca
        self.tls_cert = tls_cert
        self.tls_key = tls_key
        self.auth_token_file = auth_token_file
        self.timeout = timeout
        #: the client's ClientConfig (None: defaults); a command may set it
        self.config: Any = None
        #: --timeout came from the command line or the environment (not its default)
        self.timeout_given = False

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        from pybk.transport.tls import client_context

        return client_context(self.tls_ca, certfile=self.tls_cert, keyfile=self.tls_key)

    def token(self) -> bytes | None:
        return read_token(self.auth_token_file)

    def client(self) -> Any:
        """A :class:`pybk.Client` over :meth:`store` (closed with it)."""
        return _client_owning(self.store(), self.ssl_context(), self.token(), self.config)

    def store(self) -> Any:
        """The metadata store, its connection bounded by ``--timeout`` (ZooKeeper)."""
        from pybk.metadata import open_store

        require_existing_store(self.metadata)
        options: dict[str, Any] = {}
        if self.timeout != float("inf"):
            from pybk.metadata.registry import scheme_of

            options = scheme_of(self.metadata).timeout_options(self.timeout)
        return open_store(self.metadata, **options)


def _client_owning(store: Any, tls: ssl.SSLContext | None, token: bytes | None,
                   config: Any = None) -> Any:
    from pybk.client import Client

    class _OwningClient(Client):
        """A Client that also closes the store the command opened for it."""

        async def close(self) -> None:
            try:
                await super().close()
            finally:
                await store.close()

    return _OwningClient(store, tls=tls, auth_token=token, config=config)


def read_token(path: str | None) -> bytes | None:
    if path is None:
        return None
    token = Path(path).read_bytes().strip()
    if not token:
        raise click.BadParameter(f"token file {path} is empty", param_hint="--auth-token-file")
    return token


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--metadata, TLS and token options; passes a ``conn: Conn``."""
    return _client_options(fn, metadata_required=True)


def optional_client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`client_options` with --metadata optional: ``conn.metadata`` is empty when it is
    left out (a command that can run without a cluster of its own, e.g. ``pybk bench``
    starting an embedded one)."""
    return _client_options(fn, metadata_required=False)


def _client_options(fn: Callable[..., Any], *, metadata_required: bool) -> Callable[..., Any]:

    @click.option(
        "--metadata",
        envvar="PYBK_METADATA",
        required=metadata_required,
        callback=check_metadata_uri,
        help="Metadata store URI (sqlite:///abs/path.db, zk://host:port/root); env PYBK_METADATA.",
    )
    @click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), help="CA bundle.")
    @click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="Client cert.")
    @click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="Client key.")
    @click.option(
        "--auth-token-file",
        envvar="PYBK_AUTH_TOKEN_FILE",
        type=click.Path(exists=True, dir_okay=False),
        help="File holding the bookies' auth token.",
    )
    @click.option(
        "--timeout", type=float, default=30.0, show_default=True,
        help="Give up (exit 1) after this many seconds, connecting included (inf: never).",
    )  # fmt: skip
    @functools.wraps(fn)
    def wrapper(
        metadata: str | None,
        tls_ca: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        auth_token_file: str | None,
        timeout: float,
        **kwargs: Any,
    ) -> Any:
        _quiet_libraries()
        if timeout <= 0:
            raise click.BadParameter(f"must be > 0 (inf: no limit), not {timeout:g}",
                                     param_hint="--timeout")
        conn = Conn(metadata or "", tls_ca, tls_cert, tls_key, auth_token_file, timeout)
        ctx = click.get_current_context(silent=True)
        source = ctx.get_parameter_source("timeout") if ctx is not None else None
        conn.timeout_given = source is not None and source.name != "DEFAULT"
        return fn(conn=conn, **kwargs)

    return wrapper


async def with_client(conn: Conn, body: Callable[[Any], Awaitable[T]]) -> T:
    """``body(client)`` with a client of ``conn``, the whole of it (connecting to the metadata
    store, the body, closing) within ``--timeout``."""

    async def session() -> T:
        async with conn.client() as client:
            return await body(client)

    return await bounded(conn, session())


def _quiet_libraries() -> None:
    """A command says what failed in one line of its own: the retries kazoo logs while
    it cannot reach ZooKeeper are noise there (``PYBK_LOG_LEVEL`` brings them back)."""
    if "PYBK_LOG_LEVEL" not in os.environ:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)


async def serve_metrics(collector: Any, host: str, port: int) -> tuple[Any, int]:
    """Serve ``collector``'s metrics at ``http://host:port/metrics`` (Prometheus' text
    format; port 0: any free one): the aiohttp runner (``await runner.cleanup()`` stops it)
    and the port bound."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(collector)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    await web.SockSite(runner, sock).start()
    return runner, sock.getsockname()[1]
