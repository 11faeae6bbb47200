"""The bookie's HTTP admin endpoint (``pybk bookie --http-port N``), on aiohttp, served by
the bookie's own event loop.

Secure by default: with no token, mutating requests are served on loopback only; HTTPS
when the bookie has TLS; health paths never refused for load (docs/operations.md).

Design notes: docs/internals.md, "pybk/server/http.py".
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pybk.errors import (
    BKError,
    BookieStateError,
    KeyExistsError,
    NoSuchLedgerError,
    NoSuchNamespaceError,
    NoSuchTenantError,
    NotEmptyError,
)
from pybk.metadata.base import LedgerMetadata
from pybk.ops.admin import Admin
from pybk.runtime.ratelog import RateLimitedLog
from pybk.server.http_tenancy import json_body, tenancy_routes
from pybk.transport.listener import Listener, bind_sockets

if TYPE_CHECKING:
    from pybk.bookie.gc import GarbageCollector

__all__ = ["AdminHttpServer", "HttpConfig", "metadata_json"]

log = logging.getLogger(__name__)

#: paths served whatever the load: a busy admin client must not make the bookie look dead
_HEALTH_PATHS = frozenset({"/heartbeat", "/metrics"})
_INT64_MAX = (1 << 63) - 1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class HttpConfig:
    """Where the endpoint listens and its bounds (every one settable from the command line)."""

    host: str = "127.0.0.1"
    port: int = 0
    #: required (as a Bearer token) by mutating requests; None: no authentication
    token: bytes | None = None
    max_connections: int = 64
    #: connections from one address (the rest stay for other clients, health checks)
    max_connections_per_ip: int = 8
    #: serve mutating requests with no token on a non-loopback address (off: refused, 403)
    allow_open_admin: bool = False
    max_requests_in_flight: int = 32
    max_body_bytes: int = 64 << 10
    #: longest request line / header field
    max_header_bytes: int = 8190
    keepalive_timeout: float = 15.0
    #: decommissions running at once through this endpoint
    max_jobs: int = 4
    #: failed accepts (out of descriptors) are logged at most once per this many seconds
    log_interval: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_ip", "max_requests_in_flight",
                     "max_body_bytes", "max_header_bytes", "max_jobs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.keepalive_timeout <= 0:
            raise ValueError(f"keepalive_timeout must be > 0, got {self.keepalive_timeout!r}")
        if self.token is not None and not self.token:
            raise ValueError("the HTTP token must be non-empty (or None)")


def metadata_json(md: LedgerMetadata) -> dict[str, Any]:
    """A ledger's metadata as the endpoint answers it (custom metadata: its keys only)."""
    return md.public_view(custom_values=False)


def _error(status: int, message: str, kind: str = "") -> web.Response:
    return web.json_response({"error": message, "type": kind or web.HTTPException.__name__},
                             status=status)


