"""BookKeeper's table-service gRPC protocol over :class:`pybk.tables.TablesEngine`.

The messages and service stubs are BookKeeper's own generated modules, shipped in the
``apache-bookkeeper-client`` distribution (``pip install pybk[tables]``), so the wire format
is theirs. Served: RootRangeService (namespaces and streams, i.e. tables), TableService (Put,
Range, Delete, Increment, Txn), MetaRangeService.GetActiveRanges and
StorageContainerService.GetStorageContainerEndpoint (every container is this endpoint).

Routing is the server's job, as in BookKeeper: a request names its table
(``header.stream_id``, or the ``bk-rt-sid-bin`` metadata) and its key; the engine finds the
range. Failures travel in-band, in the response's code, with the gRPC status OK: what goes
away by itself (bookies unreachable, a range taken over and being taken back) is
INTERNAL_SERVER_ERROR, which BookKeeper's clients retry with backoff; what will not (a bad
request, a missing table) has its own code, which they raise at once.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from bookkeeper.proto import (
    common_pb2,
    kv_pb2,
    kv_rpc_pb2,
    kv_rpc_pb2_grpc,
    storage_pb2,
    storage_pb2_grpc,
    stream_pb2,
)

from pybk.errors import (
    BKError,
    BookieUnavailableError,
    LedgerFencedError,
    MetadataStoreError,
    NotEnoughBookiesError,
    TimeoutError,
    TooManyRequestsError,
    WriterConflictError,
)
from pybk.tables.catalog import TableInfo
from pybk.tables.engine import TablesEngine
from pybk.tables.errors import (
    NamespaceExistsError,
    NamespaceNotFoundError,
    RangeFencedError,
    TableBadRequestError,
    TableExistsError,
    TableNotFoundError,
)
from pybk.tables.metrics import TableStats
from pybk.tables.mvcc import KeyValue

__all__ = ["TableGrpcServer", "status_of"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: failures that go away by themselves: the client retries them (in-band 500)
_TRANSIENT = (RangeFencedError, LedgerFencedError, WriterConflictError, BookieUnavailableError,
              NotEnoughBookiesError, TimeoutError, MetadataStoreError, TooManyRequestsError)
#: the most keys one Range (scan) answers, whatever its limit says
MAX_SCAN_KEYS = 10_000
DEFAULT_RANGES = 4


def status_of(exc: BaseException, *, stream: bool = False) -> int:
    """The BookKeeper status code for ``exc``."""
    if isinstance(exc, NamespaceNotFoundError):
        return int(storage_pb2.NAMESPACE_NOT_FOUND)
    if isinstance(exc, NamespaceExistsError):
        return int(storage_pb2.NAMESPACE_EXISTS)
    if isinstance(exc, TableNotFoundError):
        return int(storage_pb2.STREAM_NOT_FOUND)
    if isinstance(exc, TableExistsError):
        return int(storage_pb2.STREAM_EXISTS)
    if isinstance(exc, TableBadRequestError | TypeError):
        return int(storage_pb2.BAD_REQUEST)
    if isinstance(exc, ValueError):
        return int(storage_pb2.INVALID_STREAM_NAME if stream
                   else storage_pb2.INVALID_NAMESPACE_NAME)
    if isinstance(exc, _TRANSIENT):
        return int(storage_pb2.INTERNAL_SERVER_ERROR)
    return int(storage_pb2.FAILURE)


async def _answer(make: Callable[[int], T], work: Awaitable[T], *, stream: bool = False,
                  stats: TableStats | None = None, op: str = "") -> T:
    """``work``'s response, or ``make(code)`` for its failure (logged unless expected)."""
    t0 = time.perf_counter()
    try:
        resp = await work
    except (BKError, ValueError, TypeError) as exc:
        code = status_of(exc, stream=stream)
        if code in (storage_pb2.FAILURE, storage_pb2.INTERNAL_SERVER_ERROR):
            log.warning("table request failed (code %s): %r", code, exc)
        if stats is not None:
            stats.failure(storage_pb2.StatusCode.Name(code))
        return make(code)
    if stats is not None:
        stats.op(op, time.perf_counter() - t0)
    return resp


