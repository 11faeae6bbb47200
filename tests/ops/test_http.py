"""The bookie's HTTP admin endpoint, with real HTTP requests (aiohttp's client)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pybk.client import Client
from pybk.metadata.memory import MemoryMetadataStore
from pybk.server.http import HttpConfig
from pybk.server.process import BookieProcess, BookieProcessConfig, process_bookie_config
from pybk.testing.metadata_helpers import wait_until

TOKEN = b"s3cret-token"


class Cluster:
    def __init__(self, tmp: Path, store: MemoryMetadataStore) -> None:
        self.tmp = tmp
        self.store = store
        self.processes: dict[str, BookieProcess] = {}

    async def start(self, bookie_id: str, **kw: Any) -> BookieProcess:
        config = BookieProcessConfig(
            data_dir=str(self.tmp / bookie_id), metadata="memory://", port=0,
            bookie_id=bookie_id, http_port=0, rack=kw.pop("rack", ""),
            http_config=kw.pop("http_config", HttpConfig(token=TOKEN)), **kw)
        process = BookieProcess(config, store=self.store.session())
        await process.start()
        self.processes[bookie_id] = process
        return process

    async def stop(self, bookie_id: str) -> None:
        await self.processes.pop(bookie_id).stop()

    def url(self, bookie_id: str, path: str) -> str:
        return f"http://{self.processes[bookie_id].http_address}{path}"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path, MemoryMetadataStore())
    try:
        for i in range(4):
            await c.start(f"b{i}", rack=f"/dc/r{i % 2}", group="gold" if i == 3 else "")
        yield c
    finally:
        for b in list(c.processes):
            await c.stop(b)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


AUTH = {"Authorization": "Bearer " + TOKEN.decode()}


async def write(c: Cluster, ledgers: int = 3) -> list[int]:
    async with Client(c.store.session()) as client:
        ids = []
        for n in range(ledgers):
            lh = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                            custom_metadata={"app": b"t"})
            await lh.append_many([b"%d-%d" % (n, i) for i in range(10)])
            await lh.close()
            ids.append(lh.id)
        return ids


async def test_heartbeat_metrics_and_bookie_info(cluster: Cluster,
                                                 http: aiohttp.ClientSession) -> None:
    await write(cluster)
    async with http.get(cluster.url("b0", "/heartbeat")) as r:
        assert r.status == 200 and await r.text() == "OK\n"
    async with http.get(cluster.url("b0", "/metrics")) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    for name in ("pybk_bookie_adds_total", "pybk_bookie_add_latency_seconds_bucket",
                 "pybk_journal_sync_latency_seconds_count", "pybk_journal_batch_records_bucket",
                 "pybk_journal_queue_records", "pybk_bookie_disk_free_bytes",
                 "pybk_bookie_long_polls_waiting", "pybk_server_connections",
                 "pybk_bookie_gc_runs_total", "pybk_bookie_gc_reclaimed_bytes_total",
                 "pybk_bookie_gc_entries_moved_total", "pybk_bookie_gc_seconds_total",
                 "pybk_bookie_gc_running",
                 'pybk_bookie_state{bookie="b0",state="writable"} 1.0'):
        assert name in text, name
    async with http.get(cluster.url("b1", "/api/v1/bookie/info")) as r:
        info = await r.json()
    assert info["bookie_id"] == "b1" and info["state"] == "writable"
    assert info["rack"] == "/dc/r1" and info["total_bytes"] >= info["free_bytes"] > 0
    assert info["address"] == cluster.processes["b1"].address
    async with http.get(cluster.url("b1", "/api/v1/bookie/gc_details")) as r:
        gc = await r.json()  # a bookie process collects on its own, by default
    assert gc["interval"] == 30.0 and 0 < gc["next_run_in"] <= 30.0 and not gc["running"]


async def test_bookies_ledgers_and_marks(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    ids = await write(cluster)
    async with http.get(cluster.url("b0", "/api/v1/bookie/list_bookies")) as r:
        bookies = (await r.json())["bookies"]
    assert [b["id"] for b in bookies] == ["b0", "b1", "b2", "b3"]
    assert bookies[3] == {"id": "b3", "address": cluster.processes["b3"].address,
                          "state": "writable", "rack": "/dc/r1", "group": "gold"}
    assert bookies[0]["group"] == ""
    async with http.get(cluster.url("b0", "/api/v1/bookie/list_bookies?type=ro")) as r:
        assert (await r.json())["bookies"] == []
    async with http.get(cluster.url("b0", "/api/v1/ledger/list")) as r:
        assert (await r.json())["ledgers"] == ids
    async with http.get(cluster.url("b0", "/api/v1/ledger/list?print_metadata=true")) as r:
        docs = (await r.json())["ledgers"]
    assert sorted(map(int, docs)) == ids
    doc = docs[str(ids[0])]
    assert doc["state"] == "CLOSED" and doc["last_entry_id"] == 9
    assert "master_key" not in doc and "password_hash" not in doc
    named = [lid for lid in ids if "b2" in doc_ensembles(docs[str(lid)])]
    async with http.get(cluster.url("b0", "/api/v1/ledger/list?bookie=b2")) as r:
        assert (await r.json())["ledgers"] == named
    async with http.get(cluster.url("b0", f"/api/v1/ledger/metadata?ledger_id={ids[1]}")) as r:
        assert (await r.json())["ledger_id"] == ids[1]
    await cluster.store.mark_under_replicated(ids[0], ["b9"])
    await cluster.store.mark_under_replicated(ids[1], ["b8", "b9"])
    path = "/api/v1/autorecovery/list_under_replicated_ledger"
    async with http.get(cluster.url("b0", path)) as r:
        assert (await r.json())["ledgers"] == {str(ids[0]): ["b9"], str(ids[1]): ["b8", "b9"]}
    async with http.get(cluster.url("b0", path + "?missingreplica=b8")) as r:
        assert (await r.json())["ledgers"] == {str(ids[1]): ["b8", "b9"]}
    async with http.get(cluster.url("b0", path + "?excludingmissingreplica=b8")) as r:
        assert (await r.json())["ledgers"] == {str(ids[0]): ["b9"]}


def doc_ensembles(doc: dict[str, Any]) -> set[str]:
    return {b for e in doc["ensembles"].values() for b in e}


async def test_bad_requests_get_clear_json_errors(cluster: Cluster,
                                                  http: aiohttp.ClientSession) -> None:
    cases = [
        ("GET", "/api/v1/ledger/metadata?ledger_id=abc", 400, "integer"),
        ("GET", "/api/v1/ledger/metadata?ledger_id=-3", 400, "between 0"),
        ("GET", "/api/v1/ledger/metadata", 400, "missing"),
        ("GET", "/api/v1/ledger/metadata?ledger_id=424242", 404, "does not exist"),
        ("GET", "/api/v1/bookie/list_bookies?type=xx", 400, "rw or ro"),
        ("GET", "/api/v1/ledger/list?print_metadata=maybe", 400, "true or false"),
        ("GET", "/no/such/path", 404, ""),
        ("POST", "/api/v1/bookie/info", 405, ""),
        ("PUT", "/api/v1/autorecovery/status", 400, "enabled=true|false"),
        ("GET", "/api/v1/autorecovery/decommission?bookie_src=nobody", 404, "nobody"),
    ]
    for method, path, status, text in cases:
        async with http.request(method, cluster.url("b0", path), headers=AUTH) as r:
            assert r.status == status, (path, r.status)
            body = await r.json()
            assert text in body["error"], (path, body)
    for body in (b"not json", b"[1, 2]", b'{"bookie_src": 7}'):
        async with http.put(cluster.url("b0", "/api/v1/autorecovery/decommission"),
                            data=body, headers=AUTH) as r:
            assert r.status == 400, body
    async with http.put(cluster.url("b0", "/api/v1/autorecovery/lost_bookie_recovery_delay"),
                        json={"delay_seconds": -1}, headers=AUTH) as r:
        assert r.status == 400 and ">= 0" in (await r.json())["error"]
    big = b"{" + b" " * (70 << 10) + b"}"
    async with http.put(cluster.url("b0", "/api/v1/autorecovery/decommission"), data=big,
                        headers=AUTH) as r:
        assert r.status == 413


async def test_mutating_requests_need_the_token(cluster: Cluster,
                                                http: aiohttp.ClientSession) -> None:
    url = cluster.url("b0", "/api/v1/autorecovery/status?enabled=false")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN.decode()}):
        async with http.put(url, headers=headers) as r:
            assert r.status == 401
    async with http.get(cluster.url("b0", "/api/v1/autorecovery/status")) as r:
        assert (await r.json())["enabled"] is True  # nothing changed; reads need no token
    async with http.put(url, headers=AUTH) as r:
        assert r.status == 200 and (await r.json())["enabled"] is False
    async with http.put(cluster.url("b0", "/api/v1/autorecovery/status?enabled=true"),
                        headers=AUTH) as r:
        assert (await r.json())["enabled"] is True
    async with http.put(cluster.url("b0", "/api/v1/autorecovery/trigger_audit"),
                        headers=AUTH) as r:
        assert (await r.json()) == {"audit_request": 1}
    delay_url = cluster.url("b0", "/api/v1/autorecovery/lost_bookie_recovery_delay")
    async with http.put(delay_url, json={"delay_seconds": 42}, headers=AUTH) as r:
        assert r.status == 200
    async with http.get(delay_url) as r:
        assert (await r.json()) == {"delay_seconds": 42.0}
    async with http.get(cluster.url("b3", "/api/v1/autorecovery/who_is_auditor")) as r:
        assert (await r.json()) == {"auditor": None}  # no bookie runs auto-recovery


async def test_gc_trigger_and_details(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    ids = await write(cluster)
    await cluster.stop("b0")  # again with no minimum age, no timer, and no disk-pressure runs
    # (a disk over gc_disk_pressure, as on a nearly full test machine, starts runs of its own)
    config = dataclasses.replace(process_bookie_config(), gc_min_ledger_age=0, gc_interval=0,
                                 gc_disk_pressure=1.0)
    await cluster.start("b0", rack="/dc/r0", bookie_config=config)
    held = cluster.processes["b0"].bookie.store.ledger_ids()
    gone = next((lid for lid in ids if lid in held), ids[0])
    async with Client(cluster.store.session()) as client:
        await client.delete_ledger(gone)
    async with http.put(cluster.url("b0", "/api/v1/bookie/gc")) as r:
        assert r.status == 401  # mutating: needs the token
    async with http.put(cluster.url("b0", "/api/v1/bookie/gc"), headers=AUTH) as r:
        assert r.status == 200
        done = await r.json()
    assert done["compaction"] == "major" and not done["skipped"]
    assert done["ledgers_removed"] == ([gone] if gone in held else [])
    async with http.get(cluster.url("b0", "/api/v1/bookie/gc_details")) as r:
        details = await r.json()
    assert details["bookie"] == "b0" and details["running"] is False
    assert details["runs"] == 1 and details["majorCompactionCounter"] == 1
    assert details["last_run"] == done and details["interval"] == 0


async def test_decommission_over_http(cluster: Cluster, http: aiohttp.ClientSession) -> None:
    ids = await write(cluster, 4)
    url = cluster.url("b0", "/api/v1/autorecovery/decommission")
    async with http.put(url, json={"bookie_src": "b3"}, headers=AUTH) as r:
        assert r.status == 409 and "still running" in (await r.json())["error"]
    await cluster.stop("b3")

    async def gone() -> bool:  # its registration goes with its clean stop
        async with http.get(cluster.url("b0", "/api/v1/bookie/list_bookies")) as r:
            return "b3" not in [b["id"] for b in (await r.json())["bookies"]]

    await wait_until(gone, 10.0, "b3 to leave the bookie list")
    async with http.put(url, json={"bookie_src": "b3"}, headers=AUTH) as r:
        assert r.status == 202 and (await r.json())["status"] in ("started", "running")

    async def done() -> bool:
        async with http.get(url + "?bookie_src=b3") as r:
            status = await r.json()
        assert status["status"] in ("running", "done"), status
        return bool(status["status"] == "done")

    await wait_until(done, 30.0, "the decommission to finish")
    async with http.get(url + "?bookie_src=b3") as r:
        report = (await r.json())["report"]
    async with http.get(cluster.url("b0", "/api/v1/ledger/list?bookie=b3")) as r:
        assert (await r.json())["ledgers"] == []
    assert set(report["repaired"]) <= set(ids)


async def test_connections_and_requests_in_flight_are_bounded(
        tmp_path: Path, http: aiohttp.ClientSession) -> None:
    gate = asyncio.Event()

    async def stall(op: str, key: object) -> None:
        if op == "list_ledgers":
            await gate.wait()

    store = MemoryMetadataStore()
    c = Cluster(tmp_path, store)
    process = await c.start("b0", http_config=HttpConfig(max_connections=3,
                                                         max_requests_in_flight=1))
    process._client.store.before_op = stall  # the admin's metadata reads can be held
    try:
        slow = asyncio.ensure_future(http.get(c.url("b0", "/api/v1/ledger/list")))
        await wait_until(_in_flight(process), 10.0, "the slow request to be in flight")
        async with http.get(c.url("b0", "/api/v1/autorecovery/status")) as r:
            assert r.status == 503
        for path in ("/heartbeat", "/metrics"):  # health is never refused for load
            async with http.get(c.url("b0", path)) as r:
                assert r.status == 200
        gate.set()
        async with await slow as r:
            assert r.status == 200
        # connections beyond the cap are closed at once
        host, port = process.http_address.rsplit(":", 1)
        held = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /heartbeat HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await asyncio.wait_for(reader.read(), 10.0) == b""  # closed, no answer
        http_server = process._http[0]
        assert http_server.refused["connections"] >= 1
        assert http_server.refused["requests"] == 1
        for _, w in held:
            w.close()
        writer.close()
    finally:
        gate.set()
        await c.stop("b0")


def _in_flight(process: BookieProcess) -> Any:
    async def check() -> bool:
        return bool(process._http[0]._in_flight >= 1)

    return check


async def test_the_metrics_port_serves_only_metrics(tmp_path: Path,
                                                    http: aiohttp.ClientSession) -> None:
    config = BookieProcessConfig(data_dir=str(tmp_path / "m"), metadata="memory://", port=0,
                                 bookie_id="m", metrics_port=0)
    process = BookieProcess(config, store=MemoryMetadataStore())
    await process.start()
    try:
        base = f"http://{process.metrics_address}"
        async with http.get(base + "/metrics") as r:
            assert r.status == 200 and "pybk_bookie_writable" in await r.text()
        async with http.get(base + "/api/v1/bookie/info") as r:
            assert r.status == 404
        async with http.get(base + "/anything") as r:
            assert r.status == 404
    finally:
        await process.stop()
