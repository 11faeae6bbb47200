"""The ``pybk`` command (also ``python -m pybk``).

Conventions, so shell users can rely on them: data goes to stdout, progress and diagnostics to
stderr; exit status 0 = done, 1 = the operation failed (one line on stderr naming the cause,
e.g. ``pybk: error: NoSuchLedgerError: ledger 7 does not exist``), 2 = bad usage (click's).
Every command takes ``--metadata URI`` (or ``$PYBK_METADATA``) and the TLS / token options.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click

import pybk
from pybk.errors import BKError

T = TypeVar("T")

_STATE_FILE = "cluster.json"


# --------------------------------------------------------------------------- helpers


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _fail(message: str) -> None:
    click.echo(f"pybk: error: {message}", err=True)
    raise SystemExit(1)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; turn the errors a user can act on into one line and exit status 1."""
    try:
        return asyncio.run(coro)
    except BKError as exc:
        _fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except (ValueError, OSError) as exc:
        _fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    except KeyboardInterrupt:
        _fail("interrupted")
    raise AssertionError("unreachable")


class _Conn:
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
        return _read_token(self.auth_token_file)

    def client(self) -> Any:
        from pybk.client import Client

        return Client(self.metadata, tls=self.ssl_context(), auth_token=self.token())

    def store(self) -> Any:
        from pybk.metadata import open_store

        return open_store(self.metadata)


def _read_token(path: str | None) -> bytes | None:
    if path is None:
        return None
    token = Path(path).read_bytes().strip()
    if not token:
        raise click.BadParameter(f"token file {path} is empty", param_hint="--auth-token-file")
    return token


