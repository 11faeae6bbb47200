"""Property: over one TcpTransport connection, with answers completing in random order,
connections dropped at random points and some requests timing out, every request's future
resolves exactly once, to ITS answer (never another request's), or to BookieUnavailableError
/ TimeoutError; nothing is left hanging."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pybk.errors import BookieUnavailableError, TimeoutError
from pybk.transport.server import BookieServer
from pybk.transport.tcp import TcpTransport
from pybk.wire import AddRequest, AddResponse, Request, Response, Status

actions = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 5), st.sampled_from([5.0, 5.0, 5.0, 0.001])),
        st.tuples(st.just("drop"), st.just(0), st.just(0.0)),
        st.tuples(st.just("yield"), st.just(0), st.just(0.0)),
    ),
    min_size=1,
    max_size=40,
)


async def _scenario(steps: list[tuple[str, int, float]]) -> None:
    async def handler(request: Request) -> Response:
        assert isinstance(request, AddRequest)
        await asyncio.sleep(request.body[0] / 1000)  # completes out of order
        return AddResponse(Status.OK, request.ledger_id, request.entry_id, request.body.hex())

    async with BookieServer(handler) as server:
        host, port = server.address

        async def resolve(_: str) -> str:
            return f"{host}:{port}"

        transport = TcpTransport(resolve, backoff_initial=0.001, backoff_max=0.001)
        sent: list[tuple[AddRequest, asyncio.Future[Response]]] = []
        for i, (kind, delay, timeout) in enumerate(steps):
            if kind == "send":
                req = AddRequest(1, i, b"k", bytes([delay]) + i.to_bytes(4, "big"))
                sent.append((req, transport.send("b", req, timeout)))
            elif kind == "drop":
                for conn in list(server.connections):
                    conn.abort()
            else:
                await asyncio.sleep(0)
        _done, pending = await asyncio.wait([f for _, f in sent], timeout=10) if sent else ((), ())
        assert not pending, "a request was left hanging"
        for req, fut in sent:
            exc = fut.exception()
            if exc is None:
                resp = fut.result()
                assert (resp.ledger_id, resp.entry_id, resp.message) == (
                    req.ledger_id,
                    req.entry_id,
                    req.body.hex(),
                )
            else:
                assert isinstance(exc, BookieUnavailableError | TimeoutError), exc
        await transport.close()


@settings(derandomize=True, deadline=None, max_examples=40,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(actions)
def test_every_request_gets_its_own_answer_or_a_transport_error(steps):
    asyncio.run(_scenario(steps))
