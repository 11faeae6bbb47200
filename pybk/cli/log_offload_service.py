"""``pybk log offload-service``: run :class:`pybk.ops.offloader.OffloadService` over the logs
of some namespaces (each log offloaded as its triggers say, its bookie copies deleted after the
deletion lag), with Prometheus metrics. Registered on the ``pybk log`` group by
:mod:`pybk.cli`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any

import click

from pybk.cli.common import Conn, bounded, client_options, echo_data, printing, run_async
from pybk.cli.log import log
from pybk.cli.log_tier import check_namespace

__all__ = ["log_offload_service"]


@log.command("offload-service")
@client_options
@click.option("--namespace", "-n", "namespaces", multiple=True, default=("default",),
              show_default=True, callback=check_namespace,
              help="A namespace whose logs it offloads (repeat for more).")
@click.option("--interval", type=click.FloatRange(0, min_open=True), default=60.0,
              show_default=True, help="Seconds between rounds.")
@click.option("--once", is_flag=True, help="One round, then print each log's progress.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (0: any free one).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the metrics endpoint listens on.")
def log_offload_service(conn: Conn, namespaces: tuple[str, ...], interval: float, once: bool,
                        metrics_port: int | None, metrics_host: str) -> None:
    """Offload the logs of the namespaces as their offload triggers say (`pybk log offload
    --threshold-bytes/--threshold-seconds`, or the namespace's policies), and delete the
    bookies' copies after the deletion lag: what a log's writer does for its own log, for
    logs nobody writes to. Runs until SIGTERM or Ctrl-C (or one round with --once); prints
    each log's progress as JSON when it stops."""
    from pybk.ops.offloader import OffloadService

    logging.basicConfig(level=os.environ.get("PYBK_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def go() -> dict[str, Any]:
        async with conn.client() as client:
            service = OffloadService(client, namespaces, interval=interval)
            if once:
                await bounded(conn, service.run_once())
            else:
                await _serve(service, metrics_host, metrics_port)
            return service.progress()

    progress = run_async(go())
    with printing():
        echo_data(json.dumps(progress))


async def _serve(service: Any, host: str, port: int | None) -> None:
    from pybk.cli.common import serve_metrics
    from pybk.ops.offloader import OffloadCollector

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    http = None
    if port is not None:
        http = await serve_metrics(OffloadCollector(lambda: [("offload", service)]), host,
                                   port)
    try:
        ready: dict[str, Any] = {"event": "ready", "pid": os.getpid(),
                                 "namespaces": service.namespaces}
        if http is not None:
            ready["metrics_port"] = http[1]
        print(json.dumps(ready), file=sys.stderr, flush=True)
        work = loop.create_task(service.run())
        await stop.wait()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
    finally:
        if http is not None:
            await http[0].cleanup()
