"""Tenants and namespaces through ``client.admin()`` and the log layer: records, defaults for
new logs, ``max_logs`` under concurrent creates, every ledger tagged with its namespace,
deletion refused while logs remain (or forced), and bad input refused clearly."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from logs_kit import mem_cluster

import pybk
from pybk import NamespacePolicies
from pybk.errors import (
    KeyExistsError,
    NoSuchNamespaceError,
    NoSuchTenantError,
    NotEmptyError,
    QuotaExceededError,
)
from pybk.metadata.tenancy import NAMESPACE_KEY


async def test_logs_in_a_tenancy_namespace_take_its_policies_and_carry_it() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        admin = client.admin()
        await admin.create_tenant("acme")
        await admin.create_namespace("acme/orders", policies=NamespacePolicies(
            ensemble_size=2, write_quorum=2, ack_quorum=1, roll_entries=3,
            retention_seconds=600.0))
        ns = client.namespace("acme/orders")
        log = await ns.create_log("events")
        cfg = (await log.metadata()).config
        assert (cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum) == (2, 2, 1)
        assert cfg.roll_entries == 3 and cfg.retention_seconds == 600.0
        explicit = await ns.create_log("other", roll_entries=7)  # a knob given wins
        assert (await explicit.metadata()).config.roll_entries == 7
        async with await log.writer() as w:
            for i in range(7):  # three segments: three ledgers
                await w.append(b"r%d" % i)
        segs = await log.segments()
        assert len(segs) >= 3
        for seg in segs:
            md = await client.store.read_ledger(seg.ledger_id)
            assert md.custom_metadata[NAMESPACE_KEY] == b"acme/orders"
        cursor = await log.subscribe("c1")  # a durable cursor keeps its state in a ledger
        cursor_md = await client.store.read_ledger(cursor._lh.id)
        assert cursor_md.custom_metadata[NAMESPACE_KEY] == b"acme/orders"
        await cursor.close()
        # the plain namespace "acme" is another namespace: it sees none of these logs
        assert await client.namespace("acme").list_logs() == []
        assert await ns.list_logs() == ["events", "other"]
        plain = await client.namespace("default").create_log("p")
        async with await plain.writer() as w:
            await w.append(b"x")
        lh_id = (await plain.segments())[0].ledger_id
        assert NAMESPACE_KEY not in (await client.store.read_ledger(lh_id)).custom_metadata


async def test_max_logs_holds_under_concurrent_creates() -> None:
    """Creates from two clients (two metadata sessions) at once: exactly max_logs made."""
    async with mem_cluster() as cluster:
        one = cluster.client()
        two = pybk.Client(cluster.store.session(), transport=cluster.transport)
        assert one.store is not two.store
        await one.admin().create_tenant("t")
        await one.admin().create_namespace("t/ns", policies=NamespacePolicies(max_logs=3))
        for trial in range(5):
            outcomes = await asyncio.gather(
                *((one if i % 2 else two).namespace("t/ns").create_log(f"l{trial}-{i}")
                  for i in range(6)), return_exceptions=True)
            made = [o for o in outcomes if not isinstance(o, BaseException)]
            assert all(isinstance(o, QuotaExceededError) for o in outcomes
                       if isinstance(o, BaseException)), outcomes
            assert len(made) == 3 and len(await one.namespace("t/ns").list_logs()) == 3
            for name in await one.namespace("t/ns").list_logs():
                await one.namespace("t/ns").delete_log(name)
        with pytest.raises(QuotaExceededError, match="max_logs"):
            for name in "abcd":
                await two.namespace("t/ns").create_log(name)
        await two.close()


async def test_deleting_a_namespace_or_a_tenant_with_content_is_refused_unless_forced() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        admin = client.admin()
        await admin.create_tenant("acme")
        await admin.create_namespace("acme/orders")
        log = await client.namespace("acme/orders").create_log("events")
        async with await log.writer() as w:
            await w.append(b"x")
        with pytest.raises(NotEmptyError, match="events"):
            await admin.delete_namespace("acme/orders")
        with pytest.raises(NotEmptyError, match="acme/orders"):
            await admin.delete_tenant("acme")
        await admin.delete_tenant("acme", force=True)
        assert await admin.list_tenants() == [] and await admin.list_namespaces() == []
        assert await client.store.list_keys("logs/acme:orders/") == []
        with pytest.raises(NoSuchNamespaceError):
            await client.namespace("acme/orders").create_log("again")


async def test_bad_input_is_refused_clearly() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        admin = client.admin()
        with pytest.raises(NoSuchTenantError):
            await admin.create_namespace("nobody/x")
        with pytest.raises(NoSuchNamespaceError):
            await client.namespace("nobody/x").create_log("l")
        with pytest.raises(ValueError, match="tenant name"):
            await admin.create_tenant("bad name")
        with pytest.raises(ValueError, match="tenant/namespace"):
            await admin.create_namespace("no-slash")
        with pytest.raises(ValueError, match="namespace name"):
            client.namespace("a/b/c")
        for bad, word in (({"max_logs": 0}, "max_logs"), ({"placement": "anywhere"}, "placement"),
                          ({"write_bytes_per_s": -1}, "write_bytes_per_s"),
                          ({"ensemble_size": 2, "write_quorum": 3}, "ensemble_size"),
                          ({"isolation_group": ""}, "isolation_group")):
            with pytest.raises(ValueError, match=word):
                NamespacePolicies(**bad)  # type: ignore[arg-type]
        await admin.create_tenant("acme")
        with pytest.raises(KeyExistsError, match="acme"):
            await admin.create_tenant("acme")
        with pytest.raises(NoSuchTenantError):
            await admin.tenant_info("globex")


async def test_records_on_sqlite_survive_a_restart(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path / 'md.db'}"
    async with pybk.LocalCluster(tmp_path / "c", bookies=3, metadata=uri) as cluster:
        admin = cluster.client().admin()
        await admin.create_tenant("acme")
        await admin.create_namespace("acme/orders",
                                     policies=NamespacePolicies(max_storage_bytes=1 << 30))
    async with pybk.LocalCluster(tmp_path / "c", bookies=3, metadata=uri) as cluster:
        info = await cluster.client().admin().namespace_info("acme/orders")
        assert info.policies.max_storage_bytes == 1 << 30
