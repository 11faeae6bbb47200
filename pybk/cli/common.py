"""What every ``pybk`` command shares: connection options, running a coroutine, failing.

Conventions, so shell users can rely on them: data goes to stdout, progress and diagnostics to
stderr; exit status 0 = done, 1 = the operation failed (one line on stderr naming the cause,
e.g. ``pybk: error: NoSuchLedgerError: ledger 7 does not exist``), 2 = bad usage (click's).
Every client-side command takes ``--metadata URI`` (or ``$PYBK_METADATA``) and the TLS / token
options.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

import pybk
from pybk.errors import BKError

__all__ = [
    "Conn",
    "client_options",
    "fail",
    "optional_client_options",
    "read_token",
    "run_async",
    "stderr_console",
    "with_client",
]

T = TypeVar("T")


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def fail(message: str) -> NoReturn:
    click.echo(f"pybk: error: {message}", err=True)
    raise SystemExit(1)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; turn the errors a user can act on into one line and exit status 1."""
    try:
        return asyncio.run(coro)
    except BKError as exc:
        fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except (ValueError, OSError) as exc:
        fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except KeyboardInterrupt:
        fail("interrupted")
    raise AssertionError("unreachable")


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

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        from pybk.transport.tls import client_context

        return client_context(self.tls_ca, certfile=self.tls_cert, keyfile=self.tls_key)

    def token(self) -> bytes | None:
        return read_token(self.auth_token_file)

    def client(self) -> Any:
        from pybk.client import Client

        return Client(self.metadata, tls=self.ssl_context(), auth_token=self.token())

    def store(self) -> Any:
        from pybk.metadata import open_store

        return open_store(self.metadata)


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
        help="Give up (exit 1) after this many seconds.",
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
        conn = Conn(metadata or "", tls_ca, tls_cert, tls_key, auth_token_file, timeout)
        return fn(conn=conn, **kwargs)

    return wrapper


async def with_client(conn: Conn, body: Callable[[Any], Awaitable[T]]) -> T:
    async with conn.client() as client:
        try:
            return await asyncio.wait_for(body(client), conn.timeout)
        except TimeoutError as exc:
            if isinstance(exc, BKError):
                raise
            raise pybk.TimeoutError(
                f"not done within {conn.timeout:g} s (raise --timeout to wait longer)"
            ) from None


