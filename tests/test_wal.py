"""pybk.WAL / pybk.AsyncWAL embedded in this process: durable appends, replay after reopening,
truncation, the directory lock (this process and another), and bad input."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pybk
from pybk import AlreadyTruncatedError, LockedError, Position, RecordTooLargeError

pytestmark = pytest.mark.timeout(120)


def test_append_replay_reopen_truncate(tmp_path: Path) -> None:
    with pybk.WAL(tmp_path) as wal:
        assert wal.last_position is None and list(wal.replay()) == []
        ps = [wal.append(b"rec-%d" % i) for i in range(5)]
        ps += wal.append_many([b"a", b"b", b"c"])
        assert ps == sorted(set(ps)) and wal.last_position == ps[-1]
        assert [d for _, d in wal.replay()] == [b"rec-%d" % i for i in range(5)] + [b"a", b"b",
                                                                                    b"c"]
        assert [p for p, _ in wal.replay(ps[6])] == ps[6:]
    with pybk.WAL(tmp_path) as wal:  # the same bookies and metadata, reopened
        assert wal.last_position == ps[-1]
        assert [p for p, _ in wal.replay()] == ps
        wal.truncate(ps[4])
        assert [p for p, _ in wal.replay()] == ps[4:]
        with pytest.raises(AlreadyTruncatedError):
            list(wal.replay(ps[0]))
        more = wal.append(b"after")
        assert more > ps[-1] and more.segment > ps[-1].segment  # a new writer's segment
    with pybk.WAL(tmp_path) as wal:
        assert [d for _, d in wal.replay()] == [b"rec-4", b"a", b"b", b"c", b"after"]
    assert sorted(p.name for p in (tmp_path / "bookies").iterdir()) == [
        "bookie-0", "bookie-1", "bookie-2"]


def test_replay_streams_in_batches(tmp_path: Path) -> None:
    with pybk.WAL(tmp_path, roll_bytes=5000,
                  writer_options=pybk.logs.WriterOptions(flush_records=100)) as wal:
        ps = wal.append_many([b"%05d" % i for i in range(3000)])
        stream = wal.replay()
        first = next(stream)
        assert first == (ps[0], b"00000")
        assert sum(1 for _ in stream) == 2999
        assert len({p.segment for p in ps}) > 2


async def test_async_wal(tmp_path: Path) -> None:
    async with pybk.AsyncWAL(tmp_path, compression="zstd") as wal:
        ps = await asyncio.gather(*(wal.append(b"x%d" % i) for i in range(50)))
        assert ps == [Position(1, 0, i) for i in range(50)]  # one loop pass: one envelope
        # append_many is a future too: many calls in flight, no task each, exact positions
        calls = [wal.append_many([b"y%d" % (2 * i), b"y%d" % (2 * i + 1)]) for i in range(20)]
        many = [p for c in await asyncio.gather(*calls) for p in c]
        assert many == [Position(1, 1, i) for i in range(40)]
        with pytest.raises(TypeError):
            wal.append_many(["text"])  # type: ignore[list-item]  # refused at the call
        assert await wal.append_many([]) == []
        got = [(p, d) async for p, d in wal.replay()]
        assert got == [*((p, b"x%d" % i) for i, p in enumerate(ps)),
                       *((p, b"y%d" % i) for i, p in enumerate(many))]
        await wal.truncate(ps[10])
        assert wal.cluster is not None and len(wal.cluster.bookie_ids) == 3
        seg = (await wal.log.segments())[0]
        md = await wal.cluster.client().ledger_metadata(seg.ledger_id)
        assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 3, 2)
    async with pybk.AsyncWAL(tmp_path) as wal:
        assert [p async for p, _ in wal.replay()] == [*ps[10:], *many]


def test_a_second_opener_in_this_process_is_refused(tmp_path: Path) -> None:
    with pybk.WAL(tmp_path), pytest.raises(LockedError, match=r"in use by process \d+") as no:
        pybk.WAL(tmp_path)
    assert no.value.pid == os.getpid()
    with pybk.WAL(tmp_path) as wal:  # released on close
        wal.append(b"x")


def test_a_locked_errors_pid_survives_copies_and_pickling() -> None:
    import pickle

    from pybk.errors import error_for_status, fresh_copy

    assert LockedError("held").pid is None  # (a holder that is not a process)
    err = LockedError("in use by process 42", pid=42)
    for copy in (pickle.loads(pickle.dumps(err)), fresh_copy(err)):
        assert isinstance(copy, LockedError) and copy.pid == 42 and str(copy) == str(err)
    assert error_for_status(err.status, "over the wire").pid is None


def test_a_second_process_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, pybk
            with pybk.WAL(sys.argv[1]) as wal:
                wal.append(b"mine")
                print("ready", flush=True)
                sys.stdin.readline()
        """), str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        with pytest.raises(LockedError, match=f"process {holder.pid}") as refused:
            pybk.WAL(tmp_path)
        assert refused.value.pid == holder.pid
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert holder.wait(60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
    with pybk.WAL(tmp_path) as wal:
        assert [d for _, d in wal.replay()] == [b"mine"]


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="directory"):
        pybk.WAL()
    with pytest.raises(TypeError, match="not both"):
        pybk.WAL(tmp_path, metadata="memory://")
    with pytest.raises(ValueError, match="bookies"):
        pybk.WAL(tmp_path, bookies=2)
    with pytest.raises(ValueError, match="quorum"):
        pybk.WAL(tmp_path, write_quorum=4)
    assert not (tmp_path / "LOCK").exists()  # refused before anything started
    with pybk.WAL(tmp_path, writer_options=pybk.logs.WriterOptions(
            max_record_bytes=1000)) as wal:
        with pytest.raises(RecordTooLargeError):
            wal.append(bytes(1001))
        with pytest.raises(TypeError):
            wal.append("text")  # type: ignore[arg-type]
        assert wal.append(bytes(1000)) == Position(1, 0, 0)


