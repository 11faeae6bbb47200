"""Ack -> visible: how long after ``append()`` returned a tailing reader in another client has
the record, beside etcd (put -> watch event) in the same run.

A writer appends one record (100 bytes), awaits it, pauses, and so on; a reader of a second
client follows. Each pace (``--pauses``, ms; 0: the next append at once, saturated for a
lone writer) runs ``--records`` records (fewer at long pauses: ``--pace-seconds`` each),
after 20 unmeasured ones. Per row: p50, p99, the last record before the writer goes quiet
(what waited for the explicit-LAC tick before the immediate LAC), and the writer's messages
per record (add requests, explicit LAC messages: one per bookie told).

* ``in process``: ``pybk.LocalCluster`` of 3 bookies on the real disk, E=3 Qw=3 Qa=2;
* ``tcp``: 3 ``pybk bookie`` processes on loopback, clients in this process;
* readers (``--readers``): ``tail`` (``ReadHandle.tail()``), ``longpoll`` (a loop of
  ``read_last_add_confirmed_and_entry``, reading what the LAC it brings covers), ``log``
  (a ``pybk.logs`` log's writer and ``log.reader()``), ``wal`` (``pybk.AsyncWAL`` and its
  follower ``wal.follow()``);
* etcd (when ``etcd`` is installed: Debian's ``etcd-server``): one member, fsync per put, a
  watcher on a second connection, the same pacing.

Targets (issue 44): p50 <= 0.5 ms and p99 <= 2 ms in process, p99 <= 3 ms over TCP, the last
record within the same bound, at every pace.

    python benchmarks/tail_latency.py [--records 300] [--pauses 0,0.1,1,10,100]
                                      [--readers tail,longpoll,log,wal] [--no-tcp] [--no-etcd]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import pct, tcp_bookies
from _etcd import EtcdPeer, etcd_binary, etcd_member
from prometheus_client import CollectorRegistry

import pybk
from pybk.client import Client
from pybk.client.context import ClientConfig
from pybk.stats import ClientStats

WARMUP = 20
PAYLOAD = b"x" * 100
#: (p50, p99) targets in ms; the last record is held to the p99 bound
TARGETS = {"in process": (0.5, 2.0), "tcp": (None, 3.0)}


@dataclass
class Row:
    where: str
    reader: str
    pause_ms: float
    delays: list[float]  # seconds, in record order
    adds_per_record: float | None = None
    lacs_per_record: float | None = None

    def p(self, q: float) -> float:
        return pct(self.delays, q / 100) * 1e3

    @property
    def last(self) -> float:
        return self.delays[-1] * 1e3


def records_for(pause_ms: float, records: int, pace_seconds: float) -> int:
    if pause_ms <= 0:
        return records
    return max(10, min(records, int(pace_seconds * 1e3 / pause_ms)))


class Pacer:
    """The writer's side: append, note when it returned, pause."""

    def __init__(self, pause_ms: float, n: int) -> None:
        self.pause = pause_ms / 1e3
        self.n = n
        self.acked: dict[int, float] = {}
        self.seen: dict[int, float] = {}
        self._all = asyncio.Event()

    def saw(self, i: int) -> None:
        if i not in self.seen:
            self.seen[i] = time.perf_counter()
            if len(self.seen) == self.n + WARMUP:
                self._all.set()

    async def drive(self, append: Callable[[int], Awaitable[Any]]) -> list[float]:
        for i in range(self.n + WARMUP):
            await append(i)
            self.acked[i] = time.perf_counter()
            if self.pause:
                await asyncio.sleep(self.pause)
        await asyncio.wait_for(self._all.wait(), 30.0)
        return [self.seen[i] - self.acked[i] for i in range(WARMUP, self.n + WARMUP)]


def _index(data: bytes) -> int:
    return int(data.split(b":", 1)[0])


def _record(i: int) -> bytes:
    return b"%d:" % i + PAYLOAD


