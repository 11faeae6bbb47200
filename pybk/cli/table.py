"""``pybk table``: serve BookKeeper's table-service protocol, and use tables from the shell.

``pybk table serve --metadata URI --port 4181`` serves the tables of a cluster's metadata
store over gRPC (the official ``apache-bookkeeper-client`` talks to it; needs
``pybk[tables]``); ``--path DIR`` serves embedded tables instead (bookies in the process, as
``pybk.Tables(DIR)``). It prints ``host:port`` on stdout once it listens (and writes
``--ready-file``), and stops on SIGTERM or Ctrl-C, letting its ranges go.

``create|list|delete|get|put|del|incr|scan`` act on a cluster's tables directly (the
conventions of ``pybk log``: data on stdout, exit 1 with one line when it fails). Each takes
its table's ranges over while it runs (the ranges' writer fencing), so a serving table server
takes them back on its next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pybk.cli.common import (
    Conn,
    check_metadata_uri,
    client_options,
    echo_data,
    run_async,
    with_client,
)
from pybk.tables.engine import TablesEngine
from pybk.tables.errors import NamespaceExistsError, NamespaceNotFoundError

__all__ = ["table"]

T = TypeVar("T")


@click.group()
def table() -> None:
    """Key/value tables on logs; BookKeeper's table-service gRPC server."""


@table.command()
@click.option("--metadata", envvar="PYBK_METADATA", callback=check_metadata_uri,
              help="Serve this cluster's tables.")
@click.option("--path", "path", type=click.Path(file_okay=False),
              help="Serve embedded tables under this directory (bookies in this process).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=4181, show_default=True,
              help="gRPC port (0: any free one).")
@click.option("--ready-file", type=click.Path(dir_okay=False),
              help="Write {host, port, pid} here as JSON once listening.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="Serve TLS with this certificate (PEM; with --tls-key).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--max-in-flight", type=click.IntRange(1), default=1024, show_default=True,
              help="Requests served at once; more wait in gRPC's queue.")
@click.option("--checkpoint-every", type=click.IntRange(1), default=10_000, show_default=True,
              help="Checkpoint a range after this many commands.")
@click.option("--http-port", type=click.IntRange(0, 65535), default=None,
              help="Also serve /heartbeat, /metrics, /api/v1/tables/ranges on this port.")
def serve(metadata: str | None, path: str | None, host: str, port: int,
          ready_file: str | None, tls_cert: str | None, tls_key: str | None,
          max_in_flight: int, checkpoint_every: int, http_port: int | None) -> None:
    """Serve BookKeeper's table-service protocol (RootRange, Table, MetaRange services)."""
    if (metadata is None) == (path is None):
        raise click.UsageError("give --metadata URI or --path DIR (one of them)")
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    try:
        import grpc

        from pybk.tables.grpc_server import TableGrpcServer
    except ImportError as exc:
        raise click.UsageError(f"the gRPC server needs pybk[tables] ({exc})") from None
    creds = None
    if tls_cert is not None and tls_key is not None:
        creds = grpc.ssl_server_credentials(
            [(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())])

    async def main() -> None:
        from pybk.tables.api import AsyncTables
        from pybk.tables.http import TableHttp
        from pybk.tables.metrics import TableStats

        stats = TableStats()
        tables = AsyncTables(path, metadata=metadata, checkpoint_every=checkpoint_every,
                             on_event=stats.event)
        async with tables:
            server = TableGrpcServer(tables.engine, host=host, port=port,
                                     max_in_flight=max_in_flight, tls=creds, stats=stats)
            await server.start()
            http = None
            if http_port is not None:
                http = await TableHttp(tables.engine, stats, host=host, port=http_port).start()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGTERM, stop.set)
            try:
                if ready_file is not None:
                    _write_ready(ready_file, {"host": host, "port": server.port,
                                              "pid": os.getpid(),
                                              "http_port": None if http is None else http.port})
                echo_data(f"{host}:{server.port}")
                await stop.wait()
            finally:
                await server.stop(1.0)
                if http is not None:
                    await http.stop()

    run_async(main())


def _write_ready(path: str, info: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)


def _run(conn: Conn, body: Callable[[TablesEngine], Awaitable[T]]) -> T:
    async def session(client: Any) -> T:
        engine = TablesEngine(client)
        try:
            return await body(engine)
        finally:
            await engine.close()

    return run_async(with_client(conn, session))


