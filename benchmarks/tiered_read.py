"""Catch-up reads of a log from the bookies and from the object-store tier, side by side;
offload throughput; a durable cursor's acknowledgement rate (one at a time, many in flight,
cumulative) with what each costs in cursor-ledger entries.

One process: three in-process bookies on real files (a LocalCluster under a temporary
directory), the tier a local folder (``file://``) or, with ``--s3``, a moto S3 server started
here on a free loopback port. The log is written with ``append_many`` of ``--record``-byte
records; each read is a fresh reader from the first record to the last.

Issue 38 sets no numeric target for these figures; the ratio line says how the tier compares
with the bookies on this machine (the target's verdict: none stated, figures only).

    python benchmarks/tiered_read.py [--mb 1024] [--record 1024] [--rounds 3] [--s3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pybk
from pybk.logs import OFFLOADED

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


async def _write(log: pybk.Log, total: int, record: int) -> pybk.Position:
    payload = os.urandom(record)
    batch = max(1, (1 << 20) // record)
    last = None
    async with await log.writer() as w:
        pending = []
        for _ in range(0, total, batch):
            pending.append(w.append_many([payload] * batch))
            if len(pending) >= 8:
                last = (await pending.pop(0))[-1]
        for fut in pending:
            last = (await fut)[-1]
    assert last is not None
    return last


async def _read_all(log: pybk.Log, last: pybk.Position) -> tuple[int, int, float]:
    t0 = time.perf_counter()
    n = size = 0
    async with log.reader(stop_at=last) as r:
        while batch := await r.read_batch(10_000):
            n += len(batch)
            size += sum(len(rec.data) for rec in batch)
    return n, size, time.perf_counter() - t0


async def _acks(log: pybk.Log, last: pybk.Position, count: int) -> list[tuple[str, float, float]]:
    out = []
    for mode in ("one at a time", "64 in flight", "cumulative/100"):
        name = "bench-" + mode.split()[0].replace("/", "")
        cur = await log.subscribe(name)
        recs = [await cur.receive() for _ in range(count)]
        t0 = time.perf_counter()
        if mode == "one at a time":
            for rec in recs:
                await cur.ack(rec.position)  # type: ignore[union-attr]
        elif mode == "64 in flight":
            for i in range(0, count, 64):
                await asyncio.gather(*(cur.ack(r.position)  # type: ignore[union-attr]
                                       for r in recs[i:i + 64]))
        else:
            for i in range(99, count, 100):
                await cur.ack_cumulative(recs[i].position)  # type: ignore[union-attr]
        dt = time.perf_counter() - t0
        out.append((mode, count / dt, cur.persisted / count))
        await cur.close()
        await log.delete_cursor(name)
    return out


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        tier_url = f"file://{root}/tier"
        options: dict[str, str] = {}
        server = None
        if args.s3:
            from tier_kit import moto_server

            os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                              AWS_DEFAULT_REGION="us-east-1")
            server = moto_server()
            endpoint = server.__enter__()
            import s3fs

            s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir("bench")
            tier_url, options = "s3://bench/tier", {"endpoint_url": endpoint}
        try:
            async with pybk.LocalCluster(f"{root}/cluster", 3) as cluster:
                ns = cluster.client().namespace()
                log = await ns.create_log("bench", roll_bytes=args.segment_mb << 20)
                total = (args.mb << 20) // args.record
                t0 = time.perf_counter()
                last = await _write(log, total, args.record)
                write_s = time.perf_counter() - t0
                segs = len(await log.segments())
                print(f"log: {total:,} records of {args.record} B = {args.mb} MB in {segs} "
                      f"segments; written in {write_s:.1f} s; tier {tier_url.split(':')[0]}")
                bk = [await _read_all(log, last) for _ in range(args.rounds)]
                await log.set_offload(tier_url, options=options, deletion_lag=0)
                t0 = time.perf_counter()
                done = await log.offload()
                off_s = time.perf_counter() - t0
                assert all(s.tier == OFFLOADED for s in await log.segments() if s.seq in done)
                tier = [await _read_all(log, last) for _ in range(args.rounds)]
                assert bk[0][:2] == tier[0][:2]
                mbps_bk = statistics.median(s / t for _, s, t in bk) / (1 << 20)
                mbps_tier = statistics.median(s / t for _, s, t in tier) / (1 << 20)
                rps_bk = statistics.median(n / t for n, _, t in bk)
                rps_tier = statistics.median(n / t for n, _, t in tier)
                print(f"{'catch-up read':<22}{'MB/s':>10}{'records/s':>14}   (median of "
                      f"{args.rounds})")
                print(f"{'  bookies':<22}{mbps_bk:>10.1f}{rps_bk:>14,.0f}")
                print(f"{'  tier':<22}{mbps_tier:>10.1f}{rps_tier:>14,.0f}")
                print(f"ratio tier / bookies: {mbps_tier / mbps_bk:.2f}x (target: none stated "
                      "in issue 38; figures only)")
                print(f"offload: {len(done)} segments, {args.mb / off_s:.1f} MB/s "
                      "(read from bookies, write, read back to verify)")
                log2 = await ns.create_log("acks")
                last2 = await _write(log2, args.acks, 16)
                assert last2 is not None
                print(f"{'cursor acks':<22}{'acks/s':>10}{'entries/ack':>14}")
                for mode, rate, per in await _acks(log2, last2, args.acks):
                    print(f"  {mode:<20}{rate:>10,.0f}{per:>14.3f}")
        finally:
            if server is not None:
                server.__exit__(None, None, None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="log size (MB)")
    parser.add_argument("--record", type=int, default=1024, help="record size (bytes)")
    parser.add_argument("--segment-mb", type=int, default=64, help="roll_bytes (MB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--acks", type=int, default=2000, help="records acknowledged per mode")
    parser.add_argument("--s3", action="store_true", help="a moto S3 server as the tier")
    parser.add_argument("--dir", default=None, help="where the temporary directory goes")
    asyncio.run(main(parser.parse_args()))
