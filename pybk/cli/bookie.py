"""``pybk bookie``: run a bookie server, list live bookies, inspect a data directory."""

from __future__ import annotations

import json
import ssl
from typing import Any

import click

from pybk.cli.autorecovery import autorecovery_options, placement_options
from pybk.cli.common import (
    Conn,
    check_metadata_uri,
    client_options,
    fail,
    read_token,
    run_async,
    with_client,
)
from pybk.cli.limits import ByteSize, server_config_from, server_limit_options
from pybk.errors import BKError
from pybk.metadata.base import check_group, check_rack
from pybk.runtime.eventloop import DEFAULT_LOOP, LOOPS, LoopUnavailableError, loop_factory
from pybk.storage.config import STORAGE_ENGINES

__all__ = ["bookie"]


def http_options(fn: Any) -> Any:
    """``--http-port`` and the HTTP admin endpoint's bounds; passes ``http_port`` and
    ``http_config`` (a pybk.server.http.HttpConfig)."""
    import functools

    @click.option("--http-port", type=click.IntRange(0, 65535), default=None,
                  help="Serve the HTTP admin endpoint (/heartbeat, /metrics, /api/v1/...) "
                       "on this port (0: any free one).")
    @click.option("--http-token-file", type=click.Path(exists=True, dir_okay=False),
                  help="Token the endpoint's mutating (PUT) requests must bear.")
    @click.option("--http-max-connections", type=click.IntRange(1), default=64,
                  show_default=True)
    @click.option("--http-max-connections-per-ip", type=click.IntRange(1), default=8,
                  show_default=True, help="Connections from one address.")
    @click.option("--http-allow-open-admin", is_flag=True,
                  help="Serve mutating requests with no token on a non-loopback address "
                       "(default: refused unless --http-token-file; on loopback, allowed).")
    @click.option("--http-max-requests", type=click.IntRange(1), default=32,
                  show_default=True, help="Requests in flight at once.")
    @click.option("--http-max-body", type=click.IntRange(1), default=64 << 10,
                  show_default=True, help="Largest request body, bytes.")
    @click.option("--http-keepalive", type=click.FloatRange(0, min_open=True), default=15.0,
                  show_default=True, help="Seconds an idle connection is kept open.")
    @functools.wraps(fn)
    def wrapper(*args: Any, http_port: int | None, http_token_file: str | None,
                http_max_connections: int, http_max_connections_per_ip: int,
                http_allow_open_admin: bool, http_max_requests: int, http_max_body: int,
                http_keepalive: float, **kwargs: Any) -> Any:
        from pybk.server.http import HttpConfig

        config = HttpConfig(token=read_token(http_token_file),
                            max_connections=http_max_connections,
                            max_connections_per_ip=http_max_connections_per_ip,
                            allow_open_admin=http_allow_open_admin,
                            max_requests_in_flight=http_max_requests,
                            max_body_bytes=http_max_body, keepalive_timeout=http_keepalive)
        return fn(*args, http_port=http_port, http_config=config, **kwargs)

    return wrapper


@click.group(invoke_without_command=True)
@click.option("--data", type=click.Path(file_okay=False), help="Data directory (created).")
@click.option("--port", type=click.IntRange(0, 65535), default=3181, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--metadata", envvar="PYBK_METADATA", callback=check_metadata_uri,
              help="Metadata store URI.")
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
@click.option("--scrub-rate", type=ByteSize(), default="8MiB", show_default=True,
              help="Bytes a second the local scrubber verifies (0: none).")
@click.option("--scrub-interval", type=click.FloatRange(min=0.001), default=3600.0,
              show_default=True, help="Seconds between the scrubber's passes (one at start).")
@click.option("--segment-mb", type=click.IntRange(1, 1 << 16), default=64, show_default=True,
              help="Journal segment size in MiB.")
@click.option("--preallocate/--no-preallocate", default=True, show_default=True,
              help="Make journal segments ahead of use and write them in place (faster "
                   "syncs; each segment takes its full size on disk from the start).")
@click.option("--storage", type=click.Choice(STORAGE_ENGINES), default="journal", show_default=True,
              help="Storage engine: journal (entries read from the journal) or db (write "
                   "cache flushed into entry logs sorted per ledger, on-disk index).")
@click.option("--rack", default="", help="Network location /region/rack (rack-aware placement).")
@click.option("--group", default="", help="Isolation group (namespaces bound to it place "
                                          "their ledgers on its bookies only).")
@click.option("--session-timeout", type=click.FloatRange(0, min_open=True), default=None,
              help="Seconds after which a dead bookie leaves the bookie list (SQLite lease, "
                   "ZooKeeper session; default 10).")
@click.option("--autorecovery", "run_autorecovery", is_flag=True,
              help="Also run auto-recovery here (an auditor candidate and a worker).")
@http_options
@autorecovery_options
@placement_options
@click.option("--loop", type=click.Choice(LOOPS), default=DEFAULT_LOOP, show_default=True,
              help="Event loop; uvloop needs pip install 'pybk[speed]'.")