def client_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--metadata, TLS and token options; passes a ``conn: _Conn``."""

    @click.option(
        "--metadata",
        envvar="PYBK_METADATA",
        required=True,
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
        metadata: str,
        tls_ca: str | None,
        tls_cert: str | None,
        tls_key: str | None,
        auth_token_file: str | None,
        timeout: float,
        **kwargs: Any,
    ) -> Any:
        conn = _Conn(metadata, tls_ca, tls_cert, tls_key, auth_token_file, timeout)
        return fn(conn=conn, **kwargs)

    return wrapper


async def _with_client(conn: _Conn, body: Callable[[Any], Awaitable[T]]) -> T:
    async with conn.client() as client:
        try:
            return await asyncio.wait_for(body(client), conn.timeout)
        except TimeoutError as exc:
            if isinstance(exc, BKError):
                raise
            raise pybk.TimeoutError(
                f"not done within {conn.timeout:g} s (raise --timeout to wait longer)"
            ) from None


# --------------------------------------------------------------------------- the group


@click.group(
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="""\b
Example:
  M=$(pybk cluster up --root /tmp/bk --bookies 3)
  L=$(pybk ledger append --metadata $M hello world)
  pybk ledger read --metadata $M $L
  pybk cluster down --root /tmp/bk""",
)
@click.version_option(pybk.__version__, package_name="pybk")
def main() -> None:
    """pybk: Apache BookKeeper's replicated log, in Python.

    Data goes to stdout, progress and errors to stderr. Exit status: 0 done, 1 the
    operation failed (one line naming the cause), 2 bad usage.
    """


# --------------------------------------------------------------------------- bookie


@main.group(invoke_without_command=True)
@click.option("--data", type=click.Path(file_okay=False), help="Data directory (created).")
@click.option("--port", type=click.IntRange(0, 65535), default=3181, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--metadata", envvar="PYBK_METADATA", help="Metadata store URI.")
@click.option("--bookie-id", help="Stable identity (default host:port; needed with --port 0).")
@click.option("--advertised-host", help="Host name to register (default: --host).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False))
@click.option("--require-client-cert", is_flag=True, help="Mutual TLS.")
@click.option("--auth-token-file", type=click.Path(exists=True, dir_okay=False))
@click.option("--ready-file", type=click.Path(dir_okay=False), help="Write JSON here when ready.")
@click.option("--stop-grace", type=float, default=10.0, show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Prometheus HTTP port.")
@click.option("--segment-mb", type=click.IntRange(1, 1 << 16), default=64, show_default=True,
              help="Journal segment size in MiB.")
@click.option("--preallocate/--no-preallocate", default=True, show_default=True,
              help="Make journal segments ahead of use and write them in place (faster "
                   "syncs; each segment takes its full size on disk from the start).")
@click.pass_context
def bookie(
    ctx: click.Context,
    data: str | None,
    port: int,
    host: str,
    metadata: str | None,
    bookie_id: str | None,
    advertised_host: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    require_client_cert: bool,
    auth_token_file: str | None,
    ready_file: str | None,
    stop_grace: float,
    metrics_port: int | None,
    segment_mb: int,
    preallocate: bool,
) -> None:
    """Run a bookie server (`pybk bookie --data DIR --metadata URI`), or `pybk bookie list`,
    or check a stopped bookie's data directory (`pybk bookie inspect DIR`).

    The server registers itself in the metadata store, prints one JSON line when ready, and
    shuts down cleanly on SIGTERM.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not data or not metadata:
        raise click.UsageError("pybk bookie needs --data DIR and --metadata URI")
    from pybk.server import BookieProcessConfig, run

    config = BookieProcessConfig(
        data_dir=data,
        metadata=metadata,
        port=port,
        host=host,
        bookie_id=bookie_id,
        advertised_host=advertised_host,
        tls_cert=tls_cert,
        tls_key=tls_key,
        tls_ca=tls_ca,
        require_client_cert=require_client_cert,
        auth_token=_read_token(auth_token_file),
        ready_file=ready_file,
        stop_grace=stop_grace,
        metrics_port=metrics_port,
        segment_size=segment_mb << 20,
        preallocate=preallocate,
    )
    try:
        config.resolved_bookie_id()
        config.ssl_context()
    except (ValueError, ssl.SSLError, OSError) as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        code = run(config)
    except BKError as exc:
        _fail(f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        _fail(f"{type(exc).__name__}: {exc}")
    raise SystemExit(code)


@bookie.command("list")
@client_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def bookie_list(conn: _Conn, as_json: bool) -> None:
    """List live bookies (id, address, writable/read-only)."""

    async def go() -> list[Any]:
        store = conn.store()
        try:
            result: list[Any] = await store.list_bookies()
            return result
        finally:
            await store.close()

    regs = _run(go())
    if as_json:
        for r in regs:
            click.echo(
                json.dumps(
                    {"bookie_id": r.bookie_id, "address": r.address, "read_only": r.read_only}
                )
            )
        return
    for r in regs:
        click.echo(f"{r.bookie_id}\t{r.address}\t{'read-only' if r.read_only else 'writable'}")
    if not regs:
        click.echo("no live bookies", err=True)


@bookie.command("inspect")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
def bookie_inspect(data_dir: str, as_json: bool) -> None:
    """Verify a bookie's data directory without changing it: cookie, every journal record,
    the index checkpoint chain against the segments. Exit 1 if anything is damaged.

    Run it on a stopped bookie (or a copy): a start-up repairs what it can (torn tails),
    this only reports."""
    import dataclasses

    from pybk.datadir import inspect_data_dir
    from pybk.storage.fs import OsFileSystem

    fs = OsFileSystem()
    try:
        report = inspect_data_dir(fs, data_dir)
    finally:
        fs.close()
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(report) | {"ok": report.ok}, default=str))
    else:
        _print_inspection(report)
    if not report.ok:
        _fail(f"{len(report.problems)} problem(s) in {data_dir}: {report.problems[0]}")


