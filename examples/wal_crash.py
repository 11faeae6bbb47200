"""pybk.WAL survives kill -9: a child process appends records and prints each position once
``append`` returned; it is killed with SIGKILL in the middle of its appends; the next
``pybk.WAL`` on the same directory replays every record the child had printed, in order.

    python examples/wal_crash.py [DIR]      # DIR defaults to a new temp directory

The WAL is embedded: three bookies in this process, their journals and the metadata (SQLite)
under DIR, each record on 2 of the 3 bookies' disks before ``append`` returns.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pybk

#: the child: appends records "rec-<i>" and prints "<position> <i>" once each is acknowledged
CHILD = textwrap.dedent("""
    import sys
    import pybk

    wal = pybk.WAL(sys.argv[1])
    print("ready", flush=True)
    i = 0
    while True:
        pos = wal.append(b"rec-%d" % i)
        sys.stdout.write(f"{pos} {i}\\n")  # one write per line: a kill never splits one
        sys.stdout.flush()
        i += 1
""")

#: acknowledgements to wait for before the kill (a different moment each run)
KILL_AFTER = random.randint(200, 800)


def check(ok: bool, what: str) -> None:
    print(f"   [{'ok' if ok else 'FAILED'}] {what}")
    if not ok:
        sys.exit(1)


def run_child_and_kill(directory: str) -> list[tuple[pybk.Position, int]]:
    """Start the child, read its acknowledgements, SIGKILL it mid-stream; return every
    acknowledgement it printed (those after the kill signal included)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, directory],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        first = child.stdout.readline()
        if not first.startswith("ready"):
            raise SystemExit(f"the child did not start: {first!r}\n{child.stderr.read()}")
        acked: list[tuple[pybk.Position, int]] = []
        while len(acked) < KILL_AFTER:
            line = child.stdout.readline()
            if not line:
                raise SystemExit(f"the child ended early:\n{child.stderr.read()[-2000:]}")
            pos, index = line.split()
            acked.append((pybk.Position.parse(pos), int(index)))
        os.kill(child.pid, signal.SIGKILL)
        print(f"   kill -9 {child.pid} after {len(acked)} acknowledged appends "
              "(the child was still appending)")
        for line in child.stdout:  # whatever it printed before it died counts too
            if not line.endswith("\n"):
                break  # (cut short by the kill: not an acknowledgement it made whole)
            pos, index = line.split()
            acked.append((pybk.Position.parse(pos), int(index)))
        return acked
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=30)


def main(directory: str) -> None:
    print(f"== a child process appends through pybk.WAL({directory!r})")
    acked = run_child_and_kill(directory)
    print(f"   {len(acked)} records acknowledged in all, the last at {acked[-1][0]}")

    print("== the next pybk.WAL on the same directory replays")
    started = time.perf_counter()
    with pybk.WAL(directory) as wal:
        replayed = list(wal.replay())
        took = time.perf_counter() - started
        print(f"   {len(replayed)} records replayed in {took:.2f} s (recovery included)")
        by_position = {pos: data for pos, data in replayed}
        missing = [(pos, i) for pos, i in acked if by_position.get(pos) != b"rec-%d" % i]
        check(not missing, f"every acknowledged record is back at its position "
                           f"({len(acked)} checked, {len(missing)} missing)")
        positions = [pos for pos, _ in replayed]
        check(positions == sorted(positions), "positions replay in order")
        datas = [data for _, data in replayed]
        check(datas == [b"rec-%d" % i for i in range(len(datas))],
              "no record twice, none out of order, no gap")
        pos = wal.append(b"after the crash")
        check(pos > positions[-1], f"the new writer appends after them ({pos})")
    print("\nthe WAL kept every acknowledged record through kill -9")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory(prefix="pybk-wal-demo-") as tmp:
            main(os.path.join(tmp, "wal"))
