"""Mirroring a log between two clusters (two LocalClusters, each with its own SQLite metadata
store): the frame format and its bad input, a mirror following a live writer, exactly-once
across mirror crashes at random points, bookie crashes on either side under a restarting
service, the failover procedure, and the lag metric."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from logs_kit import FAST, until
from prometheus_client import CollectorRegistry

import pybk
from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.errors import AlreadyTruncatedError, CorruptRecordError
from pybk.logs import Log, LogRecord, Position
from pybk.logs.mirror import LogMirror, MirrorAccessError, MirrorError, frame, is_frame, unframe
from pybk.ops.mirror import MirrorCollector, MirrorService
from pybk.storage.memfs import MemFileSystem
from pybk.testing import HookedTransport
from pybk.wire import Op, Status


@asynccontextmanager
async def two_clusters(tmp_path: Path, bookies: int = 3, seed: int = 1,
                       target_config: ClientConfig = FAST, target_wrapper: Any = HookedTransport,
                       ) -> AsyncIterator[tuple[LocalCluster, LocalCluster]]:
    a = LocalCluster(tmp_path / "a", bookies, metadata=f"sqlite:///{tmp_path}/a.db",
                     fs=MemFileSystem(), rng=random.Random(seed), client_config=FAST)
    b = LocalCluster(tmp_path / "b", bookies, metadata=f"sqlite:///{tmp_path}/b.db",
                     fs=MemFileSystem(), rng=random.Random(seed + 1),
                     client_config=target_config, transport_wrapper=target_wrapper)
    async with a, b:
        yield a, b


async def read_all(log: Log) -> list[LogRecord]:
    last = await log.last_position()
    if last is None:
        return []
    out: list[LogRecord] = []
    async with log.reader(stop_at=last) as r:
        while batch := await r.read_batch(1000):
            out.extend(batch)
    return out


def assert_prefix(source: list[LogRecord], target: list[LogRecord]) -> None:
    """The target holds the source's first len(target) records, in order, each once."""
    copied = [unframe(r.data) for r in target]
    assert len(copied) <= len(source), (len(copied), len(source))
    for i, (s, t, raw) in enumerate(zip(source, copied, target, strict=False)):
        assert t.source_position == s.position, (i, t.source_position, s.position)
        assert t.data == s.data and t.key == s.key and raw.txid == s.txid, i


# -- the frame ---------------------------------------------------------------------------


def test_frames_round_trip_with_and_without_keys() -> None:
    p = Position(3, 17, 4)
    for data, key in [(b"", None), (b"x" * 300, None), (b"v", b""), (b"v", b"k" * 70)]:
        f = frame(p, data, key)
        assert is_frame(f)
        assert unframe(f) == (p, data, key)