def _print_inspection(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    console.print(f"data directory {report.data_dir}: bookie {report.bookie_id or '?'}, "
                  f"instance {report.instance_id or '?'}")
    table = Table("segment", "bytes", "batches", "records", "state")
    for seg in report.segments:
        records = ", ".join(f"{name.lower()} {n}" for name, n in sorted(seg.records.items()))
        state = seg.state + (f": {seg.detail}" if seg.detail else "")
        table.add_row(f"{seg.seq:016x}", f"{seg.size:,}", str(seg.batches), records, state)
    console.print(table)
    cp = report.checkpoint
    where = (f" at segment {cp.position.seg} offset {cp.position.offset}"
             if cp.position is not None else "")
    console.print(f"index checkpoint: {cp.state}, generation {cp.generation} + {cp.deltas} "
                  f"delta(s){where}, {cp.ledgers} ledgers, {cp.entries:,} entries"
                  + (f" ({cp.detail})" if cp.detail else ""))
    console.print(f"segments hold {report.ledgers} ledgers ({report.fenced} fenced), "
                  f"{report.deleted} deleted, {report.entries:,} entries")
    for problem in report.problems:
        console.print(f"problem: {problem}")
    if report.ok:
        console.print("sound")


# --------------------------------------------------------------------------- cluster


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _is_our_bookie(pid: int, bookie_id: str) -> bool:
    """Guard against PID reuse: the process must be a pybk bookie with this id."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return _pid_alive(pid)
    return b"bookie" in args and bookie_id.encode() in args


def spawn_bookie(
    root: Path,
    bookie_id: str,
    metadata: str,
    *,
    port: int = 0,
    extra_args: list[str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``pybk bookie`` as a detached process with its log and ready file under root."""
    data = root / "bookies" / bookie_id
    logs = root / "logs"
    run_dir = root / "run"
    for d in (data, logs, run_dir):
        d.mkdir(parents=True, exist_ok=True)
    ready = run_dir / f"{bookie_id}.ready"
    ready.unlink(missing_ok=True)
    args = [
        sys.executable, "-m", "pybk", "bookie",
        "--data", str(data),
        "--port", str(port),
        "--bookie-id", bookie_id,
        "--metadata", metadata,
        "--ready-file", str(ready),
        *(extra_args or []),
    ]  # fmt: skip
    with open(logs / f"{bookie_id}.log", "ab") as log:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def wait_ready(
    root: Path, bookie_id: str, proc: subprocess.Popen[bytes] | None, timeout: float
) -> dict[str, Any]:
    """Wait (bounded) for a bookie's ready file; raise RuntimeError with its log if it died."""
    ready = root / "run" / f"{bookie_id}.ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.exists():
            info: dict[str, Any] = json.loads(ready.read_text())
            return info
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    log_file = root / "logs" / f"{bookie_id}.log"
    tail = (
        log_file.read_text(errors="replace").strip().splitlines()[-5:] if log_file.exists() else []
    )
    why = "exited" if proc is not None and proc.poll() is not None else f"not ready in {timeout}s"
    raise RuntimeError(f"bookie {bookie_id} {why}; log tail: " + " | ".join(tail))


def stop_pid(pid: int, timeout: float) -> str:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; returns how it ended."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "already gone"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return "stopped"
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return "stopped"
    return "killed"


def _load_state(root: Path) -> dict[str, Any]:
    path = root / _STATE_FILE
    if not path.exists():
        return {}
    state: dict[str, Any] = json.loads(path.read_text())
    return state


@main.group()
def cluster() -> None:
    """Start or stop a local cluster of bookie processes."""


@cluster.command("up")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="Cluster dir.")
@click.option("--bookies", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--ready-timeout", type=float, default=60.0, show_default=True)
@click.option("--auth-token-file", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="For every bookie.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False))
@click.option("--require-client-cert", is_flag=True, help="Mutual TLS.")
def cluster_up(
    root: str,
    bookies: int,
    ready_timeout: float,
    auth_token_file: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_ca: str | None,
    require_client_cert: bool,
) -> None:
    """Start BOOKIES bookie processes on free loopback ports with SQLite metadata under ROOT.

    Prints the metadata URI on stdout (use it as --metadata); PIDs go to ROOT/cluster.json.
    """
    root_path = Path(root).resolve()
    root_path.mkdir(parents=True, exist_ok=True)
    previous = _load_state(root_path)
    alive = [
        b for b, info in previous.get("bookies", {}).items()
        if _pid_alive(info["pid"]) and _is_our_bookie(info["pid"], b)
    ]  # fmt: skip
    if alive:
        _fail(f"a cluster is already running under {root_path} ({', '.join(alive)}); "
              f"run `pybk cluster down --root {root}` first")  # fmt: skip
    metadata = f"sqlite://{root_path / 'metadata.db'}"
    extra: list[str] = []
    for flag, value in (
        ("--auth-token-file", auth_token_file),
        ("--tls-cert", tls_cert),
        ("--tls-key", tls_key),
        ("--tls-ca", tls_ca),
    ):
        if value:
            extra += [flag, str(Path(value).resolve())]
    if require_client_cert:
        extra.append("--require-client-cert")
    console = _console()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ids = [f"bookie-{i}" for i in range(1, bookies + 1)]
    for bookie_id in ids:
        procs[bookie_id] = spawn_bookie(root_path, bookie_id, metadata, extra_args=extra)
    state: dict[str, Any] = {"metadata": metadata, "bookies": {}}
    for b, p in procs.items():
        state["bookies"][b] = {"pid": p.pid, "data": str(root_path / "bookies" / b)}
    (root_path / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    try:
        with console.status(f"waiting for {bookies} bookies to register"):
            for bookie_id in ids:
                info = wait_ready(root_path, bookie_id, procs[bookie_id], ready_timeout)
                state["bookies"][bookie_id]["address"] = info["address"]
                console.print(f"{bookie_id} ready at {info['address']} (pid {info['pid']})")
    except RuntimeError as exc:
        for p in procs.values():
            if p.poll() is None:
                stop_pid(p.pid, 5.0)
        _fail(str(exc))
    (root_path / _STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    console.print(f"cluster up; stop it with: pybk cluster down --root {root}")
    click.echo(metadata)


@cluster.command("down")
@click.option("--root", required=True, type=click.Path(file_okay=False), help="Cluster dir.")
@click.option("--timeout", type=float, default=15.0, show_default=True, help="Before SIGKILL.")
def cluster_down(root: str, timeout: float) -> None:
    """Stop the bookies recorded under ROOT (SIGTERM, then SIGKILL after --timeout)."""
    root_path = Path(root).resolve()
    state = _load_state(root_path)
    if not state:
        _fail(f"no cluster recorded under {root_path} (no {_STATE_FILE})")
    for bookie_id, info in sorted(state.get("bookies", {}).items()):
        pid = int(info["pid"])
        if not _pid_alive(pid) or not _is_our_bookie(pid, bookie_id):
            click.echo(f"{bookie_id} (pid {pid}): not running", err=True)
            continue
        click.echo(f"{bookie_id} (pid {pid}): {stop_pid(pid, timeout)}", err=True)
    (root_path / _STATE_FILE).unlink()


# --------------------------------------------------------------------------- ledgers


@main.group()
def ledger() -> None:
    """Create, write, read, recover and delete ledgers."""


@ledger.command("create")
@client_options
@click.option("--ensemble", "-e", type=click.IntRange(1), default=3, show_default=True)
@click.option("--write-quorum", "-w", type=click.IntRange(1), default=2, show_default=True)
@click.option("--ack-quorum", "-a", type=click.IntRange(1), default=2, show_default=True)
@click.option("--digest", type=click.Choice(["CRC32C", "MAC", "DUMMY"]), default="CRC32C")
@click.option("--password", default="", help="Ledger password (needed to write/recover).")
def ledger_create(
    conn: _Conn, ensemble: int, write_quorum: int, ack_quorum: int, digest: str, password: str
) -> None:
    """Create a ledger and print its id. (The ledger stays open: appends from other
    commands go through `pybk ledger append`, which opens a fresh ledger handle.)"""

    async def go(client: Any) -> int:
        lh = await client.create_ledger(
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            digest_type=digest,
            password=password.encode(),
        )
        return int(lh.id)

    click.echo(_run(_with_client(conn, go)))


def _entries_from(data: tuple[str, ...], count: int | None, size: int) -> list[bytes]:
    if data and count:
        raise click.UsageError("give DATA arguments or --count, not both")
    if data == ("-",):
        return [line.rstrip(b"\n") for line in sys.stdin.buffer]
    if data:
        return [d.encode() for d in data]
    if count:
        return [(b"%08d:" % i).ljust(size, b".")[: max(size, 9)] for i in range(count)]
    raise click.UsageError("nothing to append: give DATA arguments, '-' for stdin, or --count")


@ledger.command("append")
@client_options
@click.argument("data", nargs=-1)
@click.option("--count", type=click.IntRange(1), help="Append COUNT generated entries.")
@click.option("--size", type=click.IntRange(1), default=100, show_default=True,
              help="Bytes per generated entry (--count).")  # fmt: skip
@click.option("--ensemble", "-e", type=click.IntRange(1), default=3, show_default=True)
@click.option("--write-quorum", "-w", type=click.IntRange(1), default=2, show_default=True)
@click.option("--ack-quorum", "-a", type=click.IntRange(1), default=2, show_default=True)
@click.option("--password", default="", help="Ledger password (needed to recover it later).")
@click.option("--close/--no-close", default=True, show_default=True, help="Seal when done.")
def ledger_append(
    conn: _Conn,
    data: tuple[str, ...],
    count: int | None,
    size: int,
    ensemble: int,
    write_quorum: int,
    ack_quorum: int,
    password: str,
    close: bool,
) -> None:
    """Write DATA (one entry per argument; '-' reads lines from stdin) to a NEW ledger.

    A ledger has one writer, so appending creates the ledger; prints the ledger id on
    stdout, then closes it (unless --no-close).
    """
    entries = _entries_from(data, count, size)

    async def go(client: Any) -> int:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        lh = await client.create_ledger(
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            password=password.encode(),
        )
        console = _console()
        with Progress(
            *Progress.get_default_columns()[:1],
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,  # no bar (nor its blank line) in pipes and logs
        ) as progress:
            task = progress.add_task(f"ledger {lh.id}", total=len(entries))
            batch = 256
            for i in range(0, len(entries), batch):
                chunk = entries[i : i + batch]
                await asyncio.gather(*(lh.append(e) for e in chunk))
                progress.advance(task, len(chunk))
        if close:
            await lh.close()
        return int(lh.id)

    ledger_id = _run(_with_client(conn, go))
    click.echo(ledger_id)
    click.echo(f"appended {len(entries)} entries to ledger {ledger_id}", err=True)


def _emit(entry: Any, fmt: str) -> None:
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "ledger_id": entry.ledger_id,
                    "entry_id": entry.entry_id,
                    "data": base64.b64encode(entry.data).decode(),
                }
            )
        )
    elif fmt == "raw":
        sys.stdout.buffer.write(entry.data + b"\n")
        sys.stdout.buffer.flush()
    else:
        click.echo(f"{entry.entry_id}\t{entry.data.decode('utf-8', 'backslashreplace')}")


_FORMAT = click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "raw"]), default="text",
    show_default=True, help="text: 'id<TAB>data'; json: base64 data; raw: data lines.",
)  # fmt: skip


