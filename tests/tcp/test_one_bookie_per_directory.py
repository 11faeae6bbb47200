"""Two bookies must never share a data directory, and a refused duplicate must not touch the
live bookie: a second ``pybk bookie`` on a running bookie's directory is refused before it
reads a byte (an exclusive lock held for the process's life, released by the kernel however
the process dies), and one refused for any reason never takes the live bookie's
registration off the list."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pytest
from abuse_kit import BookieUnderTest, wait_for
from click.testing import CliRunner

from pybk.bookie import BookieConfig
from pybk.cli import main
from pybk.client import Client
from pybk.errors import BookieStateError, LockedError
from pybk.metadata import open_store
from pybk.metadata.memory import MemoryMetadataStore
from pybk.runtime.dirlock import holder_of
from pybk.server.process import BookieProcess, BookieProcessConfig

pytestmark = pytest.mark.integration


def _second_bookie(first: BookieUnderTest, data_dir, bookie_id: str = "b1"):
    """``pybk bookie`` on ``data_dir`` with first's metadata, waited for (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "pybk", "bookie", "--data", str(data_dir), "--port", "0",
         "--bookie-id", bookie_id, "--metadata", first.metadata],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


async def _listed(first: BookieUnderTest) -> list[tuple[str, str]]:
    store = open_store(first.metadata)
    try:
        return [(r.bookie_id, r.address) for r in await store.list_bookies()]
    finally:
        await store.close()


async def test_a_second_bookie_on_a_running_bookies_directory_is_refused(tmp_path):
    first = await BookieUnderTest(tmp_path / "a").astart()
    try:
        async with Client(first.metadata) as client:
            lh = await client.create_ledger(1, 1, 1)
            await lh.append_many([b"%d" % i for i in range(100)])
            await lh.close()
        data_dir = tmp_path / "a" / "bookies" / "b1"
        assert holder_of(data_dir) == str(first.pid)
        for bookie_id in ("b1", "someone-else"):  # same id, or another: the directory is taken
            second = await asyncio.to_thread(_second_bookie, first, data_dir, bookie_id)
            assert second.returncode == 1, second.stderr
            assert f"is in use by process {first.pid}" in second.stderr
            assert "LockedError" in second.stderr
            assert await _listed(first) == [("b1", first.address)]
        async with Client(first.metadata) as client:  # the first is untouched and serving
            rh = await client.open_ledger(lh.id, recovery=False)
            assert [e.data for e in await rh.read(0, 99)] == [b"%d" % i for i in range(100)]
        # inspecting a running bookie's directory says so
        running = CliRunner().invoke(main, ["bookie", "inspect", str(data_dir)])
        assert f"in use by process {first.pid}" in running.stderr
    finally:
        _seconds, code = await asyncio.to_thread(first.stop)
    assert code == 0
    assert holder_of(data_dir) is None
    report = CliRunner().invoke(main, ["bookie", "inspect", "--json", str(data_dir)])
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout)["ok"] is True


async def test_the_lock_dies_with_its_process(tmp_path):
    """kill -9: no stale lock; a restarted bookie takes the directory at once."""
    first = await BookieUnderTest(tmp_path / "a").astart()
    data_dir = tmp_path / "a" / "bookies" / "b1"
    os.kill(first.pid, signal.SIGKILL)
    await asyncio.to_thread(first.proc.wait, 10)
    assert holder_of(data_dir) is None
    again = await BookieUnderTest(tmp_path / "a").astart()
    try:
        assert holder_of(data_dir) == str(again.pid)
        assert (await _listed(again))[0] == ("b1", again.address)
    finally:
        again.kill()


async def test_a_refused_duplicate_id_does_not_unregister_the_live_bookie(tmp_path):
    """Same id, another (empty) directory: the cookie check refuses it. Its shutdown used to
    deregister the id, taking the live bookie off the list."""
    store = MemoryMetadataStore()
    live = BookieProcess(BookieProcessConfig(
        data_dir=str(tmp_path / "live"), metadata="memory://", port=0, bookie_id="b1",
        bookie_config=BookieConfig(disk_check_interval=0)), store=store)
    await live.start()
    try:
        [before] = await store.list_bookies()
        duplicate = BookieProcess(BookieProcessConfig(
            data_dir=str(tmp_path / "other"), metadata="memory://", port=0, bookie_id="b1",
            bookie_config=BookieConfig(disk_check_interval=0)), store=store)
        with pytest.raises(BookieStateError, match="cookie"):
            await duplicate.start()
        await duplicate.stop()
        assert await store.list_bookies() == [before]
        # and one refused by the lock (same directory) leaves it alone too
        same_dir = BookieProcess(BookieProcessConfig(
            data_dir=str(tmp_path / "live"), metadata="memory://", port=0, bookie_id="b1",
            bookie_config=BookieConfig(disk_check_interval=0)), store=store)
        with pytest.raises(LockedError, match=f"in use by process {os.getpid()}"):
            await same_dir.start()
        await same_dir.stop()
        assert await store.list_bookies() == [before]
    finally:
        await live.stop()
    assert await store.list_bookies() == []


async def test_a_refused_duplicate_leaves_the_registry_alone_throughout(tmp_path):
    """Real processes, SQLite: while a refused duplicate id (another directory) comes and
    goes, the live bookie never drops off ``pybk bookie list``."""
    first = await BookieUnderTest(tmp_path / "a").astart()
    try:
        seen: list[list[tuple[str, str]]] = []
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                seen.append(await _listed(first))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        await wait_for(lambda: len(seen) >= 2, 10, "watching")
        second = await asyncio.to_thread(_second_bookie, first, tmp_path / "elsewhere")
        count = len(seen)
        await wait_for(lambda: len(seen) >= count + 3, 10, "a few more looks")
        stop.set()
        await watcher
        assert second.returncode == 1 and "BookieStateError" in second.stderr, second.stderr
        assert all(entry == [("b1", first.address)] for entry in seen), \
            [e for e in seen if e != [("b1", first.address)]][:3]
    finally:
        first.kill()