def _split(name: str) -> tuple[str, str]:
    """``ns/table`` or ``table`` (namespace ``default``)."""
    ns, _, tbl = name.rpartition("/")
    return ns or "default", tbl


def _bytes(text: str) -> bytes:
    return text.encode()


@table.command("create")
@client_options
@click.argument("name")
@click.option("--ranges", type=click.IntRange(1, 1024), default=4, show_default=True)
def create(conn: Conn, name: str, ranges: int) -> None:
    """Create table NAME (``ns/table``; the namespace is made when missing)."""
    ns, tbl = _split(name)

    async def body(e: TablesEngine) -> None:
        try:
            await e.catalog.get_namespace(ns)
        except NamespaceNotFoundError:
            with contextlib.suppress(NamespaceExistsError):
                await e.create_namespace(ns)
        info = await e.catalog.create_table(ns, tbl, ranges)
        echo_data(str(info.table_id))

    _run(conn, body)


@table.command("list")
@client_options
@click.argument("namespace", required=False)
def list_(conn: Conn, namespace: str | None) -> None:
    """List the namespaces, or the tables of NAMESPACE."""
    async def body(e: TablesEngine) -> None:
        names = (await e.catalog.list_namespaces() if namespace is None
                 else await e.catalog.list_tables(namespace))
        for n in names:
            echo_data(n)

    _run(conn, body)


@table.command("delete")
@client_options
@click.argument("name")
def delete(conn: Conn, name: str) -> None:
    """Delete table NAME and its logs."""
    ns, tbl = _split(name)
    _run(conn, lambda e: e.delete_table(ns, tbl))


def _kv_json(kv: Any) -> str:
    value = kv.value if isinstance(kv.value, int) else kv.value.decode(errors="replace")
    return json.dumps({"key": kv.key.decode(errors="replace"), "value": value,
                       "version": kv.version, "create_revision": kv.create_revision,
                       "mod_revision": kv.mod_revision})


@table.command("get")
@client_options
@click.argument("name")
@click.argument("key")
def get(conn: Conn, name: str, key: str) -> None:
    """Print KEY of table NAME as JSON (exit 1 when absent)."""
    ns, tbl = _split(name)

    async def body(e: TablesEngine) -> Any:
        kv, _ = await e.get(await e.catalog.get_table(ns, tbl), _bytes(key))
        return kv

    kv = _run(conn, body)
    if kv is None:
        raise click.ClickException(f"no key {key!r}")
    echo_data(_kv_json(kv))


def _exec(conn: Conn, name: str, cmd: tuple[Any, ...]) -> Any:
    ns, tbl = _split(name)

    async def body(e: TablesEngine) -> Any:
        return await e.execute(await e.catalog.get_table(ns, tbl), cmd)

    return _run(conn, body)


@table.command("put")
@client_options
@click.argument("name")
@click.argument("key")
@click.argument("value")
def put(conn: Conn, name: str, key: str, value: str) -> None:
    """Set KEY to VALUE; prints the revision."""
    echo_data(str(_exec(conn, name, ("put", _bytes(key), _bytes(value)))))


@table.command("del")
@client_options
@click.argument("name")
@click.argument("key")
def del_(conn: Conn, name: str, key: str) -> None:
    """Delete KEY; prints true or false (whether it existed)."""
    echo_data("true" if _exec(conn, name, ("delete", _bytes(key))) else "false")


@table.command("incr")
@client_options
@click.argument("name")
@click.argument("key")
@click.argument("amount", type=int, default=1)
def incr(conn: Conn, name: str, key: str, amount: int) -> None:
    """Add AMOUNT to the counter KEY; prints the new value."""
    echo_data(str(_exec(conn, name, ("incr", _bytes(key), amount))))


@table.command("scan")
@client_options
@click.argument("name")
@click.option("--start", default=None)
@click.option("--end", default=None)
@click.option("--limit", type=click.IntRange(1), default=1000, show_default=True)
def scan(conn: Conn, name: str, start: str | None, end: str | None, limit: int) -> None:
    """Print the keys of NAME in [START, END) as JSON lines."""
    ns, tbl = _split(name)

    async def body(e: TablesEngine) -> Any:
        return await e.scan(await e.catalog.get_table(ns, tbl),
                            None if start is None else _bytes(start),
                            None if end is None else _bytes(end), limit)

    for kv in _run(conn, body):
        echo_data(_kv_json(kv))
