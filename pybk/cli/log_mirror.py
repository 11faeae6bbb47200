"""``pybk log mirror --from URI --to URI LOG``: copy a log to another cluster, exactly once.

Runs as a service until SIGTERM or Ctrl-C (exit 0 after a clean stop), restarting the mirror
after failures of either cluster (:class:`pybk.ops.mirror.MirrorService`); ``--drain`` copies
up to the source's last record as of now and exits (the failover step, docs/logs.md). The
target log is created with the source's configuration when it does not exist. A JSON line
``{"event": "ready", ...}`` on stdout says it started (with the metrics port when
``--metrics-port`` serves Prometheus metrics at ``/metrics``); on exit the last source
position the target holds is printed (``-``: none).

Exit status: 0 after a clean stop or drain; 1 for an error retrying cannot heal (a target
that is not a mirror's, a source truncated past the copy); 2 for bad usage;
:data:`EXIT_REFUSED` (3) when a cluster refused the mirror's credentials (its bookies want
TLS, their certificate fails verification, a token is missing or refused): the message says
which side, which bookie, and which option to pass or check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from pybk.cli.common import Conn, check_metadata_uri, echo_data, fail, printing
from pybk.cli.log import log
from pybk.errors import BKError
from pybk.logs.mirror import MirrorAccessError
from pybk.logs.namespace import check_name

__all__ = ["EXIT_REFUSED", "log_mirror", "refusal_hint"]

#: the exit status of a mirror whose credentials a cluster refused (retrying cannot help)
EXIT_REFUSED = 3


def refusal_hint(exc: MirrorAccessError) -> str:
    """What to pass or check, in this command's options, for a refusal."""
    p, cluster = ("--from", "source") if exc.side == "source" else ("--to", "target")
    hints = {
        "needs-tls": f"pass {p}-tls-ca FILE (the CA of the {cluster} cluster's bookies; "
                     f"{p}-tls-cert and {p}-tls-key too if they want a client certificate)",
        "no-tls": f"drop {p}-tls-ca, {p}-tls-cert and {p}-tls-key: the {cluster} "
                  "cluster's bookies do not speak TLS",
        "tls-verify": f"check {p}-tls-ca: it must hold the CA that signed the {cluster} "
                      "bookies' certificates",
        "needs-token": f"pass {p}-auth-token-file FILE (the {cluster} cluster's token)",
        "token-refused": f"check {p}-auth-token-file: the {cluster} bookies do not accept "
                         "its token",
        "unauthorized": f"check the {cluster} cluster's credentials ({p}-tls-ca, "
                        f"{p}-auth-token-file) and that the log is that cluster's",
    }
    return "; ".join(hints[k] for k in exc.kinds)


def _refused(exc: MirrorAccessError) -> None:
    click.echo(f"pybk: error: {type(exc).__name__}: {exc}: {refusal_hint(exc)}", err=True)
    raise SystemExit(EXIT_REFUSED)


