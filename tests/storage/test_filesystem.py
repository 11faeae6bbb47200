"""The FileSystem seam: both implementations pass the conformance suite, and MemFileSystem
models crashes, failed fsyncs, full disks, bit flips and read errors as documented."""

from __future__ import annotations

import asyncio
import errno
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pybk.storage import FileSystem, MemFileSystem, OsFileSystem, SimulatedCrash
from pybk.storage.syncthread import SyncThread
from pybk.testing.fs_conformance import check_filesystem


@pytest.fixture(params=["os", "os+sync-process", "mem"])
def any_fs(request: pytest.FixtureRequest, tmp_path):  # type: ignore[no-untyped-def]
    fs: FileSystem = (MemFileSystem() if request.param == "mem"
                      else OsFileSystem(sync_process=request.param == "os+sync-process"))
    root = str(tmp_path) if request.param != "mem" else "/data"
    fs.makedirs(root)
    yield fs, root
    fs.close()


async def test_conformance(any_fs) -> None:  # type: ignore[no-untyped-def]
    fs, root = any_fs
    await check_filesystem(fs, root)


async def _file(fs: MemFileSystem, path: str, synced: bytes, unsynced: bytes = b"") -> None:
    fh = fs.open_append(path)
    fh.write(synced)
    await fh.sync()
    fh.write(unsynced)


async def test_crash_drop_keeps_only_synced_bytes_and_durable_names() -> None:
    fs = MemFileSystem()
    fs.makedirs("/d")
    await _file(fs, "/d/a", b"durable", b"-lost")
    await fs.fsync_dir("/d")
    await _file(fs, "/d/b", b"synced-but-name-not-durable")
    fs.crash("drop")
    assert fs.read_file("/d/a") == b"durable"
    assert not fs.exists("/d/b"), "a file whose directory was never fsynced vanishes"


async def test_crash_torn_keeps_a_prefix_of_the_unsynced_tail() -> None:
    seen = set()
    for seed in range(40):
        fs = MemFileSystem()
        fs.makedirs("/d")
        await _file(fs, "/d/a", b"AAAA", b"BBBBBBBB")
        await fs.fsync_dir("/d")
        fs.crash("torn", random.Random(seed))
        data = fs.read_file("/d/a")
        assert data.startswith(b"AAAA") and b"BBBBBBBB".startswith(data[4:])
        seen.add(len(data))
    assert len(seen) > 3, "torn crashes should cut at different places"


