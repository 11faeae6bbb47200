"""Real processes: a consumer acknowledging records through a durable cursor of an embedded
WAL's log (bookies and metadata on disk) is killed with SIGKILL at a random moment (chosen by
the number of acknowledgements it printed, not by time); a new process subscribes to the same
cursor and gets every record not acknowledged, and no record whose acknowledgement had
returned."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from logs_kit import until
from process_kit import children

from pybk.server.processes import pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOTAL = 60

CONSUMER = textwrap.dedent("""
    import asyncio, sys
    import pybk

    async def main(where, role, total):
        async with pybk.AsyncWAL(where) as wal:
            if role == "first":
                await wal.append_many([b"rec-%d" % i for i in range(total)])
            cur = await wal.log.subscribe("c")
            print("ready", flush=True)
            n = 0
            while True:
                try:
                    rec = await asyncio.wait_for(cur.receive(), 3.0 if role == "second" else None)
                except asyncio.TimeoutError:
                    print("idle", flush=True)
                    return
                index = int(rec.data.split(b"-")[1])
                print("got", index, flush=True)
                if role == "first" and index % 3 != 2:   # every third record stays unacked
                    await cur.ack(rec.position)
                    print("acked", index, flush=True)
                n += 1

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
""")


async def _start(where: str, role: str) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CONSUMER, where, role, str(TOTAL),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    if line.strip() != b"ready":
        err = await proc.stderr.read() if proc.stderr else b""
        raise AssertionError(f"consumer did not start: {line!r} {err.decode()[-2000:]}")
    return proc


def _parse(lines: list[bytes]) -> tuple[list[int], list[int]]:
    got, acked = [], []
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] == b"got":
            got.append(int(parts[1]))
        elif len(parts) == 2 and parts[0] == b"acked":
            acked.append(int(parts[1]))
    return got, acked


async def test_a_killed_consumer_resumes_from_its_cursor(tmp_path: Path) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4), "big"))
    where = str(tmp_path / "wal")
    first = await _start(where, "first")
    assert first.stdout is not None
    kill_after = rng.randrange(5, 35)
    lines: list[bytes] = []
    while sum(1 for x in lines if x.startswith(b"acked")) < kill_after:
        line = await asyncio.wait_for(first.stdout.readline(), 60)
        assert line, "the consumer ended"
        lines.append(line)
    helpers = children(first.pid, running="_sync_child.py")
    os.kill(first.pid, signal.SIGKILL)
    rest = await asyncio.wait_for(first.stdout.read(), 60)
    await asyncio.wait_for(first.wait(), 60)
    await until(lambda: not any(map(pid_alive, helpers)), 60)
    lines += rest.split(b"\n")[:-1]  # (a line cut short by the kill does not count)
    got1, acked1 = _parse(lines)

    second = await _start(where, "second")
    assert second.stdout is not None
    out = await asyncio.wait_for(second.stdout.read(), 120)
    assert await asyncio.wait_for(second.wait(), 60) == 0
    got2, _ = _parse(out.split(b"\n"))
    assert out.rstrip().endswith(b"idle")
    assert len(set(got2)) == len(got2), "a record was handed out twice"
    assert not set(got2) & set(acked1), "an acknowledged record was redelivered"
    never_acked = {i for i in range(TOTAL) if i % 3 == 2}
    assert never_acked <= set(got2), "a record never acknowledged was skipped"
    # at most one acknowledgement can have become durable without being printed: the one
    # of the last record the first consumer got
    unprinted = set(range(TOTAL)) - set(got2) - set(acked1)
    assert unprinted <= {max(got1)}, (unprinted, max(got1))
    assert got2 == sorted(got2)  # in log order (nothing was nacked)