@ledger.command("read")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--first", type=click.IntRange(0), default=0, show_default=True)
@click.option("--last", type=int, default=None, help="Default: the last confirmed entry.")
@click.option("--password", default="")
@_FORMAT
def ledger_read(
    conn: _Conn, ledger_id: int, first: int, last: int | None, password: str, fmt: str
) -> None:
    """Print entries FIRST..LAST of LEDGER_ID (without disturbing a writer)."""

    async def go(client: Any) -> list[Any]:
        rh = await client.open_ledger(ledger_id, password=password.encode(), recovery=False)
        end = rh.last_add_confirmed if last is None else last
        out: list[Any] = []
        step = 500
        for lo in range(first, end + 1, step):
            out.extend(await rh.read(lo, min(end, lo + step - 1)))
        return out

    for entry in _run(_with_client(conn, go)):
        _emit(entry, fmt)


@ledger.command("tail")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--start", type=click.IntRange(0), default=0, show_default=True)
@click.option("--password", default="")
@_FORMAT
def ledger_tail(conn: _Conn, ledger_id: int, start: int, password: str, fmt: str) -> None:
    """Follow LEDGER_ID as it is written, printing entries; ends when it is closed."""

    async def go() -> None:
        async with conn.client() as client:
            rh = await client.open_ledger(ledger_id, password=password.encode(), recovery=False)
            async for entry in rh.tail(start=start):
                _emit(entry, fmt)

    _run(go())


