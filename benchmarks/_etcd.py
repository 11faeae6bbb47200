"""etcd as a peer: one member (Debian's ``etcd-server``, fsync per put) on free loopback ports,
reached through its own HTTP/JSON gateway (``/v3/kv/put``, the streaming ``/v3/watch``) with
plain asyncio streams: no maintained asyncio etcd client is packaged, and the gateway is
etcd's documented API. A put is answered once it is committed (raft log fsynced)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

__all__ = ["EtcdPeer", "etcd_binary", "etcd_member"]


def etcd_binary() -> str | None:
    """The etcd server on this machine, or None."""
    return shutil.which("etcd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(binary: str, root: Path, client: int, peer: int) -> subprocess.Popen[bytes]:
    with open(root / "etcd.log", "wb") as log:
        return subprocess.Popen(
            [binary, "--data-dir", str(root / "etcd"), "--name", "bench",
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
            stdout=log, stderr=subprocess.STDOUT)


@contextlib.asynccontextmanager
async def etcd_member(root: Path) -> AsyncIterator[int]:
    """One etcd member with its data under ``root``; yields its client port; stopped by PID."""
    binary = etcd_binary()
    if binary is None:
        raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
    client, peer = _free_port(), _free_port()
    proc = _spawn(binary, root, client, peer)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                peer_conn = EtcdPeer(client)
                await peer_conn.connect()
                await peer_conn.put(b"ready", b"1")
                await peer_conn.close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("etcd did not start: see etcd.log") from None
                await asyncio.sleep(0.05)
        yield client
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class EtcdPeer:
    """One keep-alive HTTP connection to an etcd member: puts, or one watch."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._r: asyncio.StreamReader | None = None
        self._w: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        self._r, self._w = await asyncio.open_connection("127.0.0.1", self.port)
        sock = self._w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def close(self) -> None:
        if self._w is not None:
            self._w.close()
            with contextlib.suppress(OSError):
                await self._w.wait_closed()

    def _post(self, path: str, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        assert self._w is not None
        self._w.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                      b"\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))

    async def _headers(self) -> dict[str, str]:
        assert self._r is not None
        status = await self._r.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"etcd answered {status!r}")
        headers = {}
        while (line := await self._r.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        return headers

    async def put(self, key: bytes, value: bytes) -> None:
        """Put and wait for etcd's answer (committed)."""
        self._post("/v3/kv/put", {"key": base64.b64encode(key).decode(),
                                  "value": base64.b64encode(value).decode()})
        headers = await self._headers()
        assert self._r is not None
        if "content-length" in headers:
            await self._r.readexactly(int(headers["content-length"]))
        else:
            await self._chunk()

    async def _chunk(self) -> bytes:
        assert self._r is not None
        size = int((await self._r.readline()).strip(), 16)
        data = await self._r.readexactly(size + 2)
        return data[:-2]

    async def watch(self, key: bytes, on_value: Callable[[bytes], None],
                    created: asyncio.Event) -> None:
        """Watch ``key`` until cancelled, calling ``on_value`` with each new value; ``created``
        is set once etcd confirms the watch."""
        self._post("/v3/watch", {"create_request": {"key": base64.b64encode(key).decode()}})
        await self._headers()
        buf = b""
        while True:
            buf += await self._chunk()
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                result = json.loads(line).get("result", {})
                if result.get("created"):
                    created.set()
                for ev in result.get("events", ()):
                    on_value(base64.b64decode(ev["kv"].get("value", "")))