def _default_stream_conf(num_ranges: int) -> Any:
    return stream_pb2.StreamConfiguration(
        key_type=stream_pb2.HASH, min_num_ranges=num_ranges, initial_num_ranges=num_ranges,
        storage_type=stream_pb2.TABLE)


def _stream_props(info: TableInfo) -> Any:
    conf = stream_pb2.StreamConfiguration()
    if info.extra:
        conf.ParseFromString(base64.b64decode(info.extra))
    else:
        conf.CopyFrom(_default_stream_conf(info.num_ranges))
    return stream_pb2.StreamProperties(stream_id=info.table_id, storage_container_id=0,
                                       stream_name=info.name, stream_conf=conf)


def _kv(kv: KeyValue) -> Any:
    out = kv_pb2.KeyValue(key=kv.key, create_revision=kv.create_revision,
                          mod_revision=kv.mod_revision, version=kv.version)
    if isinstance(kv.value, int):
        out.is_number = True
        out.number_value = kv.value
    else:
        out.value = kv.value
    return out


def _stream_id(request: Any, context: grpc.aio.ServicerContext) -> int:
    sid = int(request.header.stream_id)
    if sid <= 0:
        for key, value in context.invocation_metadata() or ():
            if key == "bk-rt-sid-bin" and isinstance(value, bytes) and len(value) == 8:
                sid = int.from_bytes(value, "big", signed=True)
    if sid <= 0:
        raise TableBadRequestError("the request names no table (header.stream_id)")
    return sid


class _RootRange(storage_pb2_grpc.RootRangeServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: TablesEngine) -> None:
        self.engine = engine

    async def CreateNamespace(self, request: Any, context: Any) -> Any:
        make = storage_pb2.CreateNamespaceResponse

        async def work() -> Any:
            conf = request.ns_conf.default_stream_conf
            info = await self.engine.create_namespace(
                request.name, base64.b64encode(conf.SerializeToString()).decode())
            return make(code=storage_pb2.SUCCESS, ns_props=stream_pb2.NamespaceProperties(
                namespace_id=info.namespace_id, namespace_name=info.name,
                default_stream_conf=conf))
        return await _answer(lambda c: make(code=c), work())

    async def GetNamespace(self, request: Any, context: Any) -> Any:
        make = storage_pb2.GetNamespaceResponse

        async def work() -> Any:
            info = await self.engine.catalog.get_namespace(request.name)
            conf = stream_pb2.StreamConfiguration()
            conf.ParseFromString(base64.b64decode(info.extra))
            return make(code=storage_pb2.SUCCESS, ns_props=stream_pb2.NamespaceProperties(
                namespace_id=info.namespace_id, namespace_name=info.name,
                default_stream_conf=conf))
        return await _answer(lambda c: make(code=c), work())

    async def DeleteNamespace(self, request: Any, context: Any) -> Any:
        make = storage_pb2.DeleteNamespaceResponse

        async def work() -> Any:
            await self.engine.delete_namespace(request.name)
            return make(code=storage_pb2.SUCCESS)
        return await _answer(lambda c: make(code=c), work())

    async def CreateStream(self, request: Any, context: Any) -> Any:
        make = storage_pb2.CreateStreamResponse

        async def work() -> Any:
            conf = request.stream_conf
            n = int(conf.initial_num_ranges) or DEFAULT_RANGES
            info = await self.engine.catalog.create_table(
                request.ns_name, request.name, n,
                base64.b64encode(conf.SerializeToString()).decode())
            return make(code=storage_pb2.SUCCESS, stream_props=_stream_props(info))
        return await _answer(lambda c: make(code=c), work(), stream=True)

    async def GetStream(self, request: Any, context: Any) -> Any:
        make = storage_pb2.GetStreamResponse

        async def work() -> Any:
            if request.WhichOneof("id") == "stream_id":
                info = await self.engine.catalog.table_by_id(request.stream_id)
            else:
                name = request.stream_name
                info = await self.engine.catalog.get_table(name.namespace_name, name.stream_name)
            return make(code=storage_pb2.SUCCESS, stream_props=_stream_props(info))
        return await _answer(lambda c: make(code=c), work(), stream=True)

    async def DeleteStream(self, request: Any, context: Any) -> Any:
        make = storage_pb2.DeleteStreamResponse

        async def work() -> Any:
            await self.engine.delete_table(request.ns_name, request.name)
            return make(code=storage_pb2.SUCCESS)
        return await _answer(lambda c: make(code=c), work(), stream=True)


