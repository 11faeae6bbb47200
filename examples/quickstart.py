"""pybk quickstart: a replicated ledger, a bookie crash, fencing and recovery, step by step.

Run it with ``make demo`` (or ``python examples/quickstart.py``). It starts an embedded
cluster of 4 bookies in a temporary directory (real files, SQLite metadata), writes entries
to a ledger striped over 3 of them (E=3, Qw=2, Qa=2; the fourth replaces the one that
dies), crashes a bookie in the middle of the stream, opens the ledger with recovery from a
second client, shows that the first writer is fenced, and reads everything back. It exits
non-zero if anything does not verify.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

import pybk


def step(text: str) -> None:
    print(f"\n== {text}")


def show_ensembles(md: pybk.LedgerMetadata) -> None:
    for first, bookies in sorted(md.ensembles.items()):
        print(f"   entries {first:>3} ..: {', '.join(bookies)}")


async def main(root: str) -> int:
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(f"   [{'ok' if ok else 'FAILED'}] {what}")
        if not ok:
            failures.append(what)

    step(f"starting a cluster of 4 bookies under {root}")
    async with pybk.LocalCluster(root, bookies=3) as cluster:
        await cluster.add_bookie()
        print(f"   bookies: {', '.join(cluster.bookie_ids)} (a ledger's ensemble is 3 of "
              f"these {len(cluster.bookie_ids)}, so one is spare when another one dies)")

        writer = cluster.client()
        step("creating a ledger: ensemble 3, write quorum 2, ack quorum 2")
        lh = await writer.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                        password=b"demo")
        print(f"   ledger {lh.id}")
        show_ensembles(lh.metadata)

        written: list[bytes] = []
        step("appending 50 entries (pipelined, each acknowledged once 2 bookies have it on disk)")
        batch = [b"entry-%03d" % i for i in range(50)]
        ids = await lh.append_many(batch)
        written += batch
        print(f"   entry ids {ids[0]}..{ids[-1]}, last add confirmed = {lh.last_add_confirmed}")
        check(ids == list(range(50)), "entry ids are dense from 0")

        victim = lh.metadata.ensembles[0][1]
        step(f"appending 50 more and crashing bookie {victim} (kill -9 style) while they fly")
        batch = [b"entry-%03d" % i for i in range(50, 100)]
        futures = [lh.append(data) for data in batch]
        await cluster.stop_bookie(victim)
        ids = list(await asyncio.gather(*futures))
        written += batch
        print(f"   appended {ids[0]}..{ids[-1]} anyway; the writer replaced the crashed bookie:")
        md = await writer.ledger_metadata(lh.id)
        show_ensembles(md)
        check(len(md.ensembles) == 2, "the metadata records an ensemble change")
        check(victim not in md.last_ensemble, f"{victim} is out of the current ensemble")

        step("a second client opens the ledger WITH recovery (fences it, seals it)")
        reader = cluster.client()
        rh = await reader.open_ledger(lh.id, password=b"demo", recovery=True)
        print(f"   state {rh.metadata.state}, last entry {rh.metadata.last_entry_id}, "
              f"length {rh.metadata.length} bytes")
        check(rh.is_closed, "the ledger is closed")
        check(rh.last_add_confirmed == 99, "every acknowledged entry is inside the sealed ledger")

        step("the first writer tries to append again")
        try:
            await lh.append(b"too late")
        except pybk.LedgerFencedError as exc:
            print(f"   refused: {type(exc).__name__}: {exc}")
            check(True, "the old writer is fenced")
        else:
            check(False, "the old writer is fenced")

        step("reading everything back and verifying it")
        entries = await rh.read(0, rh.last_add_confirmed)
        check([e.data for e in entries] == written, f"{len(entries)} entries match the writes")
        check([e.entry_id for e in entries] == list(range(100)), "entry ids are in order")

        step("reading without recovery from a third client (no fencing needed once closed)")
        rh2 = await cluster.client().open_ledger(lh.id, password=b"demo", recovery=False)
        again = await rh2.read(0, rh2.last_add_confirmed)
        check([e.data for e in again] == written, "a second reader sees the same entries")

        step("opening with the wrong password")
        try:
            await cluster.client().open_ledger(lh.id, password=b"wrong")
        except pybk.UnauthorizedError as exc:
            check(True, f"refused: {exc}")
        else:
            check(False, "a wrong password is refused")

    if failures:
        print(f"\nFAILED: {len(failures)} check(s) did not verify: {failures}")
        return 1
    print("\nall checks verified")
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="pybk-quickstart-") as tmp:
        sys.exit(asyncio.run(main(tmp)))
