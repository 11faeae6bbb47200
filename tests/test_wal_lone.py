"""The synchronous WAL's lone writer (issue 41): each record sent at once (no batching
delay), a lone bookie's small batches synced on the loop's thread, the LAC left to the
caller's next append; and ``LoopThread.resolve``, its one hand-off each way."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

import pybk
from pybk.sync.runner import LoopThread
from pybk.wal import LONE_INLINE_SYNC_MAX, SYNC_LAC_DELAY, embedded_bookie_config

ONE = {"bookies": 1, "ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1}


def test_a_lone_sync_writer_sends_each_record_at_once_and_syncs_inline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pybk.WAL(tmp_path / "w", **ONE) as wal:
        positions = [wal.append(b"r%d" % i) for i in range(30)]
        writer = wal._wal._writer
        assert writer is not None and writer.stats["lone_sends"] == 30
        cluster = wal._wal.cluster
        assert cluster is not None
        journal = cluster.bookie("bookie-0").store.journal
        assert journal.stats["inline_syncs"] >= 30
        assert [p for p, _ in wal.replay()] == positions
    with pybk.WAL(tmp_path / "w", **ONE) as wal:  # (reopened: everything acknowledged is back)
        assert [d for _, d in wal.replay()] == [b"r%d" % i for i in range(30)]


def test_the_embedded_config_syncs_inline_only_for_one_bookie() -> None:
    assert embedded_bookie_config(1).journal_inline_sync_max == LONE_INLINE_SYNC_MAX
    assert embedded_bookie_config(3).journal_inline_sync_max == 0
    assert embedded_bookie_config().journal_inline_sync_max == 0


def test_the_sync_facade_delays_its_immediate_lac_unless_told(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pybk.WAL(tmp_path / "a", **ONE) as wal:
        assert wal._wal._client_config.immediate_lac_delay == SYNC_LAC_DELAY
    config = pybk.ClientConfig(immediate_lac_delay=0.002)
    with pybk.WAL(tmp_path / "b", client_config=config, **ONE) as wal:
        assert wal._wal._client_config.immediate_lac_delay == 0.002


def test_resolve_returns_raises_and_refuses_its_own_thread() -> None:
    runner = LoopThread()
    try:
        def ok() -> asyncio.Future[int]:
            fut = runner.loop.create_future()
            runner.loop.call_soon(fut.set_result, 7)
            return fut

        def failing() -> asyncio.Future[int]:
            fut = runner.loop.create_future()
            fut.set_exception(KeyError("late"))
            return fut

        def refusing() -> asyncio.Future[int]:
            raise ValueError("at once")

        def cancelled() -> asyncio.Future[int]:
            fut = runner.loop.create_future()
            fut.cancel()
            return fut

        assert runner.resolve(ok) == 7
        with pytest.raises(KeyError, match="late"):
            runner.resolve(failing)
        with pytest.raises(ValueError, match="at once"):
            runner.resolve(refusing)
        with pytest.raises(concurrent.futures.CancelledError):
            runner.resolve(cancelled)
        seen: list[BaseException] = []

        def inside() -> None:
            try:
                runner.resolve(ok)
            except RuntimeError as exc:
                seen.append(exc)

        done = threading.Event()
        runner.loop.call_soon_threadsafe(lambda: (inside(), done.set()))
        assert done.wait(5.0) and seen and "own event loop thread" in str(seen[0])
    finally:
        runner.stop()