@ledger.command("list")
@client_options
def ledger_list(conn: _Conn) -> None:
    """Print every ledger id, one per line."""

    async def go(client: Any) -> list[int]:
        return list(await client.list_ledgers())

    for ledger_id in _run(_with_client(conn, go)):
        click.echo(ledger_id)


def _metadata_doc(md: Any) -> dict[str, Any]:
    return {
        "ledger_id": md.ledger_id,
        "state": md.state,
        "ensemble_size": md.ensemble_size,
        "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum,
        "last_entry_id": md.last_entry_id,
        "length": md.length,
        "digest_type": md.digest_type,
        "ensembles": {str(k): list(v) for k, v in sorted(md.ensembles.items())},
        "custom_metadata": {k: base64.b64encode(v).decode() for k, v in md.custom_metadata.items()},
        "version": md.version,
    }


@ledger.command("show")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
def ledger_show(conn: _Conn, ledger_id: int) -> None:
    """Print LEDGER_ID's metadata as JSON."""

    async def go(client: Any) -> Any:
        return await client.ledger_metadata(ledger_id)

    click.echo(json.dumps(_metadata_doc(_run(_with_client(conn, go))), indent=2))


@ledger.command("recover")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--password", default="")
def ledger_recover(conn: _Conn, ledger_id: int, password: str) -> None:
    """Fence and seal LEDGER_ID (its writer can no longer add); print its last entry id."""

    async def go(client: Any) -> int:
        rh = await client.open_ledger(ledger_id, password=password.encode(), recovery=True)
        return int(rh.last_add_confirmed)

    last = _run(_with_client(conn, go))
    click.echo(last)
    click.echo(f"ledger {ledger_id} is closed; last entry {last}", err=True)


@ledger.command("delete")
@client_options
@click.argument("ledger_id", type=click.IntRange(0))
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def ledger_delete(conn: _Conn, ledger_id: int, yes: bool) -> None:
    """Delete LEDGER_ID (its entries are garbage-collected on the bookies)."""
    if not yes:
        click.confirm(f"delete ledger {ledger_id}?", abort=True, err=True)

    async def go(client: Any) -> None:
        await client.delete_ledger(ledger_id)

    _run(_with_client(conn, go))
    click.echo(f"deleted ledger {ledger_id}", err=True)


def _register_plugins() -> None:
    """Sub-commands that live in other layers (e.g. `pybk simulate` in pybk/sim/cli.py)."""
    import importlib

    try:
        sim_cli = importlib.import_module("pybk.sim.cli")
    except ImportError:
        return
    main.add_command(sim_cli.simulate)


_register_plugins()

if __name__ == "__main__":  # pragma: no cover
    main()