class AdminHttpServer:
    """The endpoint (see the module doc). ``info()`` returns the ``bookie/info`` document;
    ``admin`` serves every cluster-wide path (None: only ``/heartbeat`` and ``/metrics``
    are served, e.g. ``--metrics-port``); ``registry`` is what ``/metrics`` exports."""

    def __init__(self, config: HttpConfig, *, registry: CollectorRegistry, admin: Admin | None,
                 info: Callable[[], Awaitable[dict[str, Any]]],
                 ssl_context: ssl.SSLContext | None = None,
                 gc: Callable[[], GarbageCollector | None] | None = None) -> None:
        self.config = config
        #: the bookie's garbage collector now (None: it has none; the paths then answer 409)
        self._gc = gc
        self.registry = registry
        self._admin = admin
        self._info = info
        self._ssl = ssl_context
        self._in_flight = 0
        self._jobs: dict[str, asyncio.Task[dict[str, Any]]] = {}
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._address: tuple[str, int] | None = None
        self._warnings: RateLimitedLog | None = None
        #: connections in their TLS handshake (or not yet made), and their peer's address
        self._handshakes: dict[asyncio.Task[Any], str] = {}
        #: connections refused at the cap, requests refused for load (tests, operators)
        self.refused = {"connections": 0, "requests": 0}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        app = web.Application(client_max_size=cfg.max_body_bytes,
                              middlewares=[self._guard])
        get, put = "GET", "PUT"
        app.router.add_route(get, "/heartbeat", self._heartbeat)
        app.router.add_route(get, "/metrics", self._metrics)
        for verb, path, handler in () if self._admin is None else (
            (get, "/api/v1/bookie/info", self._bookie_info),
            (get, "/api/v1/bookie/list_bookies", self._list_bookies),
            (put, "/api/v1/bookie/gc", self._run_gc),
            (get, "/api/v1/bookie/gc_details", self._gc_details),
            (get, "/api/v1/ledger/list", self._ledger_list),
            (get, "/api/v1/ledger/metadata", self._ledger_metadata),
            (get, "/api/v1/autorecovery/list_under_replicated_ledger", self._under_replicated),
            (get, "/api/v1/autorecovery/status", self._status),
            (put, "/api/v1/autorecovery/status", self._set_status),
            (get, "/api/v1/autorecovery/who_is_auditor", self._who_is_auditor),
            (put, "/api/v1/autorecovery/trigger_audit", self._trigger_audit),
            (get, "/api/v1/autorecovery/lost_bookie_recovery_delay", self._get_delay),
            (put, "/api/v1/autorecovery/lost_bookie_recovery_delay", self._set_delay),
            (put, "/api/v1/autorecovery/decommission", self._decommission),
            (get, "/api/v1/autorecovery/decommission", self._decommission_status),
        ):
            app.router.add_route(verb, path, handler)
        for t_verb, t_path, t_handler in (
                () if self._admin is None else tenancy_routes(self._admin)):
            app.router.add_route(t_verb, t_path, t_handler)
        runner = web.AppRunner(
            app, access_log=None, keepalive_timeout=cfg.keepalive_timeout,
            max_line_size=cfg.max_header_bytes, max_field_size=cfg.max_header_bytes,
            handler_cancellation=True)
        await runner.setup()
        self._runner = runner
        # Our own accept loop (pybk.transport.listener), not loop.create_server: a connection
        # over the cap is closed before anything is read, and running out of descriptors
        # pauses accepting and is logged once per interval (asyncio logs a traceback per
        # failed accept).
        loop = asyncio.get_running_loop()
        sockets = await bind_sockets(cfg.host, cfg.port, backlog=128)
        host, port = sockets[0].getsockname()[:2]
        self._address = (str(host), int(port))
        self._warnings = RateLimitedLog(log, cfg.log_interval, loop.time)
        self._listener = Listener(sockets, self._accepted, self._accept_failed)
        self._listener.start()
        if self._admin is not None:
            log.warning("HTTP admin endpoint on %s://%s:%d: %s",
                        "https" if self._ssl is not None else "http", host, port,
                        self.admin_policy())

    def admin_policy(self) -> str:
        """Who may change the cluster through this endpoint, in words (logged at start)."""
        if self.config.token is not None:
            return "mutating requests need the bearer token"
        if self.config.allow_open_admin:
            return "NO TOKEN: anyone who reaches this port can change the cluster"
        if _is_loopback(self.config.host):
            return "no token: mutating requests only from this host (loopback)"
        return "no token: mutating requests refused (configure a token file)"

    def _mutation_refusal(self, request: web.Request) -> web.Response | None:
        """The answer refusing a mutating request, or None if it may run."""
        token = self.config.token
        if token is None:
            if self.config.allow_open_admin or _is_loopback(self.config.host):
                return None
            return _error(403, "mutating requests are refused: this endpoint has no token "
                          "(--http-token-file) and does not listen on loopback only",
                          "Forbidden")
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"),
                                   b"Bearer " + token):
            return _error(401, "a mutating request needs 'Authorization: Bearer <token>'",
                          "Unauthorized")
        return None

    def _accepted(self, sock: socket.socket, peer_ip: str) -> None:
        assert self._runner is not None and self._runner.server is not None
        server = self._runner.server
        if (len(server.connections) + len(self._handshakes) >= self.config.max_connections
                or self.connections_from(peer_ip) >= self.config.max_connections_per_ip):
            self.refused["connections"] += 1
            sock.close()
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(server, sock, ssl=self._ssl))
        self._handshakes[task] = peer_ip
        task.add_done_callback(self._handshake_done)

    def connections_from(self, peer_ip: str) -> int:
        """Connections open (or being made) from ``peer_ip``: at most ``max_connections``
        to look at, so counted when asked rather than kept in step with every close."""
        assert self._runner is not None and self._runner.server is not None
        n = sum(ip == peer_ip for ip in self._handshakes.values())
        for handler in self._runner.server.connections:
            transport = handler.transport
            peer = transport.get_extra_info("peername") if transport is not None else None
            if peer and peer[0] == peer_ip:
                n += 1
        return n

    def _handshake_done(self, task: asyncio.Task[Any]) -> None:
        self._handshakes.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.debug("HTTP connection failed before its first request: %r", task.exception())

    def _accept_failed(self, exc: OSError) -> None:
        if self._warnings is not None:
            self._warnings.event("HTTP accept() failing",
                                 f"{exc.strerror or exc}; pausing accepts briefly")

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None or self._listener is None:
            raise RuntimeError("the HTTP endpoint is not started")
        return self._address

    async def stop(self) -> None:
        for task in list(self._jobs.values()):
            task.cancel()
        await asyncio.gather(*self._jobs.values(), return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._handshakes):
            task.cancel()
        await asyncio.gather(*self._handshakes, return_exceptions=True)
        if self._warnings is not None:
            self._warnings.flush()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- middleware ----------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in _HEALTH_PATHS:  # cheap, and never refused for load
            return await handler(request)
        if self._in_flight >= self.config.max_requests_in_flight:
            self.refused["requests"] += 1
            return _error(503, "too many requests in flight", "TooManyRequests")
        if request.method in ("PUT", "DELETE", "POST"):
            refusal = self._mutation_refusal(request)
            if refusal is not None:
                return refusal
        self._in_flight += 1
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body above {self.config.max_body_bytes} bytes",
                          "RequestEntityTooLarge")
        except web.HTTPException as exc:
            if exc.status >= 400:
                return _error(exc.status, exc.reason, type(exc).__name__)
            raise
        except ValueError as exc:
            return _error(400, str(exc), type(exc).__name__)
        except TypeError as exc:  # (a policy of the wrong type)
            return _error(400, str(exc), type(exc).__name__)
        except (NoSuchLedgerError, NoSuchTenantError, NoSuchNamespaceError) as exc:
            return _error(404, str(exc), type(exc).__name__)
        except (NotEmptyError, KeyExistsError) as exc:
            return _error(409, str(exc), type(exc).__name__)
        except BookieStateError as exc:
            return _error(409, str(exc), type(exc).__name__)
        except BKError as exc:
            return _error(500, str(exc), type(exc).__name__)
        finally:
            self._in_flight -= 1

    # -- handlers ------------------------------------------------------------------------------

    @property
    def admin(self) -> Admin:
        assert self._admin is not None  # (only the admin paths use it)
        return self._admin

    async def _heartbeat(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="OK\n")

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _bookie_info(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(await self._info())

    def _collector(self) -> GarbageCollector:
        gc = self._gc() if self._gc is not None else None
        if gc is None:
            raise BookieStateError("this bookie has no garbage collector running (no "
                                   "metadata store, or stopped)")
        return gc

    async def _run_gc(self, request: web.Request) -> web.StreamResponse:
        result = await self._collector().run(force=True)
        return web.json_response(result.as_dict())

    async def _gc_details(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._collector().status())

    async def _list_bookies(self, request: web.Request) -> web.StreamResponse:
        kind = request.query.get("type", "")
        if kind not in ("", "rw", "ro"):
            raise ValueError(f"type must be rw or ro, not {kind!r}")
        bookies = [b.as_dict() for b in await self.admin.list_bookies()
                   if not kind or (b.state == "writable") == (kind == "rw")]
        return web.json_response({"bookies": bookies})

    async def _ledger_list(self, request: web.Request) -> web.StreamResponse:
        bookie = request.query.get("bookie")
        ids = (await self.admin.ledgers_of(bookie) if bookie
               else await self.admin.list_ledgers())
        if _flag(request, "print_metadata"):
            out: dict[str, Any] = {}
            for lid in ids:
                try:
                    out[str(lid)] = metadata_json(await self.admin.ledger_metadata(lid))
                except NoSuchLedgerError:
                    continue  # deleted meanwhile
            return web.json_response({"ledgers": out})
        return web.json_response({"ledgers": ids})

    async def _ledger_metadata(self, request: web.Request) -> web.StreamResponse:
        lid = _int_param(request, "ledger_id")
        return web.json_response(metadata_json(await self.admin.ledger_metadata(lid)))

    async def _under_replicated(self, request: web.Request) -> web.StreamResponse:
        only = request.query.get("missingreplica")
        without = request.query.get("excludingmissingreplica")
        marks = {str(lid): missing
                 for lid, missing in (await self.admin.under_replicated_details()).items()
                 if (only is None or only in missing)
                 and (without is None or without not in missing)}
        return web.json_response({"ledgers": marks})

    async def _status(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(await self.admin.autorecovery_status())

    async def _set_status(self, request: web.Request) -> web.StreamResponse:
        value = request.query.get("enabled")
        if value not in ("true", "false"):
            raise ValueError("PUT /api/v1/autorecovery/status needs ?enabled=true|false")
        if value == "true":
            await self.admin.enable_autorecovery()
        else:
            await self.admin.disable_autorecovery()
        return web.json_response(await self.admin.autorecovery_status())

    async def _who_is_auditor(self, request: web.Request) -> web.StreamResponse:
        status = await self.admin.autorecovery_status()
        return web.json_response({"auditor": status["auditor"]})

    async def _trigger_audit(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"audit_request": await self.admin.trigger_audit()})

    async def _get_delay(self, request: web.Request) -> web.StreamResponse:
        delay = await self.admin.settings.lost_bookie_recovery_delay()
        return web.json_response({"delay_seconds": delay})

    async def _set_delay(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        delay = body.get("delay_seconds")
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float)):
            raise ValueError(f"delay_seconds must be a number or null, not {delay!r}")
        await self.admin.set_lost_bookie_recovery_delay(delay)
        return web.json_response({"delay_seconds": delay})

    async def _decommission(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        bookie = body.get("bookie_src")
        if not isinstance(bookie, str) or not bookie:
            raise ValueError('the body must be {"bookie_src": "<bookie id>"}')
        job = self._jobs.get(bookie)
        if job is not None and not job.done():
            return web.json_response({"bookie_src": bookie, "status": "running"}, status=202)
        if sum(not t.done() for t in self._jobs.values()) >= self.config.max_jobs:
            return _error(429, f"{self.config.max_jobs} decommissions already running",
                          "TooManyRequests")
        if any(b.id == bookie for b in await self.admin.list_bookies()):
            raise BookieStateError(
                f"bookie {bookie} is still running (registered): stop it before "
                "decommissioning it")
        delete_cookie = bool(body.get("delete_cookie", False))

        async def run() -> dict[str, Any]:
            report = await self.admin.decommission_bookie(bookie, delete_cookie=delete_cookie)
            return report.as_dict()

        self._jobs[bookie] = asyncio.get_running_loop().create_task(run())
        self._jobs[bookie].add_done_callback(_log_job(bookie))
        return web.json_response({"bookie_src": bookie, "status": "started"}, status=202)

    async def _decommission_status(self, request: web.Request) -> web.StreamResponse:
        bookie = request.query.get("bookie_src", "")
        job = self._jobs.get(bookie)
        if job is None:
            raise web.HTTPNotFound(reason=f"no decommission of {bookie!r} was started here")
        if not job.done():
            return web.json_response({"bookie_src": bookie, "status": "running"})
        if job.cancelled():
            return web.json_response({"bookie_src": bookie, "status": "cancelled"})
        exc = job.exception()
        if exc is not None:
            return web.json_response({"bookie_src": bookie, "status": "failed",
                                      "error": f"{type(exc).__name__}: {exc}"})
        return web.json_response({"bookie_src": bookie, "status": "done",
                                  "report": job.result()})


def _log_job(bookie: str) -> Callable[[asyncio.Task[dict[str, Any]]], None]:
    def done(task: asyncio.Task[dict[str, Any]]) -> None:
        if task.cancelled():
            return
        exc = task.exception()  # kept for the status request; logged here as well
        if exc is not None:
            log.warning("decommission of %s failed: %s", bookie, exc)
        else:
            log.info("decommission of %s done", bookie)

    return done


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("true", "false", "1", "0", ""):
        raise ValueError(f"{name} must be true or false, not {value!r}")
    return value in ("true", "1")


def _int_param(request: web.Request, name: str) -> int:
    text = request.query.get(name)
    if text is None:
        raise ValueError(f"missing query parameter {name}")
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {text[:40]!r}") from None
    if not 0 <= value <= _INT64_MAX:
        raise ValueError(f"{name} must be between 0 and {_INT64_MAX}, not {text[:40]}")
    return value


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a listening address) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
