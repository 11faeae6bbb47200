"""BookKeeper's own Python client (``apache-bookkeeper-client``, unchanged) against pybk's
table server on a free loopback port: what its upstream integration tests and example do,
and what they skip (many keys over ranges, increments racing from threads, Txn and
GetActiveRanges through its generated stubs)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

bk_admin = pytest.importorskip("bookkeeper.admin")
bk_kv = pytest.importorskip("bookkeeper.kv")
grpc = pytest.importorskip("grpc")

from bookkeeper.common import exceptions as bkx  # noqa: E402
from bookkeeper.proto import (  # noqa: E402
    kv_rpc_pb2,
    kv_rpc_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
    stream_pb2,
)
from bookkeeper.types import StorageClientSettings  # noqa: E402
from logs_kit import mem_cluster  # noqa: E402

import pybk  # noqa: E402
from pybk.errors import TooManyRequestsError  # noqa: E402
from pybk.tables import AsyncTable, TablesEngine  # noqa: E402
from pybk.tables.grpc_server import TableGrpcServer, status_of  # noqa: E402
from pybk.tables.http import TableHttp  # noqa: E402
from pybk.tables.metrics import TableStats  # noqa: E402

T = TypeVar("T")


class Served:
    def __init__(self, engine: TablesEngine, port: int, stats: TableStats) -> None:
        self.engine = engine
        self.stats = stats
        self.uri = f"bk://127.0.0.1:{port}"
        self.target = f"127.0.0.1:{port}"

    def settings(self) -> Any:
        return StorageClientSettings(service_uri=self.uri)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run the (blocking) official client in a thread while the server serves."""
        return await asyncio.to_thread(fn, *args)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with mem_cluster() as cluster:
        stats = TableStats()
        engine = TablesEngine(cluster.client(), on_event=stats.event)
        server = await TableGrpcServer(engine, port=0, stats=stats).start()
        try:
            yield Served(engine, server.port, stats)
        finally:
            await server.stop(None)
            await engine.close()


async def test_create_get_delete_namespaces(served: Served) -> None:
    def body() -> None:
        client = bk_admin.Client(storage_client_settings=served.settings())
        ns = f"ns_{uuid.uuid4().hex}"
        with pytest.raises(bkx.NamespaceNotFoundError):
            client.namespaces().get(ns)
        props = client.namespaces().create(ns)
        assert props.namespace_name == ns
        assert client.namespaces().get(ns) == props
        with pytest.raises(bkx.NamespaceExistsError):
            client.namespaces().create(ns)
        client.namespaces().delete(ns)
        with pytest.raises(bkx.NamespaceNotFoundError):
            client.namespaces().get(ns)
        with pytest.raises(bkx.NamespaceNotFoundError):
            client.namespaces().delete(ns)

    await served.run(body)


async def test_create_get_delete_tables(served: Served) -> None:
    def body() -> None:
        client = bk_admin.Client(storage_client_settings=served.settings())
        ns_name = f"ns_{uuid.uuid4().hex}"
        client.namespaces().create(ns_name)
        ns = client.namespace(ns_name)
        name = f"table_{uuid.uuid4().hex}"
        with pytest.raises(bkx.StreamNotFoundError):
            ns.get(name)
        props = ns.create(name)
        assert props.stream_id >= 1024 and props.stream_name == name
        assert ns.get(name) == props
        with pytest.raises(bkx.StreamExistsError):
            ns.create(name)
        ns.delete(name)
        with pytest.raises(bkx.StreamNotFoundError):
            ns.get(name)
        with pytest.raises(bkx.StreamNotFoundError):
            ns.delete(name)

    await served.run(body)


async def test_kv_operations(served: Served) -> None:
    def body() -> None:
        settings = served.settings()
        ns = f"kv_{uuid.uuid4().hex}"
        bk_admin.Client(storage_client_settings=settings).namespaces().create(ns)
        bk_admin.Client(storage_client_settings=settings).namespace(ns).create("tbl")
        tbl = bk_kv.Client(storage_client_settings=settings, namespace=ns).table("tbl")
        for x in range(20):
            assert tbl.get_str(f"key-{x}") is None
            tbl.put_str(f"key-{x}", f"value-{x}")
        for x in range(20):
            kv = tbl.get_str(f"key-{x}")
            assert (kv.key, kv.is_number, kv.value, kv.version) == (
                f"key-{x}".encode(), False, f"value-{x}".encode(), 0)
        for x in range(20):
            with pytest.raises(bkx.BadRequest) as e:
                tbl.incr_str(f"key-{x}", 20)
            assert e.value.grpc_status_code == grpc.StatusCode.FAILED_PRECONDITION
            assert e.value.bk_status_code == storage_pb2.BAD_REQUEST
        for x in range(20):
            tbl.incr_str(f"counter-{x}", x + 1)
            kv = tbl.get_str(f"counter-{x}")
            assert (kv.is_number, kv.number_value, kv.version) == (True, x + 1, 0)
            with pytest.raises(bkx.BadRequest):
                tbl.put_str(f"counter-{x}", "v")
        for x in range(20):
            assert tbl.delete_str(f"key-{x}") == 1
            assert tbl.get_str(f"key-{x}") is None
            tbl.delete_str(f"counter-{x}")
            assert tbl.get_str(f"counter-{x}") is None
        assert tbl.delete_str("key-0") == 0  # a missing key: no error, nothing deleted

    await served.run(body)


