"""Tenancy enforcement in the bookie, in process: namespace ownership, rates (delayed, never
failed, in order), fairness, storage quotas (per bookie; surviving a restart; lowered by
deletion), metadata reads bounded, policy updates without restart, metrics."""

from __future__ import annotations

import asyncio

import pytest

import pybk
from pybk.bookie.tenancy import TenancyEnforcer, TokenBucket, enable_tenancy
from pybk.errors import NoSuchLedgerError, QuotaExceededError, UnauthorizedError
from pybk.metadata.tenancy import NAMESPACE_KEY, NamespacePolicies, TenancyRecords
from pybk.transport.local import LocalTransport
from pybk.wire import Status
from pybk.wire.requests import AddRequest, ReadRequest

ALL3 = {"ensemble_size": 3, "write_quorum": 3, "ack_quorum": 3}


async def _cluster(tmp_path, *policies: tuple[str, NamespacePolicies]):
    cluster = pybk.LocalCluster(tmp_path, bookies=3)
    await cluster.start()
    records = TenancyRecords(cluster.store)
    for tenant in ("acme", "globex"):
        await records.create_tenant(tenant)
    for ns, pol in policies:
        await records.create_namespace(ns, policies=pol)
    for bid in cluster.bookie_ids:
        await enable_tenancy(cluster.bookie(bid), cluster.store, authenticated=True)
    return cluster


def _client(cluster, principal: str) -> pybk.Client:
    transport = cluster.local_transport()
    assert isinstance(transport, LocalTransport)
    transport.principal = principal
    return cluster.client(transport=transport)


def _enforcers(cluster) -> list[TenancyEnforcer]:
    return [cluster.bookie(b).tenancy for b in cluster.bookie_ids]


async def _ledger(client, ns: str | None, **quorums):
    md = {NAMESPACE_KEY: ns.encode()} if ns else None
    return await client.create_ledger(custom_metadata=md, **(quorums or ALL3))


def test_token_bucket_debt_is_the_delay():
    bucket = TokenBucket(10, now=0.0, burst=1.0)
    assert bucket.take(10, 0.0) == 0.0
    assert bucket.take(5, 0.0) == pytest.approx(0.5)
    assert bucket.take(0, 1.0) == 0.0  # refilled (5 of debt paid, 5 saved)
    assert bucket.take(10, 1.0) == pytest.approx(0.5)  # only 5 were saved


async def test_cross_tenant_refused_and_open_ledgers(tmp_path):
    cluster = await _cluster(tmp_path, ("acme/orders", NamespacePolicies()))
    try:
        acme, globex = _client(cluster, "acme"), _client(cluster, "globex")
        lh = await _ledger(acme, "acme/orders")
        await lh.append(b"mine")
        intruder = await _ledger(globex, "acme/orders")
        with pytest.raises(UnauthorizedError):
            await intruder.append(b"not yours")
        with pytest.raises(pybk.BKError, match="UNAUTHORIZED"):  # globex may not read it
            reader = await globex.open_ledger(lh.id, recovery=False)
            await reader.read(0, 0)
        open_ledger = await _ledger(globex, None)  # no namespace: open to all
        await open_ledger.append(b"anyone")
        rejected = sum(e.rejected[("globex", "acme/orders", "unauthorized")]
                       for e in _enforcers(cluster))
        assert rejected >= 1
    finally:
        await cluster.close()


async def test_rate_delays_never_fails_and_keeps_order(tmp_path):
    cluster = await _cluster(tmp_path, ("acme/slow", NamespacePolicies(write_records_per_s=40)))
    try:
        acme = _client(cluster, "acme")
        lh = await _ledger(acme, "acme/slow")
        loop = asyncio.get_running_loop()
        start = loop.time()
        # pushed all at once: 60 entries at 40/s (4 saved) take about 1.4 s, none fails
        await asyncio.gather(*(lh.append(f"e{i}".encode()) for i in range(60)))
        took = loop.time() - start
        assert took >= 1.0
        entries = await lh.read(0, 59)
        assert [e.data for e in entries] == [f"e{i}".encode() for i in range(60)]
        assert sum(e.throttled[("acme", "acme/slow")] for e in _enforcers(cluster)) > 1.0
    finally:
        await cluster.close()


