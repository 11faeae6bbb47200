"""Two table servers opening one range at once: the one that took the range's logs first but
caught up last must not serve (found by simulator seed 226)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from logs_kit import mem_cluster

import pybk
from pybk.cluster import LocalCluster
from pybk.tables import AsyncTable, TablesEngine
from pybk.tables.engine import LOG_NAMESPACE
from pybk.tables.range import TABLES_CATCH_UP_UNCHECKED, RangeOwner, log_names


class _GatedLog:
    """A log whose readers wait for ``gate`` (and say so on ``reached``) before reading."""

    def __init__(self, log: Any, reached: asyncio.Event, gate: asyncio.Event) -> None:
        self._log, self._reached, self._gate = log, reached, gate

    def reader(self, *args: Any, **kwargs: Any) -> _GatedReader:
        return _GatedReader(self._log.reader(*args, **kwargs), self._reached, self._gate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class _GatedReader:
    def __init__(self, inner: Any, reached: asyncio.Event, gate: asyncio.Event) -> None:
        self._inner, self._reached, self._gate = inner, reached, gate

    async def __aenter__(self) -> Any:
        self._reached.set()
        await self._gate.wait()
        return await self._inner.__aenter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc)


class _GatedNamespace:
    """The log namespace, with one log's readers gated (the rest passes through)."""

    def __init__(self, ns: Any, gated: str, reached: asyncio.Event,
                 gate: asyncio.Event) -> None:
        self._ns, self._gated, self._reached, self._gate = ns, gated, reached, gate

    async def open_log(self, name: str) -> Any:
        log = await self._ns.open_log(name)
        return _GatedLog(log, self._reached, self._gate) if name == self._gated else log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ns, name)


async def _table(cluster: LocalCluster) -> tuple[TablesEngine, AsyncTable]:
    engine = TablesEngine(cluster.client())
    try:
        await engine.create_namespace("default")
    except pybk.NamespaceExistsError:
        pass
    try:
        info = await engine.catalog.create_table("default", "t", 1)
    except pybk.TableExistsError:
        info = await engine.catalog.get_table("default", "t")
    return engine, AsyncTable(engine, info)


@pytest.mark.parametrize("broken", [False, True], ids=["fixed", TABLES_CATCH_UP_UNCHECKED])
async def test_an_owner_overtaken_while_catching_up_does_not_serve(broken: bool) -> None:
    """A takes the command log and the checkpoint log, then stalls before it reads the
    checkpoint; B takes the range over, writes, checkpoints (truncating the command log past
    A's catch-up point) and writes again. A must then fail to open, not serve at a revision
    below what the log holds; B goes on, and a later owner has every acknowledged write
    once. With the check switched off, A serves from its old state (seed 226's failure)."""
    async with mem_cluster() as cluster:
        acked: dict[bytes, tuple[bytes, int]] = {}
        e0, t0 = await _table(cluster)
        for i in range(5):
            acked[b"k%d" % i] = (b"v%d" % i, await t0.put(b"k%d" % i, b"v%d" % i))
        counter = await t0.increment(b"n", 2)
        await e0.owned()[0].checkpoint()  # the checkpoint A will find
        acked[b"k0"] = (b"w0", await t0.put(b"k0", b"w0"))
        await e0.abandon()  # (a crash)

        info = t0.info
        range_id = info.ranges[0].range_id
        _, ckpt_name = log_names(info.table_id, range_id)
        ns = cluster.client().namespace(LOG_NAMESPACE)
        reached, gate = asyncio.Event(), asyncio.Event()
        stale = RangeOwner(_GatedNamespace(ns, ckpt_name, reached, gate),  # type: ignore[arg-type]
                           info.table_id, range_id,
                           mutations=frozenset({TABLES_CATCH_UP_UNCHECKED} if broken else ()))
        opening = asyncio.ensure_future(stale.open())
        await asyncio.wait_for(reached.wait(), 10.0)  # A holds both logs' writer locks

        e1, t1 = await _table(cluster)  # B takes the range over from A
        for i in range(3, 8):
            acked[b"k%d" % i] = (b"x%d" % i, await t1.put(b"k%d" % i, b"x%d" % i))
        counter = await t1.increment(b"n", 3)
        await e1.owned()[0].checkpoint()
        acked[b"k1"] = (b"x1", await t1.put(b"k1", b"x1"))
        top = max(r for _, r in acked.values())  # the command log's last txid

        gate.set()  # A catches up now, behind B's checkpoint and truncation
        if broken:
            await asyncio.wait_for(opening, 10.0)
            assert stale.revision < top
            with pytest.raises(ValueError, match="below the log's last txid"):
                stale.submit(("put", b"k9", b"late"))
            await stale.abandon()
            return
        try:
            await asyncio.wait_for(opening, 10.0)
        except pybk.RangeFencedError:
            pass
        else:
            pytest.fail(f"the overtaken owner opened at revision {stale.revision}, below the "
                        f"command log's last txid {top}")
        assert stale.failed is not None
        with pytest.raises(pybk.RangeFencedError):
            stale.submit(("put", b"k9", b"late"))

        acked[b"k2"] = (b"y2", await t1.put(b"k2", b"y2"))  # B still serves
        await e1.abandon()
        _, t2 = await _table(cluster)
        for k, (v, rev) in acked.items():
            kv = await t2.get(k)
            assert kv is not None and (kv.value, kv.mod_revision) == (v, rev), k
        n = await t2.get(b"n")
        assert n is not None and n.value == counter == 5  # each increment applied once
        rev = await t2.put(b"k9", b"after")
        assert rev > max(r for _, r in acked.values()) > top