@server_limit_options
@click.option("--tenant-tokens", "tenant_tokens", type=click.Path(dir_okay=False),
              help="File of 'tenant:token' lines: a client authenticating with a token "
                   "is that tenant (docs/tenancy.md).")
@click.option("--tenant-subjects", "tenant_subjects", type=click.Path(dir_okay=False),
              help="File of 'tenant:CN' lines: a client certificate whose subject common "
                   "name is CN is that tenant (mutual TLS).")
@click.option("--no-tenancy", "no_tenancy", is_flag=True,
              help="Do not enforce namespace ownership, rates or storage quotas.")
@click.pass_context
def bookie(
    ctx: click.Context,
    /,
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
    scrub_rate: int,
    scrub_interval: float,
    segment_mb: int,
    preallocate: bool,
    storage: str,
    rack: str,
    group: str,
    session_timeout: float | None,
    run_autorecovery: bool,
    http_port: int | None,
    http_config: Any,
    autorecovery_config: Any,
    placement: Any,
    loop: str,
    tenant_tokens: str | None,
    tenant_subjects: str | None,
    no_tenancy: bool,
    **limits: Any,
) -> None:
    """Run a bookie server (`pybk bookie --data DIR --metadata URI`), or `pybk bookie list`,
    or check a stopped bookie's data directory (`pybk bookie inspect DIR`).

    The server registers itself in the metadata store, prints one JSON line when ready, and
    shuts down cleanly on SIGTERM. Every bound on what a peer can make it hold (connections,
    requests, bytes in flight, long polls, descriptors, deadlines) is an option below.
    """
    if ctx.invoked_subcommand is not None:
        return
    if not data or not metadata:
        raise click.UsageError("pybk bookie needs --data DIR and --metadata URI")
    from pybk.server.process import BookieProcessConfig, run
    from pybk.transport.identity import Identities

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
        auth_token=read_token(auth_token_file),
        ready_file=ready_file,
        stop_grace=stop_grace,
        metrics_port=metrics_port,
        scrub_rate=scrub_rate,
        scrub_interval=scrub_interval,
        segment_size=segment_mb << 20,
        preallocate=preallocate,
        storage=storage,
        rack=rack,
        group=group,
        session_timeout=session_timeout,
        autorecovery=run_autorecovery,
        autorecovery_config=autorecovery_config,
        http_port=http_port,
        http_config=http_config,
        placement=placement,
        server_config=server_config_from(limits, stop_grace=stop_grace),
        tenant_tokens=tenant_tokens,
        tenant_subjects=tenant_subjects,
        tenancy=not no_tenancy,
    )
    try:
        config.resolved_bookie_id()
        config.ssl_context()
        Identities.from_files(tenant_tokens, tenant_subjects)  # (bad lines: said now)
        check_rack(rack)
        check_group(group)
        loop_factory(loop)
    except (ValueError, ssl.SSLError, OSError, LoopUnavailableError) as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        code = run(config, loop)
    except BKError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        fail(f"{type(exc).__name__}: {exc}")
    raise SystemExit(code)


@bookie.command("list")
@client_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def bookie_list(conn: Conn, as_json: bool) -> None:
    """List live bookies (id, address, writable/read-only, rack, group). A bookie that died
    without a clean stop leaves the list when its session/lease times out."""

    async def go() -> list[Any]:
        store = conn.store()
        try:
            result: list[Any] = await store.list_bookies()
            return result
        finally:
            await store.close()

    regs = run_async(go())
    if as_json:
        for r in regs:
            click.echo(
                json.dumps(
                    {"bookie_id": r.bookie_id, "address": r.address, "read_only": r.read_only,
                     "state": "read-only" if r.read_only else "writable", "rack": r.rack,
                     "group": r.group}
                )
            )
        return
    for r in regs:
        state = "read-only" if r.read_only else "writable"
        click.echo(f"{r.bookie_id}\t{r.address}\t{state}\t{r.rack or '-'}\t{r.group or '-'}")
    if not regs:
        click.echo("no live bookies", err=True)


@bookie.command("gc")
@client_options
@click.option("--bookie", "bookie_id", default=None,
              help="One bookie's id (default: every registered bookie).")
@click.option("--status", "status_only", is_flag=True,
              help="Only print each bookie's garbage collector status.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per bookie and line.")