async def _ledger_row(writer: Client, reader: Client, stats: ClientStats, how: str,
                      pacer: Pacer) -> tuple[list[float], int, int]:
    lh = await writer.create_ledger(3, 3, 2)
    rh = await reader.open_ledger(lh.id, recovery=False)

    async def tail() -> None:
        async for entry in rh.tail(0):
            pacer.saw(_index(entry.data))

    async def longpoll() -> None:  # a long poll per wait, what the LAC covers read at once
        nxt = 0
        while True:
            entry = await rh.read_last_add_confirmed_and_entry(nxt, timeout=5.0)
            if entry is None:
                continue
            pacer.saw(_index(entry.data))
            nxt += 1
            if rh.last_add_confirmed >= nxt:
                for e in await rh.read(nxt, rh.last_add_confirmed):
                    pacer.saw(_index(e.data))
                nxt = rh.last_add_confirmed + 1

    follower = asyncio.ensure_future(tail() if how == "tail" else longpoll())
    adds0, lacs0 = stats.add_requests, stats.lac_messages
    try:
        delays = await pacer.drive(lambda i: lh.append(_record(i)))
        return delays, stats.add_requests - adds0, stats.lac_messages - lacs0
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await follower
        await lh.close()


async def _log_row(writer: Client, reader: Client, stats: ClientStats, pacer: Pacer,
                   name: str) -> tuple[list[float], int, int]:
    log_w = await writer.namespace().create_log(name)
    log_r = await reader.namespace().open_log(name)
    async with await log_w.writer() as w:
        rd = log_r.reader()

        async def follow() -> None:
            async for rec in rd:
                pacer.saw(_index(rec.data))

        follower = asyncio.ensure_future(follow())
        adds0, lacs0 = stats.add_requests, stats.lac_messages
        try:
            delays = await pacer.drive(lambda i: w.append(_record(i)))
            return delays, stats.add_requests - adds0, stats.lac_messages - lacs0
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower
            await rd.aclose()


async def _wal_row(root: Path, pacer: Pacer) -> tuple[list[float], int, int]:
    wal = pybk.AsyncWAL(root / f"wal-{time.monotonic_ns()}")
    async with wal:
        async def follow() -> None:
            async for _pos, data in wal.follow():
                pacer.saw(_index(data))

        follower = asyncio.ensure_future(follow())
        try:
            delays = await pacer.drive(lambda i: wal.append(_record(i)))
            return delays, 0, 0
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower


@contextlib.asynccontextmanager
async def _clients(where: str, root: Path) -> AsyncIterator[tuple[Client, Client, ClientStats]]:
    config = ClientConfig()
    if where == "in process":
        async with pybk.LocalCluster(root / "cluster", 3) as cluster:
            registry = CollectorRegistry()
            writer = Client(cluster.store, transport=cluster.transport, config=config,
                            metrics=registry)
            reader = cluster.client(config=config)
            assert writer.stats is not None
            async with writer:
                yield writer, reader, writer.stats
    else:
        async with tcp_bookies(root / "tcp") as metadata, \
                Client(metadata, config=config, metrics=CollectorRegistry()) as writer, \
                Client(metadata, config=config) as reader:
            assert writer.stats is not None
            yield writer, reader, writer.stats


async def pybk_rows(where: str, readers: list[str], pauses: list[float], args: Any,
                    root: Path) -> list[Row]:
    rows = []
    async with _clients(where, root) as (writer, reader, stats):
        for how in readers:
            if how == "wal" and where != "in process":
                continue
            for k, pause in enumerate(pauses):
                n = records_for(pause, args.records, args.pace_seconds)
                pacer = Pacer(pause, n)
                gc.collect()
                if how in ("tail", "longpoll"):
                    delays, adds, lacs = await _ledger_row(writer, reader, stats, how, pacer)
                elif how == "log":
                    delays, adds, lacs = await _log_row(writer, reader, stats, pacer,
                                                        f"bench-{k}")
                else:
                    delays, adds, lacs = await _wal_row(root, pacer)
                total = n + WARMUP
                rows.append(Row(where, how, pause, delays,
                                None if how == "wal" else adds / total,
                                None if how == "wal" else lacs / total))
    return rows


async def etcd_rows(pauses: list[float], args: Any, root: Path) -> list[Row]:
    rows = []
    async with etcd_member(root) as port:
        for pause in pauses:
            n = records_for(pause, args.records, args.pace_seconds)
            delays = await _etcd_pace(port, b"bench-%g" % pause, Pacer(pause, n))
            rows.append(Row("etcd", "watch", pause, delays))
    return rows


