"""Table puts and gets: pybk tables (3 in-process bookies, each range's commands on 3 and
acknowledged by 2) beside etcd (Debian's ``etcd``, one member and three members on loopback,
started here) and beside SQLite on the same disk, in one run.

* puts/s with ``--clients`` (32) writers, each awaiting its put before the next (closed loop),
  for ``--duration`` seconds; p50/p99 of a put;
* a single-key get's p50/p99 from one reader (pybk in process; etcd over its HTTP/JSON
  gateway, keep-alive; SQLite a SELECT).

etcd's client here is its v3 JSON gateway over keep-alive HTTP from one thread per client
(no Python gRPC client for etcd is installed); SQLite is one writer (it serializes writers),
WAL mode, ``synchronous=FULL``, a commit per put.

Targets (issue 36): put throughput with 32 clients at least 2x a 3-member etcd's; a
single-key get's p50 under 1 ms in process.

    python benchmarks/table_ops.py [--duration 3] [--clients 32] [--dir /tmp] [--no-etcd]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from _common import pct

import pybk


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- pybk ---------------------------------------------------------------------------------------


async def run_pybk(root: str, clients: int, duration: float, gets: int) -> dict[str, float]:
    async with pybk.AsyncTables(os.path.join(root, "pybk")) as tables:
        t = await tables.create_table("bench", num_ranges=4)
        lat: list[float] = []
        count = 0
        stop_at = time.perf_counter() + duration

        async def client(c: int) -> None:
            nonlocal count
            i = 0
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                await t.put(b"k%d-%d" % (c, i % 1000), b"x" * 100)
                lat.append(time.perf_counter() - t0)
                count += 1
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        elapsed = time.perf_counter() - t0
        get_lat = []
        for i in range(gets):
            g0 = time.perf_counter()
            await t.get(b"k0-%d" % (i % 100))
            get_lat.append(time.perf_counter() - g0)
        stale = []
        for i in range(gets):
            g0 = time.perf_counter()
            await t.get(b"k0-%d" % (i % 100), stale=True)
            stale.append(time.perf_counter() - g0)
    return {"puts": count / elapsed, "put_p50": pct(lat, 0.5), "put_p99": pct(lat, 0.99),
            "get_p50": pct(get_lat, 0.5), "get_p99": pct(get_lat, 0.99),
            "stale_p50": pct(stale, 0.5), "stale_p99": pct(stale, 0.99)}


# -- SQLite -------------------------------------------------------------------------------------


def run_sqlite(root: str, duration: float, gets: int) -> dict[str, float]:
    db = sqlite3.connect(os.path.join(root, "kv.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE kv(key BLOB PRIMARY KEY, value BLOB)")
    lat = []
    count = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration:
        p0 = time.perf_counter()
        db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (b"k%d" % (count % 1000), b"x" * 100))
        lat.append(time.perf_counter() - p0)
        count += 1
    elapsed = time.perf_counter() - t0
    get_lat = []
    for i in range(gets):
        g0 = time.perf_counter()
        db.execute("SELECT value FROM kv WHERE key=?", (b"k%d" % (i % 100),)).fetchone()
        get_lat.append(time.perf_counter() - g0)
    db.close()
    return {"puts": count / elapsed, "put_p50": pct(lat, 0.5), "put_p99": pct(lat, 0.99),
            "get_p50": pct(get_lat, 0.5), "get_p99": pct(get_lat, 0.99)}


# -- etcd ---------------------------------------------------------------------------------------


def start_etcd(root: str, members: int) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    names = [f"m{i}" for i in range(members)]
    peer = {n: _free_port() for n in names}
    client = {n: _free_port() for n in names}
    cluster = ",".join(f"{n}=http://127.0.0.1:{peer[n]}" for n in names)
    procs = []
    for n in names:
        d = os.path.join(root, f"etcd-{members}-{n}")
        args = ["etcd", "--name", n, "--data-dir", d,
                "--listen-client-urls", f"http://127.0.0.1:{client[n]}",
                "--advertise-client-urls", f"http://127.0.0.1:{client[n]}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer[n]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer[n]}",
                "--initial-cluster", cluster, "--initial-cluster-state", "new",
                "--initial-cluster-token", f"bench-{members}"]
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    ports = [client[n] for n in names]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            _etcd_put(http.client.HTTPConnection("127.0.0.1", ports[0], timeout=2), b"w", b"w")
            return procs, ports
        except (OSError, http.client.HTTPException, RuntimeError):
            time.sleep(0.1)
    stop_etcd(procs)
    raise RuntimeError("etcd did not start")


def stop_etcd(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _etcd_put(conn: http.client.HTTPConnection, key: bytes, value: bytes) -> None:
    body = json.dumps({"key": base64.b64encode(key).decode(),
                       "value": base64.b64encode(value).decode()})
    conn.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"etcd put: HTTP {resp.status}")


def _etcd_get(conn: http.client.HTTPConnection, key: bytes) -> None:
    conn.request("POST", "/v3/kv/range", json.dumps({"key": base64.b64encode(key).decode()}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()


def run_etcd(root: str, members: int, clients: int, duration: float,
             gets: int) -> dict[str, float]:
    procs, ports = start_etcd(root, members)
    try:
        lat: list[float] = []
        counts = [0] * clients
        stop_at = time.perf_counter() + duration

        def client(c: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", ports[c % len(ports)], timeout=10)
            i = 0
            while time.perf_counter() < stop_at:
                p0 = time.perf_counter()
                _etcd_put(conn, b"k%d-%d" % (c, i % 1000), b"x" * 100)
                lat.append(time.perf_counter() - p0)
                counts[c] += 1
                i += 1

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.perf_counter() - t0
        conn = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=10)
        get_lat = []
        for i in range(gets):
            g0 = time.perf_counter()
            _etcd_get(conn, b"k0-%d" % (i % 100))
            get_lat.append(time.perf_counter() - g0)
        return {"puts": sum(counts) / elapsed, "put_p50": pct(lat, 0.5), "put_p99": pct(lat, 0.99),
                "get_p50": pct(get_lat, 0.5), "get_p99": pct(get_lat, 0.99)}
    finally:
        stop_etcd(procs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--gets", type=int, default=2000)
    ap.add_argument("--dir", default=None, help="where the data goes (default: a temp dir)")
    ap.add_argument("--no-etcd", action="store_true")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="table-ops-", dir=args.dir)
    rows: list[tuple[str, dict[str, Any]]] = []
    try:
        rows.append(("pybk tables (E3 Qw3 Qa2)", asyncio.run(
            run_pybk(root, args.clients, args.duration, args.gets))))
        rows.append(("SQLite (1 writer, FULL)", run_sqlite(root, args.duration, args.gets)))
        etcd3: dict[str, Any] | None = None
        if not args.no_etcd and shutil.which("etcd"):
            rows.append(("etcd, 1 member", run_etcd(root, 1, args.clients, args.duration,
                                                   args.gets)))
            etcd3 = run_etcd(root, 3, args.clients, args.duration, args.gets)
            rows.append(("etcd, 3 members", etcd3))
        elif not args.no_etcd:
            print("etcd not installed (apt-get install etcd-server): its rows are left out",
                  file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{'system':28} {'puts/s':>9} {'put p50':>9} {'put p99':>9} {'get p50':>9} "
          f"{'get p99':>9}   ({args.clients} put clients, {args.duration:g} s)")
    for name, r in rows:
        print(f"{name:28} {r['puts']:9.0f} {r['put_p50'] * 1e3:7.2f}ms {r['put_p99'] * 1e3:7.2f}ms"
              f" {r['get_p50'] * 1e3:7.3f}ms {r['get_p99'] * 1e3:7.3f}ms")
    p = rows[0][1]
    print(f"{'pybk stale get':28} {'':9} {'':9} {'':9} {p['stale_p50'] * 1e3:7.3f}ms "
          f"{p['stale_p99'] * 1e3:7.3f}ms")
    if etcd3 is not None:
        ratio = p["puts"] / etcd3["puts"]
        print(f"target: puts >= 2x 3-member etcd: {ratio:.2f}x -> "
              f"{'met' if ratio >= 2 else 'NOT MET'}")
    print(f"target: get p50 < 1 ms in process: {p['get_p50'] * 1e3:.3f} ms -> "
          f"{'met' if p['get_p50'] < 1e-3 else 'NOT MET'}")


if __name__ == "__main__":
    main()