async def test_crash_reorder_loses_whole_sectors_as_zeros() -> None:
    fs = MemFileSystem(sector_size=4)
    fs.makedirs("/d")
    await _file(fs, "/d/a", b"", b"11112222333344445555")
    await fs.fsync_dir("/d")
    fs.crash("reorder", random.Random(7))
    data = fs.read_file("/d/a")
    for i in range(0, len(data), 4):
        sector = data[i : i + 4]
        assert sector in (b"\0\0\0\0", str(i // 4 + 1).encode() * 4)


async def _preallocated(fs: MemFileSystem, path: str, size: int) -> None:
    """A file of ``size`` synced zeros with a durable name, as the journal makes segments."""
    fs.makedirs("/d")
    await _file(fs, path, bytes(size))
    await fs.fsync_dir("/d")


async def test_in_place_writes_are_unsynced_until_synced() -> None:
    """Bytes written over a preallocated file are the unsynced change: a drop crash gives back
    the durable zeros; after a sync they stay. The file's length never changes."""
    fs = MemFileSystem()
    await _preallocated(fs, "/d/p", 64)
    fh = fs.open_rewrite("/d/p", 8)
    fh.write(b"synced!!")
    await fh.sync()
    fh.write(b"unsynced")
    assert fs.unsynced_bytes() == 8
    fs.crash("drop")
    assert fs.read_file("/d/p") == bytes(8) + b"synced!!" + bytes(48)


async def test_crash_torn_keeps_a_prefix_of_the_in_place_change() -> None:
    seen = set()
    for seed in range(40):
        fs = MemFileSystem()
        await _preallocated(fs, "/d/p", 32)
        fh = fs.open_rewrite("/d/p", 4)
        fh.write(b"BBBBBBBBBB")
        fs.crash("torn", random.Random(seed))
        data = fs.read_file("/d/p")
        assert len(data) == 32, "a crash does not change a preallocated file's length"
        kept = data[4:14].rstrip(b"\0")
        assert b"BBBBBBBBBB".startswith(kept) and data[:4] == bytes(4) and data[14:] == bytes(18)
        seen.add(len(kept))
    assert len(seen) > 3, "torn crashes should cut at different places"


async def test_crash_reorder_keeps_or_loses_whole_sectors_of_an_in_place_change() -> None:
    fs = MemFileSystem(sector_size=4)
    await _preallocated(fs, "/d/p", 40)
    fh = fs.open_rewrite("/d/p", 4)
    fh.write(b"1111222233334444555566667777")
    fs.crash("reorder", random.Random(3))
    data = fs.read_file("/d/p")
    assert len(data) == 40
    sectors = [data[i : i + 4] for i in range(4, 32, 4)]
    for i, sector in enumerate(sectors):
        assert sector in (bytes(4), str(i + 1).encode() * 4)
    assert bytes(4) in sectors and any(s != bytes(4) for s in sectors), "seed 3 mixes both"


async def test_failed_fsync_of_an_in_place_write_loses_it_for_good() -> None:
    fs = MemFileSystem()
    await _preallocated(fs, "/d/p", 16)
    fh = fs.open_rewrite("/d/p", 2)
    fh.write(b"doomed")
    fs.fail_next_fsync()
    with pytest.raises(OSError):
        await fh.sync()
    await fh.sync()
    fs.crash("torn", random.Random(1))
    assert fs.read_file("/d/p") == bytes(16)


async def test_a_crash_undoes_an_unsynced_truncation_whole() -> None:
    """Cutting a file below its durable length is metadata: until synced, a crash brings the
    durable content back, bytes written after the cut included (never a mix)."""
    for seed in range(10):
        fs = MemFileSystem()
        await _preallocated(fs, "/d/p", 16)
        fs.truncate("/d/p", 4)
        fh = fs.open_append("/d/p")
        fh.write(b"new bytes past the cut")
        fs.crash("torn", random.Random(seed))
        assert fs.read_file("/d/p") == bytes(16)


async def test_handles_are_invalid_after_a_crash() -> None:
    fs = MemFileSystem()
    fs.makedirs("/d")
    fh = fs.open_append("/d/a")
    fs.crash()
    with pytest.raises(OSError) as info:
        fh.write(b"x")
    assert info.value.errno == errno.EBADF


async def test_failed_fsync_loses_the_data_for_good() -> None:
    """fsyncgate: after EIO a retried fsync 'succeeds' but the bytes never become durable."""
    fs = MemFileSystem()
    fs.makedirs("/d")
    await _file(fs, "/d/a", b"ok")
    await fs.fsync_dir("/d")
    fh = fs.open_append("/d/a")
    fh.write(b"doomed")
    fs.fail_next_fsync()
    with pytest.raises(OSError) as info:
        await fh.sync()
    assert info.value.errno == errno.EIO
    await fh.sync()  # the retry reports success...
    fs.crash("drop")
    assert fs.read_file("/d/a") == b"ok" + bytes(6), "...yet the data is gone (zeros)"


async def test_enospc_writes_nothing() -> None:
    fs = MemFileSystem(capacity=10)
    fs.makedirs("/d")
    fh = fs.open_append("/d/a")
    fh.write(b"12345678")
    with pytest.raises(OSError) as info:
        fh.write(b"abc")
    assert info.value.errno == errno.ENOSPC
    assert fs.read_file("/d/a") == b"12345678"
    assert fs.disk_usage("/d") == (2, 10)
    fs.set_capacity(100)
    fh.write(b"abc")
    assert fs.read_file("/d/a") == b"12345678abc"


async def test_bit_flip_and_latent_read_errors() -> None:
    fs = MemFileSystem()
    fs.makedirs("/d")
    await _file(fs, "/d/a", b"\x00\x00\x00")
    await fs.fsync_dir("/d")
    fs.flip_bit("/d/a", 1, bit=3)
    assert fs.read_file("/d/a") == b"\x00\x08\x00"
    fs.crash()
    assert fs.read_file("/d/a") == b"\x00\x08\x00", "a flip in synced bytes survives a crash"
    fs.fail_reads("/d/a", 2, 1)
    assert fs.pread("/d/a", 0, 2) == b"\x00\x08"
    with pytest.raises(OSError) as info:
        fs.pread("/d/a", 1, 2)
    assert info.value.errno == errno.EIO
    with pytest.raises(ValueError, match="outside"):
        fs.flip_bit("/d/a", 99)


async def test_misdirected_writes_and_reads() -> None:
    """A write that landed elsewhere: its own place reads as never written, the place it
    landed holds its bytes (older data there is gone), synced alike. A misdirected read
    returns another place's bytes (zeros past the end), without an error."""
    fs = MemFileSystem()
    fs.makedirs("/d")
    await _file(fs, "/d/a", b"0123456789abcdef")
    await fs.fsync_dir("/d")
    fs.misdirect_write("/d/a", 10, 4, 2)
    assert fs.read_file("/d/a") == b"01abcd6789\0\0\0\0ef"
    fs.crash()
    assert fs.read_file("/d/a") == b"01abcd6789\0\0\0\0ef", "it was synced"
    fs.misdirect_reads("/d/a", 0, 2, 4)
    assert fs.pread("/d/a", 0, 4) == b"cdab"  # bytes 0..1 come from 4..5
    assert fs.pread("/d/a", 1, 2) == b"da"
    fs.misdirect_reads("/d/a", 14, 2, 8)
    assert fs.pread("/d/a", 14, 2) == b"\0\0"  # past the end: zeros
    fs._check()
    with pytest.raises(ValueError):
        fs.misdirect_write("/d/a", 12, 10, 0)
    with pytest.raises(ValueError):
        fs.misdirect_reads("/d/a", 0, 4, 0)


async def test_fault_hook_sees_every_boundary_and_can_stop_there() -> None:
    fs = MemFileSystem()
    fs.makedirs("/d")
    ops: list[tuple[str, str]] = []

    def hook(op: str, path: str) -> None:
        ops.append((op, path))
        if op == "rename":
            raise SimulatedCrash

    fs.fault_hook = hook
    with pytest.raises(SimulatedCrash):
        await fs.write_file_atomic("/d/ckpt", b"data")
    assert [op for op, _ in ops] == ["create", "write", "sync", "rename"]
    fs.crash()
    assert not fs.exists("/d/ckpt")


async def test_clone_is_independent() -> None:
    fs = MemFileSystem()
    fs.makedirs("/d")
    await _file(fs, "/d/a", b"one", b"two")
    await fs.fsync_dir("/d")
    other = fs.clone()
    other.crash()
    assert other.read_file("/d/a") == b"one"
    assert fs.read_file("/d/a") == b"onetwo"


# ------------------------------------------------------------ the model's own invariants

_OPS = st.lists(st.tuples(
    st.sampled_from(["append", "rewrite", "sync", "rename", "delete", "truncate", "fsync_dir",
                     "crash", "fail_fsync", "flip", "bad_read"]),
    st.integers(0, 3), st.integers(0, 3), st.binary(max_size=40)), max_size=40)


@settings(deadline=None, max_examples=150, derandomize=True)
@given(_OPS)
def test_any_sequence_of_operations_and_crashes_keeps_the_models_invariants(ops) -> None:  # type: ignore[no-untyped-def]
    """MemFileSystem._check() holds after every operation, failed ones and crashes included
    (what the stateful bookie machines and the simulator rely on)."""
    fs = MemFileSystem(sector_size=8)
    fs.makedirs("/d")
    rng = random.Random(7)

    async def step(op: str, a: int, b: int, data: bytes) -> None:
        src, dst = f"/d/f{a}", f"/d/f{b}"
        if op == "append":
            fs.open_append(src).write(data)
        elif op == "rewrite" and fs.exists(src):
            fs.open_rewrite(src, min(b, fs.file_size(src))).write(data)
        elif op == "sync" and fs.exists(src):
            await fs.open_append(src).sync()
        elif op == "rename" and fs.exists(src):
            fs.rename(src, dst)
        elif op == "delete" and fs.exists(src):
            fs.delete(src)
        elif op == "truncate" and fs.exists(src):
            fs.truncate(src, min(b, fs.file_size(src)))
        elif op == "fsync_dir":
            await fs.fsync_dir("/d")
        elif op == "crash":
            fs.crash(("drop", "torn", "reorder")[b % 3], rng)
        elif op == "fail_fsync":
            fs.fail_next_fsync(path_prefix=src)
        elif op == "flip" and fs.exists(src) and fs.file_size(src):
            fs.flip_bit(src, b % fs.file_size(src), a % 8)
        elif op == "bad_read" and fs.exists(src):
            fs.fail_reads(src, b, 1 + a)

    async def run() -> None:
        for op in ops:
            try:
                await step(*op)
            except OSError:
                pass  # a failed fsync: the model's documented answer
            fs._check()

    asyncio.run(run())


def test_check_catches_a_broken_model() -> None:
    fs = MemFileSystem()
    fs.makedirs("/d")
    fs.open_append("/d/f").write(b"x")
    fs._check()
    fs._pending["/d"][0].inode = None  # a link that names no file
    with pytest.raises(AssertionError):
        fs._check()


async def test_os_syncs_run_on_their_thread_in_order_and_errors_reach_the_caller(
        tmp_path: Any) -> None:
    """``OsFileSystem``'s own sync thread (pybk.storage.syncthread): data and directory syncs
    in the order asked, a failing sync's OSError raised to its caller, the thread stopped at
    close and a sync asked after close refused."""

    fs = OsFileSystem()
    path = str(tmp_path / "f.log")
    fh = fs.open_append(path)
    fh.write(b"x" * 100)
    await fh.sync()
    await fs.fsync_dir(str(tmp_path))
    order: list[int] = []
    thread = SyncThread("test-sync")
    futs = [thread.run(order.append, i) for i in range(50)]
    await asyncio.gather(*futs)
    assert order == list(range(50))

    def fail(_arg: object) -> None:
        raise OSError(errno.EIO, "injected")

    with pytest.raises(OSError, match="injected"):
        await thread.run(fail, None)
    thread.close()
    with pytest.raises(RuntimeError, match="after close"):
        thread.run(order.append, 0)
    fh.close()
    fs.close()