def _header(code: int, request: Any) -> Any:
    return kv_rpc_pb2.ResponseHeader(code=code, routing_header=request.header)


class _Tables(kv_rpc_pb2_grpc.TableServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: TablesEngine, stats: TableStats) -> None:
        self.engine = engine
        self.stats = stats

    async def _table(self, request: Any, context: Any) -> TableInfo:
        return await self.engine.catalog.table_by_id(_stream_id(request, context))

    async def Put(self, request: Any, context: Any) -> Any:
        make = kv_rpc_pb2.PutResponse

        async def work() -> Any:
            table = await self._table(request, context)
            resp = make(header=_header(storage_pb2.SUCCESS, request))
            if request.prev_kv:
                prev, _ = await self.engine.get(table, request.key)
                if prev is not None:
                    resp.prev_kv.CopyFrom(_kv(prev))
            await self.engine.execute(table, ("put", request.key, request.value))
            return resp
        return await _answer(lambda c: make(header=_header(c, request)), work(),
                             stats=self.stats, op="put")

    async def Range(self, request: Any, context: Any) -> Any:
        make = kv_rpc_pb2.RangeResponse

        async def work() -> Any:
            table = await self._table(request, context)
            if not request.range_end:
                kv, _ = await self.engine.get(table, request.key)
                kvs = [] if kv is None else [kv]
                more = False
            else:
                limit = min(int(request.limit) or MAX_SCAN_KEYS, MAX_SCAN_KEYS)
                start = request.key or None
                end = None if request.range_end == b"\0" else request.range_end
                kvs = await self.engine.scan(table, start, end, limit + 1)
                more = len(kvs) > limit
                kvs = kvs[:limit]
            resp = make(header=_header(storage_pb2.SUCCESS, request), count=len(kvs), more=more)
            if not request.count_only:
                resp.kvs.extend(_kv(kv) for kv in kvs)
            return resp
        return await _answer(lambda c: make(header=_header(c, request)), work(),
                             stats=self.stats, op="range")

    async def Delete(self, request: Any, context: Any) -> Any:
        make = kv_rpc_pb2.DeleteRangeResponse

        async def work() -> Any:
            table = await self._table(request, context)
            if request.range_end:
                raise TableBadRequestError("deleting a range of keys is not supported")
            prev = None
            if request.prev_kv:
                prev, _ = await self.engine.get(table, request.key)
            existed = await self.engine.execute(table, ("delete", request.key))
            resp = make(header=_header(storage_pb2.SUCCESS, request), deleted=int(existed))
            if prev is not None:
                resp.prev_kvs.append(_kv(prev))
            return resp
        return await _answer(lambda c: make(header=_header(c, request)), work(),
                             stats=self.stats, op="delete")

    async def Increment(self, request: Any, context: Any) -> Any:
        make = kv_rpc_pb2.IncrementResponse

        async def work() -> Any:
            table = await self._table(request, context)
            total = await self.engine.execute(table, ("incr", request.key, int(request.amount)))
            resp = make(header=_header(storage_pb2.SUCCESS, request))
            if request.get_total:
                resp.total_amount = total
            return resp
        return await _answer(lambda c: make(header=_header(c, request)), work(),
                             stats=self.stats, op="increment")

    async def Txn(self, request: Any, context: Any) -> Any:
        make = kv_rpc_pb2.TxnResponse

        async def work() -> Any:
            table = await self._table(request, context)
            compares = [_compare(c) for c in request.compare]
            ok = await self.engine.execute(table, (
                "txn", compares, [_op(o) for o in request.success],
                [_op(o) for o in request.failure]))
            return make(header=_header(storage_pb2.SUCCESS, request), succeeded=bool(ok))
        return await _answer(lambda c: make(header=_header(c, request)), work(),
                             stats=self.stats, op="txn")


_C = kv_rpc_pb2.Compare
_RESULT = {_C.EQUAL: "==", _C.GREATER: ">", _C.LESS: "<", _C.NOT_EQUAL: "!="}
_TARGET = {_C.VERSION: "version", _C.CREATE: "create_revision", _C.MOD: "mod_revision",
           _C.VALUE: "value"}