async def test_reading_a_table_another_writer_filled(served: Served) -> None:
    await served.engine.create_namespace("default")
    info = await served.engine.catalog.create_table("default", "test-java-updates", 4)
    t = AsyncTable(served.engine, info)
    for x in range(21):
        await t.put(f"java-key-{x}", f"java-value-{x}")

    def body() -> None:
        tbl = bk_kv.Client(storage_client_settings=served.settings(),
                           namespace="default").table("test-java-updates")
        for x in range(21):
            kv = tbl.get_str(f"java-key-{x}")
            assert (kv.key, kv.is_number, kv.value, kv.version) == (
                f"java-key-{x}".encode(), False, f"java-value-{x}".encode(), 0)

    await served.run(body)


async def test_many_keys_over_every_range_and_racing_increments(served: Served) -> None:
    def body() -> None:
        settings = served.settings()
        bk_admin.Client(storage_client_settings=settings).namespaces().create("many")
        bk_admin.Client(storage_client_settings=settings).namespace("many").create("t")
        tbl = bk_kv.Client(storage_client_settings=settings, namespace="many").table("t")
        for i in range(300):
            tbl.put(b"key-%d" % i, b"v%d" % i)

        def incr_many(_: int) -> None:
            local = bk_kv.Client(storage_client_settings=settings, namespace="many").table("t")
            for _ in range(25):
                local.incr(b"counter", 1)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(incr_many, range(8)))
        assert tbl.get(b"counter").number_value == 200
        for i in range(300):
            assert tbl.get(b"key-%d" % i).value == b"v%d" % i

    await served.run(body)
    assert len(served.engine.owned()) == 4  # the client's default: 4 ranges, all used


async def test_txn_and_active_ranges_through_the_generated_stubs(served: Served) -> None:
    def body() -> None:
        settings = served.settings()
        bk_admin.Client(storage_client_settings=settings).namespaces().create("tx")
        props = bk_admin.Client(storage_client_settings=settings).namespace("tx").create(
            "t", stream_config=stream_pb2.StreamConfiguration(
                initial_num_ranges=1, min_num_ranges=1, storage_type=1))
        with grpc.insecure_channel(served.target) as ch:
            table = kv_rpc_pb2_grpc.TableServiceStub(ch)
            header = kv_rpc_pb2.RoutingHeader(stream_id=props.stream_id, r_key=b"k")
            C = kv_rpc_pb2.Compare
            absent = C(result=C.EQUAL, target=C.VERSION, key=b"k", version=-1)
            put = kv_rpc_pb2.RequestOp(request_put=kv_rpc_pb2.PutRequest(key=b"k", value=b"v"))
            req = kv_rpc_pb2.TxnRequest(compare=[absent], success=[put], header=header)
            first, second = table.Txn(req), table.Txn(req)
            assert first.header.code == storage_pb2.SUCCESS and first.succeeded
            assert second.header.code == storage_pb2.SUCCESS and not second.succeeded
            got = table.Range(kv_rpc_pb2.RangeRequest(key=b"k", header=header))
            assert got.count == 1 and got.kvs[0].value == b"v"
            scan = table.Range(kv_rpc_pb2.RangeRequest(key=b"a", range_end=b"z", limit=5,
                                                       header=header))
            assert scan.count == 1 and not scan.more
            bad = table.Put(kv_rpc_pb2.PutRequest(key=b"k", value=b"v",
                                                  header=kv_rpc_pb2.RoutingHeader(r_key=b"k")))
            assert bad.header.code == storage_pb2.BAD_REQUEST
            missing = table.Put(kv_rpc_pb2.PutRequest(
                key=b"k", value=b"v", header=kv_rpc_pb2.RoutingHeader(stream_id=99999)))
            assert missing.header.code == storage_pb2.STREAM_NOT_FOUND
            meta = storage_pb2_grpc.MetaRangeServiceStub(ch)
            ranges = meta.GetActiveRanges(storage_pb2.GetActiveRangesRequest(
                stream_id=props.stream_id))
            assert ranges.code == storage_pb2.SUCCESS and len(ranges.ranges) == 1
            assert ranges.ranges[0].props.range_id == 1024

    await served.run(body)