async def test_fair_other_tenant_not_behind_a_throttled_backlog(tmp_path):
    cluster = await _cluster(tmp_path, ("acme/bulk", NamespacePolicies(write_records_per_s=100)),
                             ("globex/app", NamespacePolicies()))
    try:
        acme, globex = _client(cluster, "acme"), _client(cluster, "globex")
        bulk = await _ledger(acme, "acme/bulk")
        backlog = [asyncio.ensure_future(bulk.append(b"x" * 100)) for _ in range(150)]
        await asyncio.sleep(0)
        app = await _ledger(globex, "globex/app")
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(20):
            await app.append(f"b{i}".encode())
        took = loop.time() - start
        assert not all(f.done() for f in backlog)  # A's backlog is still waiting
        assert took < 0.5, took  # B did not wait behind ~1.5 s of A's backlog
        await asyncio.gather(*backlog)
    finally:
        await cluster.close()


async def test_storage_quota_other_tenant_keeps_writing_deletion_frees(tmp_path):
    cluster = await _cluster(tmp_path, ("acme/small", NamespacePolicies(max_storage_bytes=8000)),
                             ("globex/app", NamespacePolicies()))
    try:
        acme, globex = _client(cluster, "acme"), _client(cluster, "globex")
        lh = await _ledger(acme, "acme/small")
        other = await _ledger(globex, "globex/app")
        written = 0
        with pytest.raises(QuotaExceededError):
            for _ in range(50):
                await lh.append(b"q" * 1000)
                written += 1
                await other.append(b"b" * 1000)
        assert 5 <= written < 10
        for _ in range(10):
            await other.append(b"b" * 1000)  # globex keeps writing
        fresh = await _ledger(acme, "acme/small")  # a new ledger's first add: refused too
        with pytest.raises(QuotaExceededError):
            await fresh.append(b"q")
        for e in _enforcers(cluster):
            assert e.rejected[("acme", "acme/small", "quota_exceeded")] >= 1
        await acme.delete_ledger(lh.id)
        await acme.delete_ledger(fresh.id)
        async def is_live(ledger_id: int) -> bool:
            try:
                await cluster.store.read_ledger(ledger_id)
            except NoSuchLedgerError:
                return False
            return True

        for bid in cluster.bookie_ids:  # (the collector's own run skips ledgers this young)
            assert await cluster.bookie(bid).collect_garbage(is_live, compact=False)
        again = await _ledger(acme, "acme/small")
        await again.append(b"q" * 1000)  # room again after deletion and collection
    finally:
        await cluster.close()


async def test_storage_usage_survives_restart(tmp_path):
    cluster = await _cluster(tmp_path, ("acme/orders", NamespacePolicies()))
    try:
        acme = _client(cluster, "acme")
        lh = await _ledger(acme, "acme/orders")
        for _ in range(10):
            await lh.append(b"r" * 500)
        bid = cluster.bookie_ids[0]
        before = cluster.bookie(bid).tenancy.usage.bytes("acme/orders")
        assert before >= 5000
        await cluster.stop_bookie(bid)
        await cluster.start_bookie(bid)
        after = await enable_tenancy(cluster.bookie(bid), cluster.store, authenticated=True)
        assert after.usage.bytes("acme/orders") >= 5000
        assert abs(after.usage.bytes("acme/orders") - before) <= 10 * 64  # (record headers)
    finally:
        await cluster.close()


async def test_metadata_reads_bounded_and_policy_update_applies(tmp_path):
    cluster = await _cluster(tmp_path, ("acme/orders", NamespacePolicies()))
    try:
        acme = _client(cluster, "acme")
        lh = await _ledger(acme, "acme/orders")
        await asyncio.gather(*(lh.append(b"m" * 100) for _ in range(200)))
        for e in _enforcers(cluster):
            assert e.metadata_reads <= 2  # the ledger's metadata once, the policies once
        await TenancyRecords(cluster.store).update_namespace(
            "acme/orders", NamespacePolicies(max_storage_bytes=1000))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while any(e.policies("acme/orders").max_storage_bytes != 1000  # type: ignore[union-attr]
                  for e in _enforcers(cluster)):
            assert loop.time() < deadline, "the policy update never arrived"
            await asyncio.sleep(0.01)
        with pytest.raises(QuotaExceededError):
            await lh.append(b"m")
        # a ledger that does not exist: read once, the negative answer cached
        e = _enforcers(cluster)[0]
        reads = e.metadata_reads
        for _ in range(3):
            assert await e.namespace_of(987654321) is None
        assert e.metadata_reads == reads + 1
    finally:
        await cluster.close()