def _compare(c: Any) -> tuple[bytes, str, str, Any]:
    if c.result not in _RESULT or c.target not in _TARGET:
        raise TableBadRequestError(f"unsupported compare {c.result}/{c.target}")
    target = _TARGET[c.target]
    operand = c.value if target == "value" else getattr(c, target)
    return (c.key, target, _RESULT[c.result], operand)


def _op(o: Any) -> tuple[Any, ...]:
    kind = o.WhichOneof("request")
    if kind == "request_put":
        return ("put", o.request_put.key, o.request_put.value)
    if kind == "request_delete_range" and not o.request_delete_range.range_end:
        return ("delete", o.request_delete_range.key)
    raise TableBadRequestError(f"unsupported txn operation {kind}")


class _MetaRange(storage_pb2_grpc.MetaRangeServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: TablesEngine) -> None:
        self.engine = engine

    async def GetActiveRanges(self, request: Any, context: Any) -> Any:
        make = storage_pb2.GetActiveRangesResponse

        async def work() -> Any:
            info = await self.engine.catalog.table_by_id(int(request.stream_id))
            resp = make(code=storage_pb2.SUCCESS)
            for r in info.ranges:
                resp.ranges.append(storage_pb2.RelatedRanges(props=stream_pb2.RangeProperties(
                    start_hash_key=r.start, end_hash_key=min(r.end, (1 << 63) - 1),
                    range_id=r.range_id, storage_container_id=0)))
            return resp
        return await _answer(lambda c: make(code=c), work(), stream=True)


class _Containers(storage_pb2_grpc.StorageContainerServiceServicer):  # type: ignore[misc]
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    async def GetStorageContainerEndpoint(self, request: Any, context: Any) -> Any:
        resp = storage_pb2.GetStorageContainerEndpointResponse(status_code=storage_pb2.SUCCESS)
        for one in request.requests:
            resp.responses.append(storage_pb2.OneStorageContainerEndpointResponse(
                status_code=storage_pb2.SUCCESS, endpoint=storage_pb2.StorageContainerEndpoint(
                    storage_container_id=one.storage_container, revision=one.revision,
                    rw_endpoint=_endpoint(self.host, self.port))))
        return resp


def _endpoint(host: str, port: int) -> Any:
    return common_pb2.Endpoint(hostname=host, port=port)


class TableGrpcServer:
    """The gRPC server: ``await TableGrpcServer(engine, port=4181).start()``; port 0 picks a
    free one (``.port`` after start). Bounded: requests in flight, message sizes."""

    def __init__(self, engine: TablesEngine, *, host: str = "127.0.0.1", port: int = 4181,
                 max_in_flight: int = 1024, max_message_bytes: int = 4 << 20,
                 tls: grpc.ServerCredentials | None = None,
                 stats: TableStats | None = None) -> None:
        self.engine = engine
        self.stats = stats or TableStats()
        self.host = host
        self.port = port
        self._tls = tls
        self._server = grpc.aio.server(
            maximum_concurrent_rpcs=max_in_flight,
            options=[("grpc.max_receive_message_length", max_message_bytes),
                     ("grpc.max_send_message_length", max_message_bytes),
                     ("grpc.so_reuseport", 0)])

    async def start(self) -> TableGrpcServer:
        target = f"{self.host}:{self.port}"
        if self._tls is not None:
            self.port = self._server.add_secure_port(target, self._tls)
        else:
            self.port = self._server.add_insecure_port(target)
        storage_pb2_grpc.add_RootRangeServiceServicer_to_server(_RootRange(self.engine),
                                                                self._server)
        storage_pb2_grpc.add_MetaRangeServiceServicer_to_server(_MetaRange(self.engine),
                                                                self._server)
        storage_pb2_grpc.add_StorageContainerServiceServicer_to_server(
            _Containers(self.host, self.port), self._server)
        kv_rpc_pb2_grpc.add_TableServiceServicer_to_server(_Tables(self.engine, self.stats),
                                                          self._server)
        await self._server.start()
        return self

    async def stop(self, grace: float | None = 1.0) -> None:
        await self._server.stop(grace)

    async def wait(self) -> None:
        await self._server.wait_for_termination()
