"""A table server's HTTP admin endpoint (``pybk table serve --http-port N``), on aiohttp:

=================================  =====  ==================================================
path                               verb   answer
=================================  =====  ==================================================
``/heartbeat``                     GET    ``OK`` (text)
``/metrics``                       GET    Prometheus text: ops, latencies, failures,
                                          checkpoint and recovery times, ranges owned
``/api/v1/tables/ranges``          GET    JSON: the ranges this server owns (table, range,
                                          revision, checkpoint revision, replayed)
=================================  =====  ==================================================

Read-only; bounded by aiohttp's request limits (headers, no bodies accepted).
"""

from __future__ import annotations

import socket

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pybk.tables.engine import TablesEngine
from pybk.tables.metrics import TableCollector, TableStats

__all__ = ["TableHttp"]


class TableHttp:
    """The endpoint: ``await TableHttp(engine, stats, port=0).start()``; ``.port`` after."""

    def __init__(self, engine: TablesEngine, stats: TableStats, *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.engine = engine
        self.host, self.port = host, port
        self.registry = CollectorRegistry()
        self.registry.register(TableCollector(stats, lambda: len(engine.owned())))
        app = web.Application(client_max_size=1024)
        app.router.add_get("/heartbeat", self._heartbeat)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/tables/ranges", self._ranges)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> TableHttp:
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _heartbeat(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _ranges(self, request: web.Request) -> web.Response:
        return web.json_response([
            {"table": o.table_id, "range": o.range_id, "revision": o.revision,
             "checkpoint_revision": o.checkpoint_revision, "replayed": o.replayed}
            for o in self.engine.owned()])