@pytest.mark.parametrize("damage", ["plain", "short", "flags", "crc", "key-cut", "position"])
def test_damaged_or_foreign_records_are_refused(damage: str) -> None:
    f = bytearray(frame(Position(1, 2, 3), b"payload", b"key"))
    if damage == "plain":
        f = bytearray(b"an ordinary record")
    elif damage == "short":
        f = f[:20]
    elif damage == "flags":
        f[8] |= 0x80
    elif damage == "crc":
        f[12] ^= 1
    elif damage == "key-cut":
        f = f[:36]
    else:
        f[9] = 7  # the position's version byte
    with pytest.raises(MirrorError) as info:
        unframe(bytes(f))
    assert isinstance(info.value, CorruptRecordError)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="batch_records"):
        LogMirror(None, None, batch_records=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        LogMirror(None, None, window=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lag_interval"):
        LogMirror(None, None, lag_interval=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backoff"):
        MirrorService(None, None, min_backoff=2, max_backoff=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(("options", "error", "says"), [
    ({"from_tls": "ca.pem"}, TypeError, "from_tls must be an ssl.SSLContext"),
    ({"to_auth_token": "s3cret"}, TypeError, "to_auth_token must be bytes"),
    ({"from_tls": "ctx", "from_tls_ca": "ca.pem"}, ValueError, "from_tls or from_tls_ca"),
    ({"to_auth_token": b"t", "to_auth_token_file": "token"}, ValueError,
     "to_auth_token or to_auth_token_file"),
    ({"from_tls_key": "key.pem"}, ValueError, "from_tls_key without from_tls_cert"),
    ({"to_auth_token_file": "empty"}, ValueError, "to_auth_token_file .*empty is empty"),
    ({"from_auth_token": b""}, ValueError, "from_auth_token is empty"),
    ({"from_tls_ca": "missing.pem"}, FileNotFoundError, "No such file"),
    ({"to_auth_token_file": "missing"}, FileNotFoundError, "No such file"),
], ids=["tls-not-a-context", "token-not-bytes", "tls-twice", "token-twice", "key-alone",
        "empty-token-file", "empty-token", "missing-ca", "missing-token-file"])
def test_the_sync_mirrors_bad_credentials_are_refused_before_it_connects(
        tmp_path: Path, options: dict[str, object], error: type[Exception], says: str) -> None:
    """(No cluster is reached: the URIs name nothing.)"""
    import ssl

    (tmp_path / "empty").write_bytes(b" \n")
    (tmp_path / "token").write_bytes(b"s3cret")
    files = ("_ca", "_cert", "_key", "_file")  # (options naming a file under tmp_path)
    given = {k: (ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT) if v == "ctx"
                 else tmp_path / v if k.endswith(files) else v) for k, v in options.items()}
    with pytest.raises(error, match=says):
        pybk.sync.LogMirror("sqlite:///nonexistent/a.db", "sqlite:///nonexistent/b.db",
                            "orders", **given)  # type: ignore[arg-type]


# -- mirroring -----------------------------------------------------------------------------


async def test_a_mirror_follows_a_live_writer_and_drains(tmp_path: Path) -> None:
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("orders", roll_entries=5)
        dst = await b.client().namespace().create_log("orders")
        # keyed records (published segments) first, then a writer with txids
        builder = await src.segment_builder()
        await builder.append_many([b"k%d" % i for i in range(5)], [b"key", None, b"", None, b"z"])
        await src.publish(await builder.finish())
        mirror = LogMirror(src, dst, batch_records=7, window=2)
        task = asyncio.create_task(mirror.run())
        async with await src.writer() as w:
            for i in range(60):
                await w.append(b"r%d" % i, txid=i if i % 4 else None)
                if i % 10 == 0:
                    await asyncio.sleep(0)
        await until(lambda: mirror.stats.records == 65, timeout=20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        source, target = await read_all(src), await read_all(dst)
        assert len(target) == 65
        assert_prefix(source, target)
        assert unframe(target[0].data).key == b"key"
        # nothing new: drain returns at once with the same truth, and writes nothing
        assert await LogMirror(src, dst).drain() == source[-1].position
        assert len(await read_all(dst)) == 65


def reached(mirror: LogMirror, task: asyncio.Task[None], records: int) -> bool:
    return mirror.stats.records >= records or task.done()


async def test_exactly_once_across_mirror_crashes_at_random_points(tmp_path: Path) -> None:
    """One mirror (as a service restarts it) is killed 25 times at random points, batches
    in flight on the target included; after each kill the target is a prefix of the source
    and at the end it equals the source. (Resuming from what the mirror saw acknowledged
    instead of from the target's last record doubles the records in flight: caught here.)"""
    rng = random.Random(40)
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("events", roll_entries=4)
        dst = await b.client().namespace().create_log("events", roll_entries=6)
        mirror_client = b.client()
        dst_for_mirror = await mirror_client.namespace().open_log("events")
        writer = await src.writer()
        mirror = LogMirror(src, dst_for_mirror)
        n = 0
        stopped_at: list[tuple[int, int]] = []
        for trial in range(25):
            for _ in range(rng.randrange(1, 30)):
                writer.append(b"e%d" % n, txid=n)
                n += 1
            mirror.batch_records = rng.choice([1, 3, 50])
            mirror.window = rng.choice([1, 4])
            before = mirror.stats.records
            task = asyncio.create_task(mirror.run())
            # the crash point: after a random number of records copied (0: while starting),
            # then a random number of loop iterations (batches in flight on the target)
            behind = n - len(await read_all(dst))
            copied = 0 if trial % 5 == 0 else rng.randrange(1, max(1, behind) + 1)
            with contextlib.suppress(AssertionError):
                await until(functools.partial(reached, mirror, task, before + copied),
                            timeout=10)
            for _ in range(rng.randrange(0, 60)):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises((asyncio.CancelledError, Exception)):
                await task
            await writer.flush()
            target = await read_all(dst)
            assert_prefix(await read_all(src), target)
            stopped_at.append((len(target), mirror.stats.records - before))
        await writer.close()
        assert mirror.stats.starts == 25
        await mirror.drain()
        source, target = await read_all(src), await read_all(dst)
        assert len(source) == n and len(target) == n
        assert_prefix(source, target)
        # the crashes fell at many points: while starting and after many different counts
        assert any(copied == 0 for _, copied in stopped_at), stopped_at
        assert len({length for length, _ in stopped_at}) > 10, stopped_at


class LosingAcks(HookedTransport):
    """Delivers adds to the bookies but, while ``lose`` is set, never answers the writer:
    entries land on the target with the mirror none the wiser."""

    lose = False
    landed = 0

    def add(self, bookie_id: str, request: Any, on_done: Any, timeout: float | None = None,
            ) -> None:
        if not self.lose:
            super().add(bookie_id, request, on_done, timeout)
            return

        def lost(outcome: object) -> None:
            self.landed += 1

        super().add(bookie_id, request, lost, timeout)


async def test_records_whose_acknowledgement_was_lost_are_not_copied_twice(
        tmp_path: Path) -> None:
    """Entries on the target's bookies whose acknowledgement never reached the mirror are
    recovered by the next run's writer; resuming from the target's last record (not from
    what the mirror saw acknowledged) copies each record once."""
    async with two_clusters(tmp_path, target_wrapper=LosingAcks) as (a, b):
        src = await a.client().namespace().create_log("lost")
        dst = await b.client().namespace().create_log("lost")
        transport = b.transport
        assert isinstance(transport, LosingAcks)
        mirror = LogMirror(src, dst, window=4)  # one instance, as a service restarts it
        task = asyncio.create_task(mirror.run())
        async with await src.writer() as w:
            await w.append_many([b"x%d" % i for i in range(20)])
            await until(lambda: mirror.stats.position == w.last_position, timeout=20)
            transport.lose = True
            await w.append_many([b"y%d" % i for i in range(10)])
            await until(lambda: transport.landed >= 2, timeout=20)  # on Qw bookies
        task.cancel()  # the mirror dies with entries unacknowledged (to it)
        with pytest.raises(asyncio.CancelledError):
            await task
        transport.lose = False
        assert mirror.stats.records == 20
        await mirror.drain()
        source, target = await read_all(src), await read_all(dst)
        assert len(source) == len(target) == 30
        assert_prefix(source, target)


async def test_a_mirror_refuses_a_target_written_by_something_else(tmp_path: Path) -> None:
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("x")
        dst = await b.client().namespace().create_log("x")
        async with await src.writer() as w:
            await w.append(b"one")
        async with await dst.writer() as w:
            await w.append(b"not a frame")
        with pytest.raises(MirrorError, match="not written by a mirror"):
            await LogMirror(src, dst).run()
        with pytest.raises(MirrorError):
            await MirrorService(src, dst).run()  # not retried


@pytest.mark.parametrize("side", ["source", "target"])
async def test_bookie_crashes_on_either_side_lose_and_double_nothing(
        tmp_path: Path, side: str) -> None:
    async with two_clusters(tmp_path, bookies=4) as (a, b):
        src = await a.client().namespace().create_log("m", roll_entries=8)
        dst = await b.client().namespace().create_log("m")
        service = MirrorService(src, dst, rng=random.Random(3), min_backoff=0.01,
                                max_backoff=0.05, batch_records=5, window=2)
        task = asyncio.create_task(service.run())
        cluster = a if side == "source" else b
        async with await src.writer() as w:
            for i in range(40):
                await w.append(b"m%d" % i)
            await until(lambda: service.stats.records >= 20, timeout=20)
            await cluster.stop_bookie("bookie-1")
            for i in range(40, 80):
                await w.append(b"m%d" % i)
            await until(lambda: service.stats.position is not None
                        and service.stats.position == w.last_position, timeout=30)
            await cluster.start_bookie("bookie-1")
            await cluster.stop_bookie("bookie-2")
            for i in range(80, 100):
                await w.append(b"m%d" % i)
            last = w.last_position
        await until(lambda: service.stats.position == last, timeout=30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        source, target = await read_all(src), await read_all(dst)
        assert len(source) == len(target) == 100
        assert_prefix(source, target)


async def test_a_network_partition_from_the_target_loses_and_doubles_nothing(
        tmp_path: Path) -> None:
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("p", roll_entries=8)
        dst = await b.client().namespace().create_log("p")
        service = MirrorService(src, dst, rng=random.Random(5), min_backoff=0.01,
                                max_backoff=0.05, batch_records=4, window=3)
        task = asyncio.create_task(service.run())
        async with await src.writer() as w:
            for i in range(30):
                w.append(b"p%d" % i)
            await until(lambda: service.stats.records >= 10, timeout=20)
            cut = b.transport.hooks.unavailable()  # every target bookie unreachable
            for i in range(30, 70):
                w.append(b"p%d" % i)
            await w.flush()
            await until(lambda: service.failures >= 3, timeout=30)
            cut.remove()
            last = w.last_position
        await until(lambda: service.stats.position == last, timeout=30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        source, target = await read_all(src), await read_all(dst)
        assert len(source) == len(target) == 70
        assert_prefix(source, target)
        assert service.stats.starts == service.failures + 1


async def test_a_target_refusing_the_mirror_ends_the_service_at_once(
        tmp_path: Path) -> None:
    """UNAUTHORIZED (a master key that does not match) is not retried: the service's run
    raises MirrorAccessError naming the target after one start; unreachable is retried."""
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("k")
        dst = await b.client().namespace().create_log("k")
        async with await src.writer() as w:
            await w.append_many([b"k%d" % i for i in range(5)])
        service = MirrorService(src, dst, rng=random.Random(3), min_backoff=0.01,
                                max_backoff=0.05)
        cut = b.transport.hooks.unavailable(op=Op.ADD, times=2)
        refused = b.transport.hooks.fail(op=Op.ADD, status=Status.UNAUTHORIZED)
        with pytest.raises(MirrorAccessError) as caught:
            await asyncio.wait_for(service.run(), 30)
        assert caught.value.side == "target" and caught.value.kinds == ("unauthorized",)
        assert "target cluster refused the mirror" in str(caught.value)
        assert service.failures >= 1 and service.stats.starts == service.failures + 1
        assert service.stats.last_error.startswith("MirrorAccessError: ")
        refused.remove()
        cut.remove()
        assert await service.drain() == w.last_position


async def test_failover_stop_writers_drain_then_write_to_the_target(tmp_path: Path) -> None:
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("ledger", roll_entries=3)
        dst = await b.client().namespace().create_log("ledger")
        service = MirrorService(src, dst, lag_interval=0.05)
        task = asyncio.create_task(service.run())
        w = await src.writer()
        for i in range(50):
            w.append(b"s%d" % i, txid=i)
        # 1. stop the writers on the source: the log takes no more records
        await w.mark_end_of_stream()
        # 2. let the mirror drain: it stops by itself once it copied the end of the stream
        await asyncio.wait_for(task, 30)
        assert service.stats.position == await src.last_position()
        assert await service.drain() == service.stats.position  # nothing more to copy
        # 3. open the target for writing (it fences any mirror still running)
        async with await dst.writer(label="app") as tw:
            await tw.append(b"after failover", txid=50)
        target = await read_all(dst)
        assert len(target) == 51 and target[-1].data == b"after failover"
        assert_prefix(await read_all(src), target[:50])
        # a mirror started again by mistake refuses: the target's last record is not a frame
        with pytest.raises(MirrorError):
            await LogMirror(src, dst).run()


async def test_lag_is_a_metric(tmp_path: Path) -> None:
    patient = dataclasses.replace(FAST, add_timeout=60.0)
    async with two_clusters(tmp_path, target_config=patient) as (a, b):
        src = await a.client().namespace().create_log("lag")
        dst = await b.client().namespace().create_log("lag")
        now = [100.0]
        mirror = LogMirror(src, dst, lag_interval=0.01, clock=lambda: now[0])
        registry = CollectorRegistry()
        registry.register(MirrorCollector(lambda: [("lag", mirror.stats)]))

        def lag() -> float | None:
            return registry.get_sample_value("pybk_log_mirror_lag_seconds", {"mirror": "lag"})

        async with await src.writer() as w:
            await w.append(b"one")
            task = asyncio.create_task(mirror.run())
            await until(lambda: mirror.stats.records == 1, timeout=20)
            await until(lambda: mirror.stats.source_position == w.last_position)
            assert lag() == 0.0
            hold = b.transport.hooks.hold(op=Op.ADD)  # the target stops acknowledging
            await w.append(b"two")
            await until(lambda: mirror.stats.source_position == w.last_position)
            now[0] += 7.5  # loop time passes while the target is behind
            await until(lambda: mirror.stats.lag_seconds == 7.5)
            assert lag() == 7.5
            hold.remove(release=True)
            await until(lambda: mirror.stats.records == 2, timeout=20)
            assert lag() == 0.0
            assert registry.get_sample_value("pybk_log_mirror_records_total",
                                             {"mirror": "lag"}) == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_caught_up_mirror_lags_exactly_zero_on_a_clock_that_moves(
        tmp_path: Path) -> None:
    """Loop time moves between any two reads of it: the lag of a mirror holding all of the
    source is 0.0, not the microseconds between two reads."""
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("tick")
        dst = await b.client().namespace().create_log("tick")
        ticks = [0.0]

        def clock() -> float:
            ticks[0] += 1e-6
            return ticks[0]

        mirror = LogMirror(src, dst, lag_interval=0.001, clock=clock)
        async with await src.writer() as w:
            await w.append(b"one")
            task = asyncio.create_task(mirror.run())
            await until(lambda: mirror.stats.records == 1, timeout=20)
            await until(lambda: mirror.stats.source_position == w.last_position)
            for _ in range(20):  # each pass of the watcher sets the lag again
                seen = ticks[0]
                await until(lambda seen=seen: ticks[0] > seen + 2e-6)
                assert mirror.stats.lag_seconds == 0.0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_source_truncated_past_the_copy_stops_the_service(tmp_path: Path) -> None:
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("t", roll_entries=1)
        dst = await b.client().namespace().create_log("t")
        async with await src.writer() as w:
            await w.append_many([b"a%d" % i for i in range(5)])
            await MirrorService(src, dst).drain()
            for i in range(5):
                await w.append(b"b%d" % i)
            await w.truncate(before=w.last_position)  # the next record to copy is gone
        with pytest.raises(AlreadyTruncatedError):
            await MirrorService(src, dst).run()  # not retried: it cannot be exactly-once
        assert len(await read_all(dst)) == 5


async def test_a_takeover_of_the_source_writer_mid_copy(tmp_path: Path) -> None:
    """The mirror copies only what the source acknowledged (readers stop at the LAC), which
    a new source writer's recovery keeps: a takeover mid-copy loses and doubles nothing."""
    async with two_clusters(tmp_path) as (a, b):
        src = await a.client().namespace().create_log("s")
        dst = await b.client().namespace().create_log("s")
        mirror = LogMirror(src, dst, batch_records=3)
        task = asyncio.create_task(mirror.run())
        first = await src.writer(label="first")
        for i in range(30):
            first.append(b"f%d" % i)
        await until(lambda: mirror.stats.records >= 5, timeout=20)
        second_src = await a.client().namespace().open_log("s")
        async with await second_src.writer(label="second") as w:  # fences the first
            await w.append_many([b"s%d" % i for i in range(10)])
            last = w.last_position
        await first.abort()
        await until(lambda: mirror.stats.position == last, timeout=20)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        source, target = await read_all(src), await read_all(dst)
        assert len(target) == len(source) >= 10
        assert_prefix(source, target)
