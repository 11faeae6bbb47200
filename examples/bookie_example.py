"""A single bookie, used directly: add entries, read them, fence the ledger, restart, read back.

Run it:  python examples/bookie_example.py

A bookie stores framed entries for many ledgers in a CRC-checked journal and answers requests
(the same ``Request``/``Response`` objects the client sends over any transport). Usually the
client talks to bookies for you; this shows what one bookie does on its own.
"""

from __future__ import annotations

import asyncio
import tempfile

from pybk.bookie import Bookie
from pybk.wire import (
    AddRequest,
    DigestManager,
    FenceRequest,
    ReadRequest,
    Status,
    master_key,
)


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pybk-bookie-") as data_dir:
        ledger_id = 1
        key = master_key(b"secret")  # the bookie checks it on every add and fence
        digest = DigestManager(ledger_id, "CRC32C", b"secret")

        bookie = Bookie("bookie-1", data_dir)
        await bookie.start()
        print(f"bookie started: {bookie.state}, instance {bookie.instance_id}")

        # Add three entries; each answer comes back once the entry is fsynced.
        for entry_id, text in enumerate([b"hello", b"durable", b"world"]):
            body = digest.frame(entry_id, lac=entry_id - 1, length=0, payload=text)
            resp = await bookie.handle(AddRequest(ledger_id, entry_id, key, body))
            assert resp.status == Status.OK, resp
        print("added entries 0..2")

        resp = await bookie.handle(ReadRequest(ledger_id, 1))
        print("read entry 1:", digest.verify(resp.body or b"", 1).payload)

        # Fence: a recovering reader does this so the old writer can add no more.
        fence = await bookie.handle(FenceRequest(ledger_id, key))
        print("fenced; bookie's LAC for the ledger:", fence.lac)
        late = digest.frame(3, lac=2, length=0, payload=b"too late")
        resp = await bookie.handle(AddRequest(ledger_id, 3, key, late))
        print("add after fence:", resp.status.name)

        # Restart on the same directory: entries and the fence come back from the journal.
        await bookie.stop()
        bookie = Bookie("bookie-1", data_dir)
        await bookie.start()
        resp = await bookie.handle(ReadRequest(ledger_id, -1))  # -1 = last entry held
        print(f"after restart, last entry {resp.entry_id}:",
              digest.verify(resp.body or b"", resp.entry_id).payload)
        resp = await bookie.handle(AddRequest(ledger_id, 3, key, late))
        print("add after restart:", resp.status.name, "(the fence was journaled)")
        await bookie.stop()


if __name__ == "__main__":
    asyncio.run(main())
