"""Index checkpoint cost on a big index: a delta (what changed) next to a full base.

A bookie's index holds ``--entries`` entries over ``--ledgers`` ledgers; then ``--changed``
entries are added (spread over ``--active`` ledgers, the ones being written) and a checkpoint
is taken, both ways, alternating ``--rounds`` times:

* delta: what ``LedgerStore`` writes between bases (``CheckpointEncoder`` with ``seq > 0``);
* base: the whole index, what every checkpoint cost before deltas (the peer: the same
  encoder, ``seq == 0``).

For each it prints the encoding time (the loop's CPU: snapshot plus steps), the bytes written,
and per changed entry; then the ratio. The file is not written to disk (the write costs the
same per byte either way; the byte counts are printed). Last, what a start-up pays to load
the base (decode plus building the index) and the index's memory per entry.

    python benchmarks/checkpoint.py [--entries 2000000] [--ledgers 2000] [--changed 50000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from pybk.storage.checkpoint import CheckpointEncoder, decode_checkpoint
from pybk.storage.index import Index, Position


def build(entries: int, ledgers: int) -> Index:
    index = Index()
    per = entries // ledgers
    for lid in range(ledgers):
        st = index.ledger(lid)
        st.master_key = b"k" * 32
        put = st.entries.put
        base = lid * per
        for eid in range(per):
            put(eid, (1 + (base + eid) // 400_000, ((base + eid) % 400_000) * 160, 150))
        st.entries.mark_checkpointed()  # as if a base held them
    return index


def add(index: Index, active: int, changed: int, round_: int) -> None:
    per = changed // active
    for lid in range(active):
        entries = index.ledgers[lid].entries
        first = entries.end
        for eid in range(first, first + per):
            entries.put(eid, (100 + round_, eid * 160, 150))
        index.ledgers[lid].max_piggyback_lac = first + per - 2


def encode(index: Index, pos: Position, *, delta: bool, metas: dict[int, bytes]
           ) -> tuple[float, int, dict[int, bytes]]:
    t0 = time.perf_counter()
    enc = CheckpointEncoder(index, pos, generation=1, seq=1 if delta else 0,
                            written=metas if delta else None)
    for _ in enc.steps():
        pass
    data = enc.result()
    return time.perf_counter() - t0, len(data), enc.metas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=2_000_000)
    ap.add_argument("--ledgers", type=int, default=2_000)
    ap.add_argument("--active", type=int, default=100, help="ledgers written between")
    ap.add_argument("--changed", type=int, default=50_000, help="entries added between")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    t0 = time.perf_counter()
    tracemalloc.start()
    index = build(args.entries, args.ledgers)
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"index: {args.entries:,} entries in {args.ledgers:,} ledgers "
          f"(built in {time.perf_counter() - t0:.1f} s); {args.changed:,} entries added to "
          f"{args.active} ledgers between checkpoints; {args.rounds} alternating rounds")
    pos = Position(1, 0, 0)
    _t, _n, metas = encode(index, pos, delta=False, metas={})
    deltas: list[tuple[float, int]] = []
    bases: list[tuple[float, int]] = []
    loads: list[float] = []
    for r in range(args.rounds):
        add(index, args.active, args.changed, 2 * r)
        t, n, metas = encode(index, pos, delta=True, metas=metas)
        deltas.append((t, n))
        add(index, args.active, args.changed, 2 * r + 1)
        t, n, metas = encode(index, pos, delta=False, metas=metas)
        bases.append((t, n))
        data = CheckpointEncoder(index, pos, generation=1).result()
        t0 = time.perf_counter()
        decode_checkpoint(data, "base").build_index()
        loads.append(time.perf_counter() - t0)
    dt, dn = sorted(deltas)[len(deltas) // 2]
    bt, bn = sorted(bases)[len(bases) // 2]
    print(f"{'checkpoint':>10} | {'ms':>8} {'MB':>8} {'us/changed':>10} {'changed/s':>11}")
    for name, t, n in (("delta", dt, dn), ("base", bt, bn)):
        print(f"{name:>10} | {t * 1e3:>8.1f} {n / 1e6:>8.2f} {t / args.changed * 1e6:>10.2f} "
              f"{args.changed / t:>11,.0f}")
    print(f"delta vs base: {bt / dt:.1f}x less time, {bn / dn:.1f}x fewer bytes "
          "(medians; the base is what every checkpoint cost before deltas)")
    entries = sum(len(st.entries) for st in index.ledgers.values())
    print(f"loading the base ({entries:,} entries): {sorted(loads)[len(loads) // 2] * 1e3:.0f} ms"
          f" (decode + build, median); index memory {memory / args.entries:.1f} B per entry")


if __name__ == "__main__":
    main()
