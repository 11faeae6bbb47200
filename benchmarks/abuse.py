"""A normal client writing to a bookie while four attacks run against it, beside a quiet run.

    python benchmarks/abuse.py [--seconds 15] [--open-files 1024] [--scale 1.0]

One ``pybk bookie`` process (plain TCP, SQLite metadata, 4 MiB journal segments so segments
are created during the run, run under an open-file limit of ``--open-files``, soft and hard,
like a default system). A normal client (this process) appends 1 KiB entries to an E1 ledger
on it, 64 in flight, for ``--seconds``: first with nothing else going on (quiet), then while
a separate attacker process runs the four attacks of the hardening issue at once:

1. long polls: rounds of connections (2 addresses) each sending 1100 long polls with a 24 h
   timeout, then closing;
2. unread reads: 8 connections each pipelining 1024 reads of a 1 MiB entry, never reading;
3. descriptors: 1100 silent connections (2 more addresses);
4. cap lockout: 1024 connections that reconnect as soon as they are closed (2 addresses).

The attacker runs at ``--attacker-nice`` (10): on this small machine the attacker's own CPU
(a thousand reconnecting sockets) would otherwise be taken from the bookie and the client,
where a real attacker spends its own machine's; the kernel's work for its connections still
lands on this one. ``--attacker-nice 0`` gives everything the same priority.

Printed: the normal client's entries/s and p50/p99 append latency, quiet and under attack,
and their ratio (goal: at least 0.5); the longest a *new* client took to be answered during
the attack (probed every 2 s); the bookie's peak RSS (VmHWM, goal: under 512 MiB), its
descriptors and state at the end. ``--scale`` multiplies the attack sizes.

``--per-attack`` runs each attack on its own against a fresh bookie, the four above and the
second round's (duplicate batched adds of a held 1 MiB entry, batched reads of absent ids,
fences of ledgers not created yet, 250 addresses reconnecting), while a normal client
connects every 0.5 s to create a ledger, append and read; per attack it prints the bookie's
peak RSS, its longest event-loop stall (``pybk_loop_stall_seconds_max``), the normal
client's success rate and latency beside the same client on an idle bookie, and the requests
the bookie answered in all (how hard the attacker pressed: on a busy machine a niced attacker
sends fewer).

To measure another checkout of pybk (e.g. before a change), run this script with
``PYTHONPATH=/path/to/that/checkout`` from another directory: the bookie and the attacker run
``python -m pybk`` from a temporary directory, so they import whatever that path holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from abuse_kit import BookieUnderTest

from pybk.client import Client
from pybk.transport.tcp import TcpTransport
from pybk.wire import BookieInfoRequest, Status

KiB, MiB = 1 << 10, 1 << 20


# ----------------------------------------------------------------------------- the attacker


ATTACKS = ("polls", "reads", "silent", "reconnect", "dupadds", "absent", "fences",
           "addresses")
#: the first round's attacks: what the combined run (without --per-attack) runs by default
FIRST_ROUND = ("polls", "reads", "silent", "reconnect")
#: the many-addresses attack's sources (127.0.1.1 .. 127.0.1.250)
MANY = tuple(f"127.0.1.{i}" for i in range(1, 251))


async def _attack(host: str, port: int, ledger_id: int, scale: float, seconds: float,
                  which: tuple[str, ...] = ATTACKS) -> None:
    """The attacker process: the attacks named in ``which`` at once until ``seconds``."""
    from pybk.testing.attacks import (
        LongPollFlood,
        ReconnectFlood,
        SilentConnections,
        UnreadReads,
    )

    def n(x: int) -> int:
        return max(1, int(x * scale))

    attacks: list[Any] = []
    if "reads" in which:
        attacks.append(UnreadReads(host, port, ledger_id=ledger_id, entry_id=0, reads=1024,
                                   connections=n(8), local_addresses=("127.0.0.6",)))
    if "silent" in which:
        attacks.append(SilentConnections(host, port, count=n(1100),
                                         local_addresses=("127.0.0.4", "127.0.0.5")))
    if "reconnect" in which:
        attacks.append(ReconnectFlood(host, port, count=n(1024), pause=0.05,
                                      local_addresses=("127.0.0.2", "127.0.0.3")))
    if "addresses" in which:
        attacks.append(ReconnectFlood(host, port, count=len(MANY), pause=0.01,
                                      local_addresses=MANY))
    for attack in attacks:
        await attack.start()
    requests = [asyncio.ensure_future(_requests(host, port, ledger_id, kind, n(8), seconds))
                for kind in ("dupadds", "absent", "fences") if kind in which]
    print(json.dumps({"event": "attacking"}), flush=True)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    polls: list[Any] = []
    while loop.time() < end:  # long polls: a round of closing connections per second
        if "polls" not in which:
            await asyncio.sleep(min(1.0, max(0.0, end - loop.time())))
            continue
        flood = LongPollFlood(host, port, connections=n(32), polls=1100,
                              local_addresses=("127.0.0.7", "127.0.0.8"))
        await flood.start()
        polls.append(flood)
        await asyncio.sleep(1.0)
    stats: dict[str, int] = {}
    for done in await asyncio.gather(*requests):
        for key, value in done.items():
            stats[key] = stats.get(key, 0) + value
    for attack in [*attacks, *polls]:
        for key, value in attack.stats.items():
            name = f"{type(attack).__name__}.{key}"
            stats[name] = stats.get(name, 0) + value
        await attack.stop()
    try:
        print(json.dumps({"event": "done", "stats": stats}), flush=True)
    except BrokenPipeError:  # the benchmark is gone
        pass


async def _requests(host: str, port: int, ledger_id: int, kind: str, connections: int,
                    seconds: float) -> dict[str, int]:
    """The second round's costly requests, ``connections`` connections of 8 in flight each:
    ``dupadds`` (65,536 small bodies claiming entry 0 of ``ledger_id``, held as 1 MiB),
    ``absent`` (65,536 ids the bookie does not hold), ``fences`` (ids not created yet)."""
    from pybk.wire import (
        AddBatchRequest,
        DigestManager,
        FenceRequest,
        ReadBatchRequest,
        master_key,
    )

    key = master_key(b"")
    small = DigestManager(ledger_id).frame(0, -1, 0, b"x" * 4)
    counts: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    next_id = [ledger_id + 1000]

    def request() -> Any:
        if kind == "dupadds":
            return AddBatchRequest(ledger_id, key, [0] * 65536, [small] * 65536)
        if kind == "absent":
            return ReadBatchRequest(ledger_id, list(range(1 << 20, (1 << 20) + 65536)))
        next_id[0] += 1
        return FenceRequest(next_id[0], master_key(b"guess"))

    async def one(transport: TcpTransport) -> None:
        while loop.time() < end:
            try:
                response = await transport.send("b1", request(), 30.0)
                name = f"{kind}.{Status(response.status).name}"
            except Exception as exc:
                name = f"{kind}.{type(exc).__name__}"
            counts[name] = counts.get(name, 0) + 1

    async def resolve(_bookie_id: str) -> str:
        return f"{host}:{port}"

    transports = [TcpTransport(resolve) for _ in range(connections)]
    try:
        await asyncio.gather(*(one(t) for t in transports for _ in range(8)))
    finally:
        for t in transports:
            await t.close()
    return counts


# ------------------------------------------------------------------------ the normal client


async def _write(lh: Any, seconds: float, window: int, payload: bytes) -> dict[str, Any]:
    """Append for ``seconds`` keeping ``window`` in flight: rate, latencies, errors."""
    latencies: list[float] = []
    errors: list[str] = []
    slots = asyncio.Semaphore(window)

    def done(start: float, fut: asyncio.Future[int]) -> None:
        slots.release()
        if fut.exception() is not None:
            errors.append(repr(fut.exception()))
        else:
            latencies.append(time.perf_counter() - start)

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds and not errors:
        await slots.acquire()
        start = time.perf_counter()
        try:
            lh.append(payload).add_done_callback(lambda f, s=start: done(s, f))
        except Exception as exc:  # the ledger handle is broken: the run ends here
            errors.append(repr(exc))
            slots.release()
    for _ in range(window):
        await slots.acquire()
    elapsed = max(time.perf_counter() - t0, seconds)  # (a run cut short still counts whole)
    q = statistics.quantiles(latencies, n=100) if len(latencies) >= 100 else [float("nan")] * 99
    return {"rate": len(latencies) / elapsed, "p50": q[49] * 1e3, "p99": q[98] * 1e3,
            "errors": errors[:3], "entries": len(latencies)}


async def _probe_new_clients(address: str, stop: asyncio.Event) -> list[float]:
    """Every 2 s: how long a brand-new connection takes to get an answer (inf: not in 10 s)."""
    waits: list[float] = []

    async def resolve(_bookie_id: str) -> str:
        return address

    while not stop.is_set():
        began = time.perf_counter()
        answered = float("inf")
        while time.perf_counter() - began < 10 and not stop.is_set():
            transport = TcpTransport(resolve, backoff_initial=0.05, backoff_max=0.2)
            try:
                response = await transport.send("b1", BookieInfoRequest(), 2.0)
                if response.status == Status.OK:
                    answered = time.perf_counter() - began
                    break
            except Exception:
                await asyncio.sleep(0.1)
            finally:
                await transport.close()
        waits.append(answered)
        try:
            await asyncio.wait_for(stop.wait(), 2.0)
        except TimeoutError:
            pass
    return waits


async def _run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    bookie = BookieUnderTest(root, "--segment-mb", "4", open_files=args.open_files)
    await bookie.astart()
    result: dict[str, Any] = {}
    try:
        payload = os.urandom(1024)
        async with Client(bookie.metadata) as client:
            big = await client.create_ledger(1, 1, 1)
            await big.append(os.urandom(MiB))  # what the unread reads ask for
            await big.close()
            lh = await client.create_ledger(1, 1, 1)
            await _write(lh, 2.0, args.window, payload)  # warm-up
            result["quiet"] = await _write(lh, args.seconds, args.window, payload)
            result["rss_before_attack"] = bookie.rss()
            attacker = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--attacker", bookie.address, "--ledger", str(big.id),
                "--scale", str(args.scale), "--seconds", str(args.seconds + 5),
                "--attacks", ",".join(args.attacks), "--nice", str(args.attacker_nice),
                cwd=root, stdout=asyncio.subprocess.PIPE,
            )
            assert attacker.stdout is not None
            line = await asyncio.wait_for(attacker.stdout.readline(), 120)
            assert b"attacking" in line, line
            stop = asyncio.Event()
            probe = asyncio.create_task(_probe_new_clients(bookie.address, stop))
            result["attacked"] = await _write(lh, args.seconds, args.window, payload)
            stop.set()
            result["new_client_waits"] = await probe
            result["peak_rss"] = bookie.peak_rss()
            result["descriptors"] = bookie.descriptors()
            try:
                result["metrics"] = {
                    k: v for k, v in (await bookie.ametrics()).items()
                    if k.startswith(("event:refused", "event:displaced", "event:long_poll",
                                     "event:peer_closed", "event:write_timeout", "event:shed",
                                     "event:accept_errors", "pybk_server_"))}
            except Exception as exc:  # the metrics port is just another socket to starve
                result["metrics"] = {"unreachable": repr(exc)}
            try:
                done = await asyncio.wait_for(attacker.stdout.read(), 60)
                lines = done.decode().strip().splitlines()
                result["attacker"] = json.loads(lines[-1])["stats"] if lines else {}
            except TimeoutError:
                result["attacker"] = {"unfinished": "killed after 60 s"}
            if attacker.returncode is None:
                attacker.kill()
            await attacker.wait()
            try:
                await lh.close()
            except Exception as exc:
                result["close_error"] = repr(exc)
        try:
            async def resolve(_b: str) -> str:
                return bookie.address

            transport = TcpTransport(resolve)
            info = await transport.send("b1", BookieInfoRequest(), 10.0)
            result["state"] = f"{info.state} ({info.message})"
            await transport.close()
        except Exception as exc:
            result["state"] = f"unreachable: {exc!r}"
        result["stop_seconds"], _code = await asyncio.to_thread(bookie.stop, 60.0)
        log = bookie.log()
        result["log_lines"] = len(log.splitlines())
        result["log_bytes"] = len(log)
        result["tracebacks"] = log.count("Traceback")
    finally:
        bookie.kill()
    return result


async def _normal_client(metadata: str, stop: asyncio.Event) -> list[float | None]:
    """Every 0.5 s a new client: create a ledger, append, read it back; seconds it took
    (None: failed or not within 5 s)."""
    took: list[float | None] = []

    async def once() -> None:
        async with Client(metadata) as client:
            lh = await client.create_ledger(1, 1, 1)
            await lh.append(b"probe")
            await lh.close()
            rh = await client.open_ledger(lh.id, recovery=False)
            [entry] = await rh.read(0, 0)
            assert entry.data == b"probe"

    while not stop.is_set():
        began = time.perf_counter()
        try:
            await asyncio.wait_for(once(), 5.0)
            took.append(time.perf_counter() - began)
        except Exception:
            took.append(None)
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass
    return took


async def _one_attack(root: Path, args: argparse.Namespace, attack: str) -> dict[str, Any]:
    """One attack (or "idle") against a fresh bookie, the normal client beside it."""
    bookie = BookieUnderTest(root / attack, "--segment-mb", "4", open_files=args.open_files)
    await bookie.astart()
    attacker = None
    try:
        async with Client(bookie.metadata) as client:
            big = await client.create_ledger(1, 1, 1)
            await big.append(os.urandom(MiB))  # held as 1 MiB: what dupadds claim, reads ask
            await big.close()
        if attack != "idle":
            attacker = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--attacker", bookie.address, "--ledger", str(big.id),
                "--scale", str(args.scale), "--seconds", str(args.seconds + 5),
                "--attacks", attack, "--nice", str(args.attacker_nice),
                cwd=root, stdout=asyncio.subprocess.PIPE)
            assert attacker.stdout is not None
            line = await asyncio.wait_for(attacker.stdout.readline(), 120)
            assert b"attacking" in line, line
        stop = asyncio.Event()
        probe = asyncio.create_task(_normal_client(bookie.metadata, stop))
        await asyncio.sleep(args.seconds)
        stop.set()
        took = await probe
        try:
            metrics = await bookie.ametrics()
        except Exception:  # the metrics port is just another socket to starve
            metrics = {}
        stall = metrics.get("pybk_loop_stall_seconds_max", float("nan"))
        return {"attack": attack, "peak_rss": bookie.peak_rss(), "stall": stall, "took": took,
                "answered": metrics.get("event:requests", float("nan"))}
    finally:
        if attacker is not None:
            if attacker.returncode is None:
                attacker.kill()
            await attacker.wait()
        bookie.kill()


def _print_per_attack(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import pybk

    print(f"pybk from {Path(pybk.__file__).parent}; a fresh bookie per attack, "
          f"{args.seconds:g} s each at scale {args.scale:g} (attacker at nice "
          f"{args.attacker_nice}); normal client: a new connection every 0.5 s creating a "
          "ledger, appending and reading")
    print(f"{'attack':>10} {'peak RSS':>9} {'stall ms':>9} {'client ok':>10} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'p50 x idle':>10} {'answered':>9}")
    idle_p50 = float("nan")
    for row in rows:
        ok = sorted(t for t in row["took"] if t is not None)
        rate = len(ok) / len(row["took"]) if row["took"] else 0.0
        p50 = ok[len(ok) // 2] * 1e3 if ok else float("nan")
        p99 = ok[min(len(ok) - 1, int(len(ok) * 0.99))] * 1e3 if ok else float("nan")
        if row["attack"] == "idle":
            idle_p50 = p50
        print(f"{row['attack']:>10} {row['peak_rss'] / MiB:>6.0f} MiB {row['stall'] * 1e3:>9.1f} "
              f"{rate:>9.0%} {p50:>8.1f} {p99:>8.1f} {p50 / idle_p50:>10.2f} "
              f"{row['answered']:>9.0f}")
    sys.stdout.flush()


def _print(result: dict[str, Any], args: argparse.Namespace) -> None:
    import pybk

    q, a = result["quiet"], result["attacked"]
    print(f"pybk from {Path(pybk.__file__).parent}; bookie under RLIMIT_NOFILE "
          f"{args.open_files}; {args.seconds:g} s per run; 1 KiB appends, E1, "
          f"{args.window} in flight; attacks {','.join(args.attacks)} at scale {args.scale:g}, "
          f"attacker at nice {args.attacker_nice}")
    print(f"{'run':>10} {'entries/s':>10} {'p50 ms':>8} {'p99 ms':>8}  errors")
    for name, r in (("quiet", q), ("attacked", a)):
        print(f"{name:>10} {r['rate']:>10.0f} {r['p50']:>8.2f} {r['p99']:>8.2f}  "
              f"{r['errors'] or '-'}")
    ratio = a["rate"] / q["rate"] if q["rate"] else 0.0
    print(f"{'ratio':>10} {ratio:>10.2f}   ({'meets' if ratio >= 0.5 else 'BELOW'} the 0.5 goal)")
    waits = result["new_client_waits"]
    worst = max(waits) if waits else float("nan")
    print(f"new clients during the attack: {len(waits)} probes, longest wait {worst:.2f} s")
    peak = result["peak_rss"] / MiB
    print(f"bookie peak RSS {peak:.0f} MiB ({'meets' if peak < 512 else 'ABOVE'} the 512 MiB "
          f"goal; {result['rss_before_attack'] / MiB:.0f} MiB before the attack), "
          f"{result['descriptors']} descriptors at the end")
    print(f"bookie state afterwards: {result['state']}; SIGTERM took "
          f"{result['stop_seconds']:.1f} s; log {result['log_lines']} lines "
          f"({result['log_bytes'] / KiB:.0f} KiB, {result['tracebacks']} tracebacks)")
    if result.get("close_error"):
        print(f"closing the ledger failed: {result['close_error']}")
    print("bookie counters:", json.dumps(result["metrics"], sort_keys=True))
    print("attacker:", json.dumps(result["attacker"], sort_keys=True))
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--open-files", type=int, default=1024,
                    help="RLIMIT_NOFILE (soft and hard) of the bookie process")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the attack sizes")
    ap.add_argument("--per-attack", action="store_true",
                    help="each attack on its own against a fresh bookie (see above)")
    ap.add_argument("--attacks", default=None,
                    help=f"which attacks run (a comma-separated subset of {','.join(ATTACKS)})")
    ap.add_argument("--attacker-nice", type=int, default=10,
                    help="niceness of the attacker process (0: the same as the bookie's)")
    ap.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--attacker", metavar="HOST:PORT", help=argparse.SUPPRESS)
    ap.add_argument("--ledger", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    chosen = args.attacks or ",".join(ATTACKS if args.per_attack else FIRST_ROUND)
    args.attacks = tuple(a for a in chosen.split(",") if a)
    unknown = set(args.attacks) - set(ATTACKS)
    if unknown:
        ap.error(f"unknown attacks {sorted(unknown)}; choose from {','.join(ATTACKS)}")
    if args.attacker:
        if args.nice:
            os.nice(args.nice)
        host, _, port = args.attacker.rpartition(":")
        asyncio.run(_attack(host, int(port), args.ledger, args.scale, args.seconds,
                            args.attacks))
        return
    with tempfile.TemporaryDirectory(prefix="pybk-abuse-") as tmp:
        if args.per_attack:
            async def each() -> list[dict[str, Any]]:
                return [await _one_attack(Path(tmp), args, attack)
                        for attack in ("idle", *args.attacks)]

            _print_per_attack(asyncio.run(each()), args)
            return
        result = asyncio.run(_run(Path(tmp), args))
    _print(result, args)


if __name__ == "__main__":
    main()