async def _answer(enforcer: TenancyEnforcer, principal: str, request: object) -> object:
    decision = enforcer.check(principal, request)  # type: ignore[arg-type]
    return await decision if asyncio.iscoroutine(decision) else decision


async def test_a_ledger_asked_about_before_it_exists_is_guarded_once_created(tmp_path):
    """Asking a bookie about an id before its ledger exists must not leave the ledger
    unguarded later: once created in a namespace, another tenant's adds and reads of it are
    refused (the gate once remembered "no namespace" for it)."""
    cluster = await _cluster(tmp_path, ("acme/orders", NamespacePolicies()))
    try:
        acme = _client(cluster, "acme")
        lid = await cluster.store.allocate_ledger_id()
        for e in _enforcers(cluster):
            assert await e.namespace_of(lid) is None  # no such ledger yet
            assert await _answer(e, "globex", ReadRequest(lid, 0)) is None
        lh = await acme.create_ledger(custom_metadata={NAMESPACE_KEY: b"acme/orders"},
                                      ledger_id=lid, **ALL3)
        for e in _enforcers(cluster):
            refused = await _answer(e, "globex", AddRequest(lid, 0, b"k" * 20, b"x"))
            assert getattr(refused, "status", None) == Status.UNAUTHORIZED, refused
        await lh.append(b"secret")
        for e in _enforcers(cluster):
            refused = await _answer(e, "globex", ReadRequest(lid, 0))
            assert getattr(refused, "status", None) == Status.UNAUTHORIZED, refused
            assert await _answer(e, "acme", ReadRequest(lid, 0)) is None
    finally:
        await cluster.close()


async def test_metrics_have_the_dashboard_names(tmp_path):
    cluster = await _cluster(tmp_path, ("acme/orders", NamespacePolicies(
        max_storage_bytes=1 << 30, write_bytes_per_s=1 << 30)))
    try:
        acme = _client(cluster, "acme")
        lh = await _ledger(acme, "acme/orders")
        await lh.append(b"m" * 100)
        await lh.read(0, 0)
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry()
        for e in _enforcers(cluster):
            registry.register(e)
        text = generate_latest(registry).decode()
        for name in ("pybk_tenant_write_bytes_total", "pybk_tenant_write_records_total",
                     "pybk_tenant_read_bytes_total", "pybk_tenant_read_records_total",
                     "pybk_tenant_throttled_seconds_total",
                     "pybk_tenant_rejected_requests_total", "pybk_tenant_storage_bytes",
                     "pybk_tenant_storage_quota_bytes"):
            assert f"# TYPE {name.removesuffix('_total')}" in text, name
        assert 'pybk_tenant_write_records_total{namespace="acme/orders",tenant="acme"}' in text
        assert 'pybk_tenant_storage_quota_bytes{namespace="acme/orders",tenant="acme"}' in text
    finally:
        await cluster.close()


@pytest.mark.parametrize("tenancy", [True, False])
async def test_a_local_cluster_enforces_quotas_by_itself(tmp_path, tenancy):
    """LocalCluster's bookies have their tenancy gate as ``pybk bookie``'s do (default on):
    a namespace's storage quota refuses adds with no gate installed by hand."""
    async with pybk.LocalCluster(tmp_path, bookies=3, tenancy=tenancy) as cluster:
        records = TenancyRecords(cluster.store)
        await records.create_tenant("acme")
        await records.create_namespace("acme/small",
                                       policies=NamespacePolicies(max_storage_bytes=8000))
        lh = await _ledger(cluster.client(), "acme/small")
        written = 0
        if tenancy:
            with pytest.raises(QuotaExceededError):
                for _ in range(50):
                    await lh.append(b"q" * 1000)
                    written += 1
            assert 5 <= written < 10
        else:
            for _ in range(20):
                await lh.append(b"q" * 1000)
            assert all(cluster.bookie(b).tenancy is None for b in cluster.bookie_ids)