def _name(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None:
        return value
    what = "namespace" if param.name and "namespace" in param.name else "log"
    try:
        return check_name(what, value)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def side_options(side: str, cluster: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The TLS and token options of one side's cluster (its bookies may differ from the
    other's: another CA, another token)."""
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        for key, what in reversed((("tls_ca", "CA bundle"), ("tls_cert", "client certificate"),
                                   ("tls_key", "client key"),
                                   ("auth_token_file", "file holding the token"))):
            flag = f"--{side}-{key.replace('_', '-')}"
            fn = click.option(flag, f"{side}_{key}", default=None,
                              type=click.Path(exists=True, dir_okay=False),
                              help=f"The {cluster} cluster's {what}.")(fn)
        return fn
    return add


@log.command("mirror")
@click.option("--from", "source_uri", required=True, callback=check_metadata_uri,
              metavar="URI", help="The source cluster's metadata store URI.")
@click.option("--to", "target_uri", required=True, callback=check_metadata_uri,
              metavar="URI", help="The target cluster's metadata store URI.")
@click.argument("name", callback=_name)
@click.option("--namespace", "-n", default="default", show_default=True, callback=_name,
              help="The source log's namespace.")
@click.option("--to-namespace", default=None, callback=_name,
              help="The target log's namespace (default: the source's).")
@click.option("--to-log", default=None, callback=_name,
              help="The target log's name (default: the source's).")
@click.option("--drain", is_flag=True,
              help="Copy up to the source's last record as of now, then exit.")
@click.option("--batch", type=click.IntRange(1, 100_000), default=1000, show_default=True,
              help="Records read from the source per batch.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (0: any free one).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the metrics endpoint listens on.")
@click.option("--timeout", type=click.FloatRange(0, min_open=True), default=30.0,
              show_default=True, help="Bound on connecting to each metadata store.")
@side_options("from", "source")
@side_options("to", "target")
def log_mirror(source_uri: str, target_uri: str, name: str, namespace: str,
               to_namespace: str | None, to_log: str | None, drain: bool, batch: int,
               metrics_port: int | None, metrics_host: str, timeout: float,
               **security: str | None) -> None:
    """Copy log NAME from the cluster of --from to the cluster of --to, in order and
    exactly once, following its tail until stopped (or until its stream ends).

    Every target record carries the source position it copies, so a restart (after a crash
    of this process, of bookies or of the network) resumes exactly where the target ends.
    Failures of bookies or the network are retried; refused credentials (no TLS where the
    bookies want it, a certificate failing verification, a missing or refused token) stop
    it with exit status 3 and a line naming the side, the bookie and the option to pass."""
    if source_uri == target_uri and (to_namespace or namespace) == namespace and (
            to_log or name) == name:
        raise click.UsageError("--from and --to name the same log: nothing to mirror")
    from pybk.cli.common import require_existing_store

    for uri, option in ((source_uri, "--from"), (target_uri, "--to")):
        try:
            require_existing_store(uri)
        except click.BadParameter as exc:
            exc.param_hint = option
            raise
    logging.basicConfig(level=os.environ.get("PYBK_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    src, dst = (Conn(uri, security[f"{side}_tls_ca"], security[f"{side}_tls_cert"],
                     security[f"{side}_tls_key"], security[f"{side}_auth_token_file"], timeout)
                for uri, side in ((source_uri, "from"), (target_uri, "to")))
    try:
        last = asyncio.run(_serve(src, dst, name, namespace, to_namespace or namespace,
                                  to_log or name, drain, batch, metrics_port, metrics_host))
    except MirrorAccessError as exc:  # one line, exit 3: restarting would not help
        _refused(exc)
    except (BKError, ValueError, OSError, TimeoutError) as exc:  # one line, exit 1
        fail(f"{type(exc).__name__}: {exc or 'no detail'}")
    with printing():
        echo_data("-" if last is None else str(last))


async def _serve(src: Conn, dst: Conn, name: str, namespace: str, to_namespace: str,
                 to_name: str, drain: bool, batch: int, metrics_port: int | None,
                 metrics_host: str) -> Any:
    from pybk.logs.mirror import open_target
    from pybk.ops.mirror import MirrorService

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with src.client() as sc, dst.client() as dc:
        source = await asyncio.wait_for(sc.namespace(namespace).open_log(name), src.timeout)
        target = await asyncio.wait_for(open_target(source, dc.namespace(to_namespace), to_name),
                                        dst.timeout)
        service = MirrorService(source, target, name=f"{namespace}/{name}",
                                batch_records=batch,
                                label=f"mirror-{socket.gethostname()}-{os.getpid()}")
        http = None
        if metrics_port is not None:
            http = await _metrics_server(service, metrics_host, metrics_port)
        try:
            ready = {"event": "ready", "pid": os.getpid(), "source": f"{namespace}/{name}",
                     "target": f"{to_namespace}/{to_name}"}
            if http is not None:
                ready["metrics_port"] = http[1]
            print(json.dumps(ready), flush=True)
            work = loop.create_task(service.drain() if drain else service.run())
            stopper = loop.create_task(stop.wait())
            await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
            else:
                work.result()
            return await service.mirror.resume_position()
        finally:
            if http is not None:
                await http[0].cleanup()


async def _metrics_server(service: Any, host: str, port: int) -> tuple[Any, int]:
    from pybk.cli.common import serve_metrics
    from pybk.ops.mirror import MirrorCollector

    return await serve_metrics(MirrorCollector(lambda: [(service.name, service.stats)]),
                               host, port)