async def test_metrics_and_admin_endpoint(served: Served) -> None:
    def body() -> None:
        settings = served.settings()
        bk_admin.Client(storage_client_settings=settings).namespaces().create("m")
        bk_admin.Client(storage_client_settings=settings).namespace("m").create("t")
        tbl = bk_kv.Client(storage_client_settings=settings, namespace="m").table("t")
        tbl.put(b"k", b"v")
        tbl.get(b"k")
        with pytest.raises(bkx.BadRequest):
            tbl.incr(b"k", 1)

    await served.run(body)
    http = await TableHttp(served.engine, served.stats, port=0).start()
    try:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{http.port}"
            async with session.get(f"{base}/heartbeat") as r:
                assert await r.text() == "OK"
            async with session.get(f"{base}/metrics") as r:
                text = await r.text()
            async with session.get(f"{base}/api/v1/tables/ranges") as r:
                ranges = await r.json()
    finally:
        await http.stop()
    assert 'pybk_table_ops_total{op="put"} 1.0' in text
    assert 'pybk_table_ops_total{op="range"} 1.0' in text
    assert 'pybk_table_failures_total{code="BAD_REQUEST"} 1.0' in text
    assert "pybk_table_recovery_seconds_count" in text
    owned = [line for line in text.splitlines() if line.startswith("pybk_table_ranges_owned")]
    assert owned and float(owned[0].split()[-1]) == len(ranges) >= 1
    assert {"table", "range", "revision", "checkpoint_revision", "replayed"} <= set(ranges[0])


@pytest.mark.parametrize("exc, code", [
    (pybk.NamespaceNotFoundError("x"), storage_pb2.NAMESPACE_NOT_FOUND),
    (pybk.NamespaceExistsError("x"), storage_pb2.NAMESPACE_EXISTS),
    (pybk.TableNotFoundError("x"), storage_pb2.STREAM_NOT_FOUND),
    (pybk.TableExistsError("x"), storage_pb2.STREAM_EXISTS),
    (pybk.TableBadRequestError("x"), storage_pb2.BAD_REQUEST),
    (TypeError("x"), storage_pb2.BAD_REQUEST),
    (pybk.RangeFencedError("x"), storage_pb2.INTERNAL_SERVER_ERROR),  # retried: taken back
    (pybk.BookieUnavailableError("x"), storage_pb2.INTERNAL_SERVER_ERROR),
    (TooManyRequestsError("x"), storage_pb2.INTERNAL_SERVER_ERROR),  # backpressure: retried
    (pybk.LedgerClosedError("x"), storage_pb2.FAILURE),  # not retried for 60 s
])
def test_each_failure_has_the_code_the_client_expects(exc: Exception, code: int) -> None:
    assert status_of(exc) == code


def test_bad_names_are_invalid_names() -> None:
    assert status_of(ValueError("bad"), stream=False) == storage_pb2.INVALID_NAMESPACE_NAME
    assert status_of(ValueError("bad"), stream=True) == storage_pb2.INVALID_STREAM_NAME


async def test_bad_names_through_the_client(served: Served) -> None:
    def body() -> None:
        client = bk_admin.Client(storage_client_settings=served.settings())
        with pytest.raises(bkx.BKGrpcCallError) as e:
            client.namespaces().create("no/slash")
        assert e.value.bk_status_code == storage_pb2.INVALID_NAMESPACE_NAME

    await served.run(body)


async def test_tls(tmp_path: Any) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    creds = grpc.ssl_server_credentials([(cert.private_key_pem.bytes(),
                                          cert.cert_chain_pems[0].bytes())])
    async with mem_cluster() as cluster:
        engine = TablesEngine(cluster.client())
        server = await TableGrpcServer(engine, port=0, tls=creds).start()
        try:
            def body() -> None:
                channel_creds = grpc.ssl_channel_credentials(ca.cert_pem.bytes())
                with grpc.secure_channel(f"127.0.0.1:{server.port}", channel_creds) as ch:
                    root = storage_pb2_grpc.RootRangeServiceStub(ch)
                    resp = root.GetNamespace(storage_pb2.GetNamespaceRequest(name="none"))
                    assert resp.code == storage_pb2.NAMESPACE_NOT_FOUND
                with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:  # plain: refused
                    root = storage_pb2_grpc.RootRangeServiceStub(ch)
                    with pytest.raises(grpc.RpcError):
                        root.GetNamespace(storage_pb2.GetNamespaceRequest(name="none"),
                                          timeout=5)

            await asyncio.to_thread(body)
        finally:
            await server.stop(None)
            await engine.close()
