"""A noisy neighbour: tenant A writes as fast as it can (then, second run, reads a large
backlog) while tenant B appends at a steady rate. B's p99 append latency and throughput are
printed alone, beside A with the bookies' tenancy enforcement (A's namespace has rates), and
beside A without enforcement, with ratios and the targets' verdicts (B's p99 within 2x of
alone, B's throughput within 10% of alone), in process and over TCP (bookies behind real TCP
servers on loopback, in this process).

    python benchmarks/noisy_neighbour.py [--duration 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from contextlib import AsyncExitStack
from typing import Any

import pybk
from pybk.bookie import Bookie
from pybk.bookie.tenancy import enable_tenancy
from pybk.metadata.base import BookieRegistration
from pybk.metadata.memory import MemoryMetadataStore
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords
from pybk.server.process import FAIR_SHARE
from pybk.storage import MemFileSystem
from pybk.transport.identity import Identities
from pybk.transport.local import LocalTransport
from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport

TOKENS = {"tok-a": "acme", "tok-b": "globex"}
QUORUMS = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2}


def pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


class Bench:
    """Three bookies (in process or behind TCP servers), tenancy records, two clients."""

    def __init__(self, args: argparse.Namespace, tcp: bool, enforce: bool) -> None:
        self.args, self.tcp, self.enforce = args, tcp, enforce
        self.stack = AsyncExitStack()
        self.store = MemoryMetadataStore()
        self.bookies: dict[str, Bookie] = {}

    async def __aenter__(self) -> Bench:
        a = self.args
        records = TenancyRecords(self.store)
        for tenant in ("acme", "globex"):
            await records.create_tenant(tenant)
        await records.create_namespace("acme/bulk", policies=NamespacePolicies(
            write_bytes_per_s=a.a_write_rate, read_bytes_per_s=a.a_read_rate, **QUORUMS))
        await records.create_namespace("globex/app", policies=NamespacePolicies(**QUORUMS))
        identities = Identities(dict(TOKENS))
        for i in range(3):
            fs = MemFileSystem()
            fs.makedirs(f"/b{i}")
            bookie = Bookie(f"b{i}", f"/b{i}", fs=fs)
            await bookie.start()
            self.stack.push_async_callback(bookie.stop)
            gate = None
            if self.enforce:
                gate = await enable_tenancy(bookie, self.store, authenticated=self.tcp)
            self.bookies[f"b{i}"] = bookie
            if self.tcp:
                server = BookieServer(bookie.handle, add=bookie.add_request,
                                      response_size=bookie.response_size_hint,
                                      identities=identities, gate=gate,
                                      fair_share=FAIR_SHARE if self.enforce else None)
                await server.start()
                self.stack.push_async_callback(server.stop)
                host, port = server.address
                await self.store.register_bookie(BookieRegistration(f"b{i}", f"{host}:{port}"))
            else:
                await self.store.register_bookie(BookieRegistration(f"b{i}", f"local:b{i}"))
        return self

    async def client(self, tenant: str) -> pybk.Client:
        token = next(t for t, n in TOKENS.items() if n == tenant)
        transport: Any = (TcpTransport.from_store(self.store, auth_token=token.encode())
                          if self.tcp else LocalTransport(self.bookies, principal=tenant))
        client = pybk.Client(self.store, transport=transport)

        async def close() -> None:
            await transport.close()
            await client.close()

        self.stack.push_async_callback(close)
        return client

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()


async def steady_b(client: pybk.Client, rate: float, duration: float, size: int
                   ) -> tuple[list[float], float]:
    """B appends at ``rate``/s (open loop: each append starts on schedule). Latencies, and
    appends completed per second."""
    lh = await client.create_ledger(custom_metadata={NAMESPACE_KEY: b"globex/app"}, **QUORUMS)
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    body = b"b" * size

    async def one(start: float) -> None:
        await lh.append(body)
        lat.append(loop.time() - start)

    tasks = []
    t0 = loop.time()
    n = int(rate * duration)
    for i in range(n):
        due = t0 + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(loop.time())))
    await asyncio.gather(*tasks)
    took = loop.time() - t0
    return lat, len(lat) / took


async def noisy_writer(client: pybk.Client, stop: asyncio.Event, window: int, size: int
                       ) -> int:
    lh = await client.create_ledger(custom_metadata={NAMESPACE_KEY: b"acme/bulk"}, **QUORUMS)
    body = b"a" * size
    done = 0
    sem = asyncio.Semaphore(window)

    async def one() -> None:
        nonlocal done
        try:
            await lh.append(body)
            done += 1
        finally:
            sem.release()

    pending = set()
    while not stop.is_set():
        await sem.acquire()
        t = asyncio.ensure_future(one())
        pending.add(t)
        t.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    return done


async def noisy_reader(client: pybk.Client, stop: asyncio.Event, entries: int, size: int,
                       window: int, ready: asyncio.Event) -> int:
    lh = await client.create_ledger(custom_metadata={NAMESPACE_KEY: b"acme/bulk"}, **QUORUMS)
    body = b"r" * size
    for start in range(0, entries, 256):
        await asyncio.gather(*(lh.append(body) for _ in range(min(256, entries - start))))
    await lh.close()
    reader = await client.open_ledger(lh.id, recovery=False)
    ready.set()  # (the backlog is written before B starts: only its reading is measured)
    done = 0

    async def one() -> None:
        nonlocal done
        first = 0
        while not stop.is_set():
            last = min(entries - 1, first + 63)
            done += len(await reader.read(first, last))
            first = 0 if last == entries - 1 else last + 1

    await asyncio.gather(*(one() for _ in range(window)))
    return done


async def scenario(args: argparse.Namespace, tcp: bool, mode: str, noise: str
                   ) -> tuple[list[float], float, int]:
    async with Bench(args, tcp, enforce=(mode != "no enforcement")) as bench:
        b = await bench.client("globex")
        stop = asyncio.Event()
        noisy = None
        ready = asyncio.Event()
        if mode != "alone":
            a = await bench.client("acme")
            if noise == "write":
                noisy = asyncio.ensure_future(noisy_writer(a, stop, args.a_window, args.a_size))
            else:
                noisy = asyncio.ensure_future(noisy_reader(
                    a, stop, args.backlog, args.a_size, args.a_window // 16 or 1, ready))
                await ready.wait()
            await asyncio.sleep(args.warmup)
        lat, tput = await steady_b(b, args.b_rate, args.duration, args.b_size)
        stop.set()
        a_done = await noisy if noisy is not None else 0
        return lat, tput, a_done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration", type=float, default=5.0, help="seconds B appends")
    p.add_argument("--b-rate", type=float, default=200.0, help="B's appends per second")
    p.add_argument("--b-size", type=int, default=1024)
    p.add_argument("--a-size", type=int, default=4096)
    p.add_argument("--a-window", type=int, default=256, help="A's appends in flight")
    p.add_argument("--a-write-rate", type=int, default=4 << 20, help="A's write bytes/s")
    p.add_argument("--a-read-rate", type=int, default=8 << 20, help="A's read bytes/s")
    p.add_argument("--backlog", type=int, default=2000, help="entries A reads over and over")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--transports", choices=("both", "in-proc", "tcp"), default="both")
    p.add_argument("--noise", choices=("both", "write", "read"), default="both")
    p.add_argument("--quick", action="store_true", help="a few seconds in all (tests)")
    args = p.parse_args()
    if args.quick:
        args.duration, args.b_rate, args.backlog, args.warmup = 0.4, 100.0, 300, 0.1
        args.a_window = 32
    print(f"B: {args.b_rate:.0f} appends/s of {args.b_size} B for {args.duration} s; "
          f"A: {args.a_window} appends of {args.a_size} B in flight (or reads of a "
          f"{args.backlog}-entry backlog); A's policy {args.a_write_rate} write B/s, "
          f"{args.a_read_rate} read B/s; 3 bookies E3/Qw2/Qa2 on memory file systems")
    print(f"{'transport':9} {'A does':6} {'scenario':15} {'B p99 ms':>9} {'B appends/s':>12} "
          f"{'A ops':>8} {'p99 x alone':>12} {'tput / alone':>13}  verdict")
    for tcp in [t for t in (False, True)
                if args.transports in ("both", "tcp" if t else "in-proc")]:
        for noise in [n for n in ("write", "read") if args.noise in ("both", n)]:
            rows = {}
            for mode in ("alone", "enforced", "no enforcement"):
                rows[mode] = asyncio.run(scenario(args, tcp, mode, noise))
            alone_p99 = pct(rows["alone"][0], 0.99)
            alone_tput = rows["alone"][1]
            for mode, (lat, tput, a_done) in rows.items():
                p99 = pct(lat, 0.99)
                r_lat, r_tput = p99 / alone_p99, tput / alone_tput
                verdict = "" if mode == "alone" else (
                    f"p99 {'met' if r_lat <= 2 else 'NOT MET'} (<= 2x), throughput "
                    f"{'met' if r_tput >= 0.9 else 'NOT MET'} (>= 0.9x)")
                print(f"{'tcp' if tcp else 'in-proc':9} {noise:6} {mode:15} {p99 * 1e3:9.2f} "
                      f"{tput:12.1f} {a_done:8d} {r_lat:12.2f} {r_tput:13.2f}  {verdict}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
