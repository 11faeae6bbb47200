"""Real etcd servers for tests (Debian's ``etcd-server``): one member or a cluster.

:class:`EtcdCluster` starts ``members`` etcd processes on free loopback ports, their data in
a temporary directory (on ``/dev/shm`` when there is one: the tests measure pybk, not the
disk), waits until every member answers ``/health``, and stops them by PID. ``kill(i)``
SIGKILLs one member, ``start(i)`` brings it back on its ports and data; ``leader()`` says
which member leads. Short heartbeat and election timeouts keep a failover under a second.
With ``peer_links=True`` the members talk to each other through cuttable proxies
(:mod:`.etcd_links`): ``isolate(i)`` partitions a live member from the others, ``heal(i)``
joins it again; client traffic goes straight to each member.

:class:`EtcdBackend` runs the metadata conformance suite on a cluster, each check under its
own root. A missing ``etcd`` is an error, never a skip: ``make system-deps`` installs it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from pybk.metadata.base import MetadataStore
from pybk.testing.etcd_links import PeerLinks
from pybk.testing.metadata_backends import MetadataBackend
from pybk.testing.zookeeper import free_port

__all__ = ["EtcdBackend", "EtcdCluster", "EtcdUnavailable"]


class EtcdUnavailable(RuntimeError):
    """etcd is not installed, or a member would not start."""


class EtcdCluster:
    """``members`` etcd processes forming one cluster on loopback."""

    def __init__(self, members: int = 1, *, heartbeat_ms: int = 50,
                 election_ms: int = 500, peer_links: bool = False) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise EtcdUnavailable("etcd is not installed (apt-get install etcd-server, "
                                  "or make system-deps)")
        if members < 1:
            raise ValueError(f"members must be >= 1, got {members}")
        self._binary = binary
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.dir = Path(tempfile.mkdtemp(prefix="pybk-etcd-", dir=base))
        self.names = [f"m{i}" for i in range(members)]
        self.client_ports = [free_port() for _ in range(members)]
        self.peer_ports = [free_port() for _ in range(members)]  # advertised
        self._listen_ports = ([free_port() for _ in range(members)] if peer_links
                              else self.peer_ports)
        self.links: PeerLinks | None = None
        self._peer_links = peer_links
        self._timing = [f"--heartbeat-interval={heartbeat_ms}",
                        f"--election-timeout={election_ms}"]
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * members

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def uri(self, root: str = "/pybk") -> str:
        return f"etcd://{self.hosts}/{root.strip('/')}"

    def pid(self, i: int) -> int | None:
        proc = self._procs[i]
        return None if proc is None or proc.poll() is not None else proc.pid

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        name = self.names[i]
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}"
                           for n, p in zip(self.names, self.peer_ports, strict=True))
        client = f"http://127.0.0.1:{self.client_ports[i]}"
        peer = f"http://127.0.0.1:{self.peer_ports[i]}"
        listen = f"http://127.0.0.1:{self._listen_ports[i]}"
        with open(self.dir / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                [self._binary, "--name", name, "--data-dir", str(self.dir / name),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", listen, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--initial-cluster-token", self.dir.name, *self._timing],
                stdout=log, stderr=subprocess.STDOUT)

    def _post(self, i: int, path: str, body: dict[str, object],
              timeout: float = 1.0) -> dict[str, object] | None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.client_ports[i]}{path}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                doc = json.loads(resp.read())
                return doc if isinstance(doc, dict) else None
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def healthy(self, i: int) -> bool:
        """Whether member ``i`` serves a linearizable read (it has a leader)."""
        return self._post(i, "/v3/kv/range", {"key": "aGVhbHRo"}) is not None

    def start(self, i: int | None = None, timeout: float = 30.0) -> None:
        """Start member ``i`` (all members when None) and wait until each serves."""
        which = range(len(self.names)) if i is None else [i]
        if self._peer_links and self.links is None:
            self.links = PeerLinks(self.peer_ports, self._listen_ports,
                                   lambda: [self.pid(j) for j in range(len(self.names))])
        for j in which:
            if self.pid(j) is None:
                self._procs[j] = self._spawn(j)
        deadline = time.monotonic() + timeout
        for j in which:
            while not self.healthy(j):
                proc = self._procs[j]
                if proc is not None and proc.poll() is not None:
                    raise EtcdUnavailable(f"etcd member {j} exited: see {self.dir}/m{j}.log")
                if time.monotonic() > deadline:
                    raise EtcdUnavailable(f"etcd member {j} did not serve in {timeout}s")
                time.sleep(0.02)

    def leader(self) -> int | None:
        """The index of the member that leads now (None when none is known)."""
        for i in range(len(self.names)):
            if self.pid(i) is None:
                continue
            status = self._post(i, "/v3/maintenance/status", {})
            if status is None:
                continue
            header = status.get("header")
            if isinstance(header, dict) and status.get("leader") == header.get("member_id"):
                return i
        return None

    def has_leader(self, i: int) -> bool:
        """Whether member ``i`` knows a leader now (its own view; False when it is down)."""
        status = self._post(i, "/v3/maintenance/status", {})
        return bool(status and str(status.get("leader", "0")) != "0")

    def isolate(self, i: int) -> None:
        """Partition member ``i`` from every other member (it stays alive; needs
        ``peer_links=True``)."""
        if self.links is None:
            raise RuntimeError("isolate() needs EtcdCluster(..., peer_links=True)")
        self.links.isolate(i)

    def heal(self, i: int) -> None:
        if self.links is not None:
            self.links.heal(i)

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` (its data stays)."""
        proc = self._procs[i]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self._procs[i] = None

    def stop(self) -> None:
        for i, proc in enumerate(self._procs):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            self._procs[i] = None

    def close(self) -> None:
        self.stop()
        if self.links is not None:
            self.links.close()
            self.links = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


_roots = itertools.count()


class EtcdBackend(MetadataBackend):
    """``etcd://``: clients are separate stores (each its own lease) under one fresh root."""

    def __init__(self, hosts: str, *, session_timeout: float = 2.0) -> None:
        self.hosts = hosts
        self.root = f"/conformance-{os.getpid()}-{next(_roots)}"
        self.session_timeout = session_timeout
        self.bound = 15.0
        self._opened: list[MetadataStore] = []

    async def open(self) -> MetadataStore:
        from pybk.metadata.etcd import EtcdMetadataStore

        store = EtcdMetadataStore(self.hosts, self.root, session_timeout=self.session_timeout)
        self._opened.append(store)
        return store

    async def kill_owner(self, store: MetadataStore) -> None:
        """The owner dies: it stops renewing, and its lease is revoked (as if it lapsed)."""
        from pybk.metadata.etcd import EtcdMetadataStore
        from pybk.metadata.etcd.client import EtcdClient

        assert isinstance(store, EtcdMetadataStore)
        lease = store.lease_id
        await store.crash()
        if lease:
            client = EtcdClient(self.hosts)
            try:
                await client.revoke(lease)
            finally:
                await client.close()

    async def corrupt_ledger(self, store: MetadataStore, ledger_id: int, data: bytes) -> None:
        from pybk.metadata.etcd import EtcdMetadataStore

        assert isinstance(store, EtcdMetadataStore)
        await store.corrupt_ledger(ledger_id, data)

    async def cleanup(self) -> None:
        for s in self._opened:
            await s.close()
        await asyncio.sleep(0)
