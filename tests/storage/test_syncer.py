"""The sync process (``OsFileSystem(sync_process=True)``): syncs real files, in order, and
when it fails or dies nothing is reported durable that may not be."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import signal

import pytest

from pybk.bookie import READ_ONLY, Bookie, BookieConfig
from pybk.errors import JournalFailedError, ReadOnlyBookieError
from pybk.storage import OsFileSystem
from pybk.storage.syncer import SyncProcess
from pybk.wire import DigestManager, master_key

KEY = master_key(b"sync")


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def sync_fs():  # type: ignore[no-untyped-def]
    """An OsFileSystem syncing through a helper process, and that helper."""
    fs = OsFileSystem(sync_process=True)
    syncer = fs.sync_process
    assert syncer is not None and syncer.pid is not None
    yield fs, syncer
    fs.close()


async def test_files_sync_through_the_process_in_order(tmp_path, sync_fs):
    fs, syncer = sync_fs
    a = fs.open_append(str(tmp_path / "a"))
    b = fs.open_append(str(tmp_path / "b"))
    started = []
    for i in range(20):
        (a if i % 2 else b).write(b"x" * 100)
        started.append((a if i % 2 else b).start_sync())
    await asyncio.wait_for(asyncio.gather(*started), 10)
    assert syncer.stats["syncs"] == 20
    await asyncio.wait_for(a.sync(), 10)  # the coroutine form goes the same way
    assert syncer.stats["syncs"] == 21
    a.close()
    b.close()


async def test_bulk_syncs_never_wait_behind_the_helper(tmp_path, sync_fs):
    """Checkpoints and segments being preallocated sync on the bulk thread: with the helper
    stopped (SIGSTOP), a bulk sync still completes while a journal sync waits for it."""
    fs, syncer = sync_fs
    journal = fs.open_append(str(tmp_path / "journal"))
    journal.write(b"j" * 100)
    os.kill(syncer.pid, signal.SIGSTOP)
    try:
        pending = journal.start_sync()
        bulk = fs.open_append(str(tmp_path / "bulk"), bulk=True)
        bulk.write(b"b" * (1 << 20))
        await asyncio.wait_for(bulk.sync(), 10)
        await fs.write_file_atomic(str(tmp_path / "checkpoint"), b"c" * 1000)
        assert not pending.done()
        assert syncer.stats["syncs"] == 1
    finally:
        os.kill(syncer.pid, signal.SIGCONT)
    await asyncio.wait_for(pending, 10)
    journal.close()
    bulk.close()


async def test_a_sync_of_an_unknown_file_fails_with_ebadf():
    syncer = SyncProcess()
    try:
        with pytest.raises(OSError) as info:
            await asyncio.wait_for(syncer.sync(999, "/nowhere"), 10)
        assert info.value.errno == errno.EBADF and "/nowhere" in str(info.value)
    finally:
        syncer.close()


async def test_the_process_closes_its_copy_when_the_file_is_closed(tmp_path, sync_fs):
    fs, syncer = sync_fs
    keep = fs.open_append(str(tmp_path / "keep"))
    await asyncio.wait_for(keep.start_sync(), 10)
    before = _open_fds(syncer.pid)
    fh = fs.open_append(str(tmp_path / "f"))
    await asyncio.wait_for(fh.start_sync(), 10)
    assert _open_fds(syncer.pid) == before + 1
    fh.close()
    await asyncio.wait_for(keep.start_sync(), 10)  # answered after the close request
    assert _open_fds(syncer.pid) == before
    keep.close()


async def test_a_dead_process_fails_the_unanswered_sync_and_every_later_one(tmp_path,
                                                                             sync_fs):
    fs, syncer = sync_fs
    fh = fs.open_append(str(tmp_path / "f"))
    await asyncio.wait_for(fh.start_sync(), 10)
    os.kill(syncer.pid, signal.SIGSTOP)  # the next sync stays unanswered...
    fh.write(b"y" * 10)
    pending = fh.start_sync()
    os.kill(syncer.pid, signal.SIGKILL)  # ...and the process dies with it
    with pytest.raises(OSError) as info:
        await asyncio.wait_for(pending, 10)
    assert info.value.errno == errno.EIO and "not confirmed" in str(info.value)
    with pytest.raises(OSError) as later:
        await asyncio.wait_for(fh.start_sync(), 10)
    assert later.value.errno == errno.EIO
    fh.close()


async def test_closing_the_file_system_stops_the_process():
    fs = OsFileSystem(sync_process=True)
    syncer = fs.sync_process
    assert syncer is not None
    proc = syncer._proc
    assert proc is not None and proc.poll() is None
    fs.close()
    assert proc.poll() is not None and fs.sync_process is None


@pytest.mark.parametrize("journal", [
    {},  # the default: serial group commit, syncs through the helper
    {"journal_overlap_syncs": True, "journal_overlap_split_min": 2},
], ids=["serial", "overlapped"])
async def test_a_bookie_whose_sync_process_dies_acknowledges_nothing_more(tmp_path, journal):
    """Every batch syncs through the process here (no inline syncs). When it dies the journal
    fails: the bookie turns read-only, the adds in flight get the error, and what was
    acknowledged before is there after a restart."""
    config = BookieConfig(disk_check_interval=0, checkpoint_interval=0, **journal)
    b = Bookie("b1", str(tmp_path / "data"), config=config, rng=random.Random(1))
    await b.start()
    dm = DigestManager(1)
    acked = []
    for eid in range(10):
        await asyncio.wait_for(b.add(1, eid, KEY, dm.frame(eid, eid - 1, 0, b"v%d" % eid)), 10)
        acked.append(eid)
    syncer = b.fs.sync_process  # type: ignore[attr-defined]
    assert syncer is not None and syncer.stats["syncs"] >= 10 and syncer.pid is not None
    os.kill(syncer.pid, signal.SIGKILL)
    syncer._proc.wait(10)
    with pytest.raises((JournalFailedError, ReadOnlyBookieError)):
        await asyncio.wait_for(b.add(1, 10, KEY, dm.frame(10, 9, 0, b"v10")), 10)
    assert b.state == READ_ONLY
    with pytest.raises(ReadOnlyBookieError):
        await asyncio.wait_for(b.add(1, 11, KEY, dm.frame(11, 10, 0, b"v11")), 10)
    await b.stop()
    again = Bookie("b1", str(tmp_path / "data"), config=config, rng=random.Random(1))
    await again.start()
    try:
        for eid in acked:
            assert again.store is not None
            assert again.store.read(1, eid) == dm.frame(eid, eid - 1, 0, b"v%d" % eid)
        await asyncio.wait_for(again.add(1, 11, KEY, dm.frame(11, 10, 0, b"v11")), 10)
    finally:
        await again.stop()


async def test_an_answer_nobody_asked_for_ends_the_helper_loudly(tmp_path, sync_fs):
    """Answers must match requests one to one; a stray one means the channel cannot be
    trusted: the helper is dropped and syncs fail with EIO (never a silent success)."""
    fs, syncer = sync_fs
    fh = fs.open_append(str(tmp_path / "f"))
    await asyncio.wait_for(fh.start_sync(), 10)
    assert syncer._sock is not None
    syncer._sock.send(b"S" + (1).to_bytes(4, "big"))  # a request with no waiter behind it
    for _ in range(1000):  # bounded: the stray answer arrives and is refused
        if syncer.failed is not None:
            break
        await asyncio.sleep(0.01)
    assert syncer.failed is not None and "out of order" in str(syncer.failed)
    with pytest.raises(OSError) as info:
        await asyncio.wait_for(fh.start_sync(), 10)
    assert info.value.errno == errno.EIO
    fh.close()


async def test_a_bookie_syncs_on_its_thread_only_when_told(tmp_path):
    """``journal_sync_process`` (on by default) gives a bookie on real files a helper process
    for its journal's syncs; off, the file system's sync thread syncs them and no process is
    started."""
    dm = DigestManager(1)
    for on in (True, False):
        config = BookieConfig(disk_check_interval=0, checkpoint_interval=0,
                              journal_sync_process=on)
        b = Bookie("b1", str(tmp_path / f"data-{on}"), config=config, rng=random.Random(1))
        await b.start()
        try:
            for eid in range(5):
                await asyncio.wait_for(b.add(1, eid, KEY, dm.frame(eid, eid - 1, 0, b"v")), 10)
            syncer = b.fs.sync_process  # type: ignore[attr-defined]
            if on:
                assert syncer is not None and syncer.stats["syncs"] >= 5
            else:
                assert syncer is None
        finally:
            await b.stop()


@pytest.mark.parametrize("how", ["frozen", "no executable"])
def test_without_an_interpreter_to_run_it_syncs_stay_on_the_thread(monkeypatch, how, caplog):
    """A frozen application's ``sys.executable`` is the application itself: running it with
    the helper's script would start the application again. Then (and with no known
    executable) no helper is started, the file system syncs on its thread, and it says so."""
    import logging
    import sys

    # (a sweep run in this process earlier may have left the "pybk" logger at CRITICAL)
    caplog.set_level(logging.WARNING, logger="pybk.storage.syncer")
    if how == "frozen":
        monkeypatch.setattr(sys, "frozen", True, raising=False)
    else:
        monkeypatch.setattr(sys, "executable", "")
    fs = OsFileSystem(sync_process=True)
    try:
        assert fs.sync_process is None
        assert "syncs stay on a thread" in caplog.text
    finally:
        fs.close()