def test_the_kv_example_runs_and_rebuilds_its_state(tmp_path: Path) -> None:
    example = Path(__file__).parents[1] / "examples" / "wal_kv.py"
    outputs = [subprocess.run([sys.executable, str(example), str(tmp_path)], capture_output=True,
                              text=True, timeout=120, check=True).stdout for _ in range(2)]
    assert "run 1:" in outputs[0] and "run 2:" in outputs[1]
    assert "reopened: the same" in outputs[1]
    first_keys = outputs[0].split("run 1: ")[1].split(" keys")[0]
    assert f"{first_keys} keys after start-up" in outputs[1]  # the second run found them


def test_the_crash_demo_replays_every_acknowledged_record(tmp_path: Path) -> None:
    """``make demo``'s second half: a child appending through pybk.WAL is killed with SIGKILL
    and the next WAL replays what it acknowledged (the script checks it and exits 1 if not)."""
    example = Path(__file__).parents[1] / "examples" / "wal_crash.py"
    out = subprocess.run([sys.executable, str(example), str(tmp_path / "wal")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "kill -9" in out and "FAILED" not in out
    assert "[ok] every acknowledged record is back at its position" in out
    assert "the WAL kept every acknowledged record through kill -9" in out


async def test_a_tailing_readers_memory_stays_flat(tmp_path: Path) -> None:
    """A reader following a log to its tail holds a bounded amount of memory, however long
    the log: with 24 MB of records written, Python's traced memory (tracemalloc: reader,
    client, bookies, all in this process) from the first tenth of them to the last grows by
    less than a tenth of what passes through the reader meanwhile (a reader that kept records,
    or read ahead without bound, would grow by all of it); then it waits at the tail and gets
    the next record.
    benchmarks/wal_append.py follows a log while 10 million records are written to it."""
    import tracemalloc

    total, batch, record = 240_000, 4096, bytes(100)
    samples: list[int] = []
    async with pybk.AsyncWAL(tmp_path) as wal:
        for start in range(0, total, batch):
            await wal.append_many([record] * min(batch, total - start))
        read = 0
        reached_tail = asyncio.Event()

        async def tail() -> Position:
            nonlocal read
            async for rec in wal.log.reader():
                read += 1
                if read % (total // 10) == 0:
                    samples.append(tracemalloc.get_traced_memory()[0])
                    if read == total:
                        reached_tail.set()
                if read > total:
                    return rec.position
                if rec.data != record:
                    raise AssertionError(f"{rec.position}: {rec.data[:20]!r}")
            raise AssertionError("the reader ended")

        tracemalloc.start()
        try:
            samples.append(tracemalloc.get_traced_memory()[0])
            reader = asyncio.ensure_future(tail())
            await asyncio.wait_for(reached_tail.wait(), 60)
            last = await wal.append(b"next")  # the tailing reader gets it
            assert await asyncio.wait_for(reader, 10) == last
        finally:
            tracemalloc.stop()
    assert len(samples) == 11
    # samples[0]: before the reader started; from the first tenth on its read-ahead is held
    # (until the last, at the tail, where nothing is left to read ahead)
    growth = max(samples[2:]) - samples[1]
    assert growth < total * len(record) // 10, (growth, samples)


def test_a_wal_holding_one_record_stays_under_a_megabyte(tmp_path: Path) -> None:
    """Segments start small (preallocated ones too) and grow with use."""
    import os

    with pybk.WAL(tmp_path) as wal:
        wal.append(b"x" * 100)
    used = sum(os.stat(os.path.join(root, f)).st_blocks * 512
               for root, _, files in os.walk(tmp_path) for f in files)
    assert used < 1 << 20, used
    with pybk.WAL(tmp_path) as wal:
        assert [data for _, data in wal.replay()] == [b"x" * 100]


async def test_an_embedded_wals_bookies_give_truncated_space_back_by_themselves(
        tmp_path: Path) -> None:
    import dataclasses

    from pybk.wal import embedded_bookie_config

    config = dataclasses.replace(embedded_bookie_config(), segment_size=64 << 10,
                                 segment_initial_size=64 << 10, gc_interval=0.2,
                                 gc_min_ledger_age=0.2)
    async with pybk.AsyncWAL(tmp_path, roll_bytes=32 << 10,
                             cluster_options={"bookie_config": config}) as wal:
        cluster = wal.cluster
        assert cluster is not None
        positions = [await wal.append_many([b"r" * 1000] * 50) for _ in range(20)]
        peak = {b: len(list((cluster.bookie_dir(b) / "journal").iterdir()))
                for b in cluster.bookie_ids}
        await wal.truncate(positions[-1][0])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not all(cluster.bookie(b).gc.stats.segments_compacted > 0
                      and len(list((cluster.bookie_dir(b) / "journal").iterdir())) < peak[b]
                      for b in cluster.bookie_ids):
            assert loop.time() < deadline, {
                b: cluster.bookie(b).gc.status() for b in cluster.bookie_ids}
            await asyncio.sleep(0.05)
        assert [data async for _, data in wal.replay()] == [b"r" * 1000] * 50
