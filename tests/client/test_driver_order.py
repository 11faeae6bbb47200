"""The write pipeline's driver keeps confirmations in entry order even when a transport
answers a batch while it is being handed over (an in-process bookie that already holds the
entries answers at once): that answer's confirmations come after those being carried out.

The order is read from the futures' done-callbacks, which the loop runs in the order the futures
were resolved. The test waits for those callbacks themselves, a bounded number of loop turns,
rather than through ``asyncio.gather``: from Python 3.12 on, gathering futures that are already
done returns without a turn of the loop, before their callbacks have run."""

from __future__ import annotations

import asyncio

from pybk.client import Client
from pybk.metadata.base import BookieRegistration
from pybk.metadata.memory import MemoryMetadataStore
from pybk.transport.base import Transport
from pybk.wire import AddCallback, AddLike, Request, Response


class Answering(Transport):
    """Answers every add at once (inside ``add``), except those it is told to hold."""

    def __init__(self) -> None:
        self.hold = True
        self.held: list[AddCallback] = []

    def send(self, bookie_id: str, request: Request,
             timeout: float | None = None) -> asyncio.Future[Response]:
        raise AssertionError("only adds here")

    def add(self, bookie_id: str, request: AddLike, on_done: AddCallback,
            timeout: float | None = None) -> None:
        if self.hold:
            self.held.append(on_done)
        else:
            on_done(None)


async def test_a_synchronous_answer_does_not_overtake_earlier_confirmations() -> None:
    store = MemoryMetadataStore()
    await store.register_bookie(BookieRegistration("b0", ""))
    transport = Answering()
    client = Client(store, transport=transport)
    lh = await client.create_ledger(1, 1, 1)
    order: list[int] = []
    first = [lh.append(b"a%d" % i) for i in range(5)]
    await asyncio.sleep(0)  # the first batch leaves, and is held
    assert len(transport.held) == 1
    second = [lh.append(b"b%d" % i) for i in range(5)]  # queued for the next flush
    for f in [*first, *second]:
        f.add_done_callback(lambda f: order.append(f.result()))
    transport.hold = False
    transport.held.pop()(None)  # entries 0-4 confirmed; the flush of 5-9 is answered at once
    assert all(f.done() for f in [*first, *second])
    for _ in range(10):  # each callback was scheduled when its future resolved: a turn runs all
        if len(order) == 10:
            break
        await asyncio.sleep(0)
    assert order == list(range(10))
    lh._check()
    await lh.close()