def bookie_gc(conn: Conn, bookie_id: str | None, status_only: bool, as_json: bool) -> None:
    """Run the bookies' garbage collectors now: delete the ledgers the metadata no longer
    has, then compact (major). Bookies also do this on their own (every gc_interval, and at
    once under disk pressure). Exit 1 if a bookie did not answer within --timeout."""
    wait = 600.0 if conn.timeout == float("inf") else 0.8 * conn.timeout

    async def go(client: Any) -> dict[str, dict[str, Any]]:
        admin = client.admin()
        if status_only:
            status: dict[str, dict[str, Any]] = await admin.gc_status()
            return status if bookie_id is None else {bookie_id: status.get(
                bookie_id, {"error": f"bookie {bookie_id} is not registered"})}
        done: dict[str, dict[str, Any]] = await admin.collect_garbage(bookie_id, timeout=wait)
        return done

    results = run_async(with_client(conn, go))
    if not results:
        click.echo("no live bookies", err=True)
    for b, result in results.items():
        if as_json:
            click.echo(json.dumps({"bookie": b, **result}))
        elif "error" in result:
            click.echo(f"{b}\terror: {result['error']}")
        elif status_only:
            click.echo(f"{b}\truns {result.get('runs', 0)}, ledgers removed "
                       f"{result.get('ledgers_removed', 0)}, {result.get('bytes_reclaimed', 0):,} "
                       f"bytes reclaimed, {result.get('entries_moved', 0):,} entries moved, "
                       f"running: {str(result.get('running', False)).lower()}, last run "
                       f"{result.get('last_run_ago')} s before publishing")
        else:
            click.echo(f"{b}\tremoved {len(result['ledgers_removed'])} ledgers, compacted "
                       f"{len(result['segments_compacted'])} segments, "
                       f"{result['bytes_reclaimed']:,} bytes reclaimed, "
                       f"{result['entries_moved']:,} entries moved in {result['seconds']:.3f} s")
    failed = [b for b, r in results.items() if "error" in r]
    if failed:
        fail(f"{len(failed)} bookie(s) did not answer: {', '.join(failed)}")


@bookie.command("inspect")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="The report as one JSON object.")
def bookie_inspect(data_dir: str, as_json: bool) -> None:
    """Verify a bookie's data directory without changing it: cookie, every journal record,
    the index checkpoint chain against the segments. Exit 1 if anything is damaged.

    Run it on a stopped bookie (or a copy): a start-up repairs what it can (torn tails),
    this only reports."""
    import dataclasses

    from pybk.bookie.inspect import inspect_data_dir
    from pybk.runtime.dirlock import holder_of
    from pybk.storage import OsFileSystem

    holder = holder_of(data_dir)
    if holder is not None:
        click.echo(f"pybk: warning: {data_dir} is in use by process {holder} (a running "
                   "bookie): it changes while being read, so this report may show damage "
                   "that is not there; stop the bookie first or inspect a copy", err=True)

    fs = OsFileSystem()
    try:
        report = inspect_data_dir(fs, data_dir)
    finally:
        fs.close()
    if as_json:
        doc = dataclasses.asdict(report) | {"ok": report.ok}
        for seg, out in zip(report.segments, doc["segments"], strict=True):
            out["dead_bytes"] = seg.dead_bytes
        click.echo(json.dumps(doc, default=str))
    else:
        _print_inspection(report)
    if not report.ok:
        fail(f"{len(report.problems)} problem(s) in {data_dir}: {report.problems[0]}")


def _print_db_inspection(console: Any, report: Any) -> None:
    """A db bookie's part: its entry logs and checkpoint (the journal after its mark above)."""
    from rich.table import Table

    table = Table("entry log", "bytes", "live", "rows", "ledgers", "damaged", "state")
    for lg in report.entry_logs:
        state = lg.state + (f": {lg.detail}" if lg.detail else "")
        table.add_row(f"{lg.log_id:016d}", f"{lg.size:,}", f"{lg.live_bytes:,}",
                      f"{lg.rows:,}", str(lg.ledgers), str(lg.damaged), state)
    console.print(table)
    cp = report.checkpoint
    where = (f" at segment {cp.position.seg} offset {cp.position.offset}"
             if cp.position is not None else "")
    console.print(f"db checkpoint: {cp.state}{where}, {cp.ledgers} ledgers "
                  f"({report.fenced} fenced), {report.deleted} deleted, {cp.entries:,} entries "
                  f"in entry logs" + (f" ({cp.detail})" if cp.detail else ""))
    console.print(f"entries: {report.entries:,} (entry logs and the journal after the mark)")
    for problem in report.problems:
        console.print(f"problem: {problem}")
    if report.ok:
        console.print("sound")


def _print_inspection(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    console.print(f"data directory {report.data_dir}: bookie {report.bookie_id or '?'}, "
                  f"instance {report.instance_id or '?'}")
    table = Table("segment", "bytes", "live", "dead", "batches", "records", "state")
    for seg in report.segments:
        records = ", ".join(f"{name.lower()} {n}" for name, n in sorted(seg.records.items()))
        state = seg.state + (f": {seg.detail}" if seg.detail else "")
        live = f"{seg.live_bytes:,} ({seg.live_bytes / max(seg.size, 1):.0%})"
        table.add_row(f"{seg.seq:016x}", f"{seg.size:,}", live, f"{seg.dead_bytes:,}",
                      str(seg.batches), records, state)
    console.print(table)
    if report.storage == "db":
        _print_db_inspection(console, report)
        return
    live = sum(seg.live_bytes for seg in report.segments)
    total = sum(seg.size for seg in report.segments)
    console.print(f"journal: {total:,} bytes, {live:,} live, {total - live:,} dead "
                  "(what compaction can give back)")
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