async def _etcd_pace(port: int, key: bytes, pacer: Pacer) -> list[float]:
    put, watch = EtcdPeer(port), EtcdPeer(port)
    await put.connect()
    await watch.connect()
    created = asyncio.Event()
    watcher = asyncio.ensure_future(watch.watch(key, lambda v: pacer.saw(_index(v)), created))
    try:
        await asyncio.wait_for(created.wait(), 10.0)
        return await pacer.drive(lambda i: put.put(key, _record(i)))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        await put.close()
        await watch.close()


def verdict(row: Row) -> str:
    p50_t, p99_t = TARGETS[row.where]
    misses = []
    if p50_t is not None and row.p(50) > p50_t:
        misses.append(f"p50>{p50_t}")
    if row.p(99) > p99_t:
        misses.append(f"p99>{p99_t}")
    if row.last > p99_t:
        misses.append(f"last>{p99_t}")
    return "met" if not misses else "NOT MET (" + ", ".join(misses) + ")"


def report(rows: list[Row], peers: dict[float, Row], etcd_note: str) -> None:
    print(f"{'where':<10} {'reader':<8} {'pause ms':>8} {'n':>4} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'last ms':>7} {'adds/rec':>8} {'LAC msgs/rec':>12}  {'etcd p50/p99/last ms':>21} "
          f"{'p50 x etcd':>10}  verdict")
    for r in rows:
        e = peers.get(r.pause_ms)
        peer = (f"{e.p(50):6.3f}/{e.p(99):6.3f}/{e.last:6.3f}" if e else "-")
        ratio = f"{r.p(50) / e.p(50):.1f}x" if e and e.p(50) > 0 else "-"
        adds = f"{r.adds_per_record:.2f}" if r.adds_per_record is not None else "-"
        lacs = f"{r.lacs_per_record:.2f}" if r.lacs_per_record is not None else "-"
        print(f"{r.where:<10} {r.reader:<8} {r.pause_ms:>8g} {len(r.delays):>4} "
              f"{r.p(50):7.3f} {r.p(99):7.3f} {r.last:7.3f} {adds:>8} {lacs:>12}  "
              f"{peer:>21} {ratio:>10}  {verdict(r)}")
    print(f"etcd: {etcd_note}")
    print("targets: p50 <= 0.5 ms, p99 <= 2 ms in process; p99 <= 3 ms over TCP; the last "
          "record within the p99 bound")


async def main(args: Any) -> None:
    pauses = [float(p) for p in args.pauses.split(",")]
    readers = [r for r in args.readers.split(",") if r]
    unknown = set(readers) - {"tail", "longpoll", "log", "wal"}
    if unknown:
        raise SystemExit(f"unknown readers: {sorted(unknown)}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        rows = await pybk_rows("in process", readers, pauses, args, root)
        if not args.no_tcp:
            rows += await pybk_rows("tcp", [r for r in readers if r != "wal"], pauses, args,
                                    root)
        peers: dict[float, Row] = {}
        if args.no_etcd:
            note = "not run (--no-etcd)"
        elif etcd_binary() is None:
            note = "not installed (apt-get install etcd-server): no peer figures"
        else:
            (root / "etcd").mkdir()
            peers = {r.pause_ms: r for r in await etcd_rows(pauses, args, root / "etcd")}
            note = ("one member, fsync per put, a watcher on a second connection "
                    "(HTTP/JSON gateway)")
    print(f"pybk {pybk.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          f"100-byte records, E=3 Qw=3 Qa=2; ClientConfig() defaults (immediate LAC on)")
    report(rows, peers, note)


def parse(argv: list[str] | None = None) -> Any:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=300)
    ap.add_argument("--pauses", default="0,0.1,1,10,100")
    ap.add_argument("--pace-seconds", type=float, default=3.0,
                    help="at most this long per pace (fewer records at long pauses)")
    ap.add_argument("--readers", default="tail,longpoll,log,wal")
    ap.add_argument("--no-tcp", action="store_true")
    ap.add_argument("--no-etcd", action="store_true")
    ap.add_argument("--dir", default=None)
    return ap.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
