"""A small key-value application on a pybk log, for the user-facing simulation tests: a
correct one, and one that acknowledges a put before its append is durable."""

from __future__ import annotations

import asyncio

from pybk import LogExistsError


async def _log(cluster):
    ns = cluster.namespace("app")
    try:
        return await ns.create_log("kv", ensemble_size=3, write_quorum=2, ack_quorum=2)
    except LogExistsError:
        return await ns.open_log("kv")

async def _state(log):
    last = await log.last_position()
    got = set()
    if last is None:
        return got
    async for rec in log.reader():
        got.add(rec.data.decode())
        if rec.position >= last:
            break
    return got

async def app(cluster, record, broken=False):
    log = await _log(cluster)
    if cluster.final:  # take the log over (recovering what the last writer acknowledged)
        w = await log.writer()
        record("state", frozenset(await _state(log)))
        await w.close()
        return
    w = await log.writer()
    n = 0
    while not cluster.stopping and n < 200:
        n += 1
        item = f"{cluster.name}-{n}"
        if broken:
            record("put", item)
            fut = w.append(item.encode())
            await asyncio.sleep(0.05)
            await fut
        else:
            await w.append(item.encode())
            record("put", item)
        await asyncio.sleep(0.05)

async def broken_app(cluster, record):
    await app(cluster, record, broken=True)

def check(history):
    puts = {r.values[1] for r in history if r.values[0] == "put"}
    states = [r.values[1] for r in history if r.values[0] == "state"]
    if not states:
        return ["no final state was read"]
    missing = sorted(puts - states[-1])
    return [f"acknowledged puts lost: {missing[:5]}"] if missing else []
