"""A small key-value store made durable by pybk.WAL: every change is a WAL record, the state
is rebuilt from the WAL at start, and periodic snapshots let the WAL be truncated.

    python examples/wal_kv.py [DIR]        # DIR defaults to a new temp directory

Run it twice on the same DIR: the second run finds the state of the first (from the last
snapshot plus the records after it), then changes it some more. Kill it with kill -9 in the
middle if you like: whatever ``set``/``delete`` returned is there on the next start.

How it works:

* ``set(k, v)`` / ``delete(k)`` append a JSON record and apply it once ``wal.append`` returned
  (the record is then on 2 of the 3 embedded bookies' disks);
* every ``snapshot_every`` changes, the state and the position of the last record it includes
  are written to ``DIR/snapshot.json`` (written to a temp file, fsynced, renamed), and the WAL
  is truncated just after that position;
* at start: load the snapshot (if any), then replay the WAL, skipping records at or before the
  snapshot's position (a crash between the snapshot and the truncation leaves them there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

import pybk


class KVStore:
    """A dict whose every change goes through the WAL first."""

    def __init__(self, directory: str | Path, snapshot_every: int = 1000) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.snapshot_every = snapshot_every
        self.state: dict[str, str] = {}
        self.applied: pybk.Position | None = None  # the last record in self.state
        self.since_snapshot = 0
        self.wal = pybk.WAL(self.dir / "wal")
        try:
            self.replayed = self._recover()
        except BaseException:
            self.wal.close()
            raise

    # -- start-up ----------------------------------------------------------------------------

    def _recover(self) -> int:
        snap = self.dir / "snapshot.json"
        if snap.exists():
            doc = json.loads(snap.read_text())
            self.state = doc["state"]
            self.applied = pybk.Position.parse(doc["position"])
        replayed = 0
        for pos, data in self.wal.replay():
            if self.applied is not None and pos <= self.applied:
                continue  # already in the snapshot
            self._apply(json.loads(data))
            self.applied = pos
            replayed += 1
        self.since_snapshot = replayed
        return replayed

    # -- changes -----------------------------------------------------------------------------

    def _apply(self, op: dict[str, str]) -> None:
        if op["op"] == "set":
            self.state[op["k"]] = op["v"]
        else:
            self.state.pop(op["k"], None)

    def _log(self, op: dict[str, str]) -> None:
        pos = self.wal.append(json.dumps(op, separators=(",", ":")).encode())
        self._apply(op)  # durable first, visible after
        self.applied = pos
        self.since_snapshot += 1
        if self.since_snapshot >= self.snapshot_every:
            self.snapshot()

    def set(self, key: str, value: str) -> None:
        self._log({"op": "set", "k": key, "v": value})

    def delete(self, key: str) -> None:
        self._log({"op": "del", "k": key})

    def get(self, key: str) -> str | None:
        return self.state.get(key)

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self) -> None:
        """Write the state durably, then drop the WAL records it contains."""
        if self.applied is None:
            return
        snap = self.dir / "snapshot.json"
        tmp = snap.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"position": str(self.applied), "state": self.state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, snap)
        dir_fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself is durable before the records go
        finally:
            os.close(dir_fd)
        self.wal.truncate(before=self.applied.next_slot())
        self.since_snapshot = 0

    def close(self) -> None:
        self.wal.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="examples/wal_kv.py",
        description="A key-value store made durable by pybk.WAL: rebuilt from its snapshot "
                    "and WAL at start, then changed some more. Run it twice on one DIR.")
    parser.add_argument("dir", nargs="?", metavar="DIR",
                        help="where the store lives (default: a new temp directory)")
    args = parser.parse_args(argv)
    directory = args.dir if args.dir is not None else tempfile.mkdtemp(prefix="wal-kv-")
    rng = random.Random()
    with KVStore(directory, snapshot_every=500) as kv:
        print(f"{directory}: {len(kv.state)} keys after start-up "
              f"(snapshot + {kv.replayed} records replayed), last record {kv.applied}")
        runs = int(kv.get("meta:runs") or 0) + 1
        kv.set("meta:runs", str(runs))
        for _ in range(1200):
            key = f"user:{rng.randrange(300)}"
            if rng.random() < 0.2:
                kv.delete(key)
            else:
                kv.set(key, f"{rng.randrange(10**6)}")
        oldest = next(iter(kv.wal.replay()), (None, b""))[0]
        print(f"run {runs}: {len(kv.state)} keys now, last record {kv.applied}, "
              f"oldest record kept {oldest}")
        expected = dict(kv.state)
    with KVStore(directory) as again:  # rebuilt from the snapshot and the WAL
        assert again.state == expected, "the rebuilt state differs"
        print(f"reopened: the same {len(again.state)} keys "
              f"({again.replayed} records replayed after the snapshot)")
    print(f"run again with: python examples/wal_kv.py {directory}")


if __name__ == "__main__":
    main()
