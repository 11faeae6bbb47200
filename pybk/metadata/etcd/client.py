"""A small etcd v3 client over etcd's own HTTP/JSON gateway (``/v3/kv/range``, ``/v3/kv/txn``,
``/v3/lease/*``, the streaming ``/v3/watch``), on aiohttp.

Why not a packaged client: ``etcd3`` (unmaintained since 2020) does not import with
protobuf >= 4; ``aetcd`` works but reaches one ``host:port`` only, and every cluster member
must be usable when one dies. The gateway is etcd's documented API (same messages as gRPC,
JSON-encoded), served on every member's client URL.

Several endpoints: a call goes to the endpoint that answered last; one that cannot be
reached is skipped for the next. A read is retried on another member whatever went wrong;
a write only when its request never left (the connection was refused, or the member had no
leader), because a write whose answer was lost may have been applied: it fails with
``MetadataStoreError`` (outcome unknown) and the caller's compare-and-set loop decides.

Every request requires a leader (etcd's ``WithRequireLeader``, gRPC metadata ``hasleader``):
a member cut off from its cluster answers "no leader" at once instead of timing out, and
cancels the watch streams it serves after three election timeouts without one. A watch
stream that ends for any reason moves on to the next member (``docs/operations.md``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from pybk.errors import ClientClosedError, MetadataStoreError

__all__ = ["EtcdClient", "b64", "prefix_end", "unb64"]

log = logging.getLogger("pybk.metadata.etcd")

Json = dict[str, Any]

#: grpc-gateway turns ``Grpc-Metadata-<key>`` headers into gRPC metadata; etcd's interceptors
#: refuse (unary) or cancel (streams) a request carrying ``hasleader: true`` on a member
#: without a leader (``rpctypes.MetadataRequireLeaderKey``)
REQUIRE_LEADER = {"Grpc-Metadata-hasleader": "true"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"


def parse_endpoints(hosts: str) -> list[str]:
    """``host:port[,host:port]`` -> base URLs (ValueError when malformed)."""
    out = []
    for hp in hosts.split(","):
        host, colon, port = hp.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad etcd endpoint {hp!r}: expected host:port")
        out.append(f"http://{host}:{int(port)}")
    return out


class EtcdClient:
    """Unary calls and watch streams against the members named by ``hosts``.

    ``op_timeout`` bounds each call, every member tried included.
    """

    def __init__(self, hosts: str, *, op_timeout: float = 10.0,
                 connect_timeout: float = 5.0) -> None:
        self.endpoints = parse_endpoints(hosts)
        self.op_timeout = op_timeout
        self.connect_timeout = connect_timeout
        self._current = 0
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        #: largest store revision seen in any answer (the store's clock)
        self.revision = 0
        #: the revision of the first answer (every subject was returned at or after it)
        self.first_revision = 0

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ClientClosedError("etcd metadata store is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, force_close=False),
                headers=REQUIRE_LEADER)
        return self._session

    def _seen(self, answer: Json) -> None:
        rev = int(answer.get("header", {}).get("revision", 0))
        if rev > self.revision:
            self.revision = rev
        if rev and not self.first_revision:
            self.first_revision = rev

    async def call(self, path: str, body: Json, *, idempotent: bool,
                   attempt: float | None = None) -> Json:
        """POST ``body`` to ``/v3/<path>`` of a member; the decoded answer. ``attempt``
        bounds the wait on one member (idempotent calls: then the next one is tried)."""
        http = self._http()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.op_timeout
        last: str = "no member tried"
        tried = 0
        while True:
            url = self.endpoints[self._current] + "/v3/" + path
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            per = remaining if attempt is None else min(remaining, attempt)
            timeout = aiohttp.ClientTimeout(total=per,
                                            sock_connect=min(per, self.connect_timeout))
            sent = False
            try:
                async with http.post(url, json=body, timeout=timeout) as resp:
                    sent = True
                    text = await resp.read()
                    answer = json.loads(text) if text else {}
                    # (a streamed call, lease/keepalive, may carry its error in a 200)
                    if resp.status == 200 and "error" not in answer:
                        self._seen(answer)
                        return answer
                    last = f"{url}: HTTP {resp.status} {answer.get('error') or text[:200]!r}"
                    if "no leader" in last:
                        sent = False  # refused before it was proposed: safe to send again
            except aiohttp.ClientConnectorError as exc:
                last = f"{url}: {exc}"
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                sent = True
                last = f"{url}: {type(exc).__name__} {exc}"
            if self._closed:
                raise ClientClosedError("etcd metadata store is closed")
            if sent and not idempotent:
                raise MetadataStoreError(f"etcd {path}: outcome unknown ({last})")
            tried += 1
            self._current = (self._current + 1) % len(self.endpoints)
            if tried % len(self.endpoints) == 0:  # every member failed once: breathe
                await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))
        raise MetadataStoreError(f"etcd {path}: no member answered in {self.op_timeout}s ({last})")

    # -- key/value ---------------------------------------------------------------------------

    async def get(self, key: bytes) -> tuple[Json | None, int]:
        """The key's kv (None when absent) and the answer's revision."""
        answer = await self.call("kv/range", {"key": b64(key)}, idempotent=True)
        kvs = answer.get("kvs") or []
        return (kvs[0] if kvs else None), int(answer["header"]["revision"])

    async def get_prefix(self, prefix: bytes, *, keys_only: bool = False) -> tuple[list[Json], int]:
        return await self.get_range(prefix, prefix_end(prefix), keys_only=keys_only)

    async def get_range(self, key: bytes, range_end: bytes, *,
                        keys_only: bool = False) -> tuple[list[Json], int]:
        """Every kv with ``key <= k < range_end``, and the answer's revision."""
        answer = await self.call("kv/range", {
            "key": b64(key), "range_end": b64(range_end), "keys_only": keys_only,
        }, idempotent=True)
        return list(answer.get("kvs") or []), int(answer["header"]["revision"])

    async def txn(self, compare: list[Json], success: list[Json],
                  failure: list[Json] | None = None) -> tuple[bool, Json]:
        """One transaction; ``(succeeded, answer)``."""
        answer = await self.call("kv/txn", {
            "compare": compare, "success": success, "failure": failure or [],
        }, idempotent=False)
        return bool(answer.get("succeeded", False)), answer

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        body: Json = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        answer = await self.call("kv/put", body, idempotent=True)
        return int(answer["header"]["revision"])

    async def delete(self, key: bytes) -> int:
        answer = await self.call("kv/deleterange", {"key": b64(key)}, idempotent=True)
        return int(answer.get("deleted", 0))

    # -- leases ------------------------------------------------------------------------------

    async def grant(self, ttl: float) -> tuple[int, int]:
        """A new lease of ``ttl`` seconds (whole, at least 1): its id and the TTL etcd gave
        it (never shorter than asked; etcd raises TTLs below its minimum)."""
        answer = await self.call("lease/grant", {"TTL": str(max(1, int(ttl)))},
                                 idempotent=True)
        if answer.get("error") or not answer.get("ID"):
            raise MetadataStoreError(f"etcd lease grant: {answer.get('error') or answer}")
        return int(answer["ID"]), int(answer.get("TTL", 0))

    async def keepalive(self, lease: int, attempt: float | None = None) -> int:
        """Renew ``lease`` once; its remaining TTL (0 when it is gone). ``attempt``: how
        long one member may keep the renewal (a member that just lost its leader holds it
        until etcd cancels it, seconds later) before the next member is asked."""
        answer = await self.call("lease/keepalive", {"ID": str(lease)}, idempotent=True,
                                 attempt=attempt)
        return int(answer.get("result", answer).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        await self.call("lease/revoke", {"ID": str(lease)}, idempotent=True)

    # -- watch -------------------------------------------------------------------------------

    async def watch(self, prefix: bytes, start_revision: int) -> AsyncIterator[Json]:
        """The results of one watch stream over ``prefix`` from ``start_revision`` on (the
        creation notice first). Ends (or raises) when the connection does, or when the member
        cancels it (it lost its leader: "etcdserver: no leader"); either way the next stream
        goes to the next member, and the caller resumes from the revision it reached."""
        http = self._http()
        used = self._current
        url = self.endpoints[used] + "/v3/watch"
        body = {"create_request": {
            "key": b64(prefix), "range_end": b64(prefix_end(prefix)),
            "start_revision": str(start_revision), "progress_notify": True,
        }}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout)
        try:
            async with http.post(url, json=body, timeout=timeout) as resp:
                if resp.status != 200:
                    text = await resp.read()
                    raise MetadataStoreError(f"etcd watch {url}: HTTP {resp.status} "
                                             f"{text[:200]!r}")
                while True:
                    line = await resp.content.readline()
                    if not line:
                        return
                    if not line.strip():
                        continue
                    doc = json.loads(line)
                    if "error" in doc:
                        raise MetadataStoreError(f"etcd watch {url}: {doc['error']}")
                    result = doc.get("result", {})
                    self._seen(result)
                    yield result
        finally:
            if self._current == used:  # (unary calls may have moved on already)
                self._current = (used + 1) % len(self.endpoints)

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None
