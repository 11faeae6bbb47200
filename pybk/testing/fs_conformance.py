"""A conformance suite any FileSystem implementation can run (cf. trio.testing's
``check_two_way_stream``): the behaviours pybk's storage relies on, checked from the outside.

Usage in a test::

    await check_filesystem(MyFileSystem(), "/some/empty/dir")
"""

from __future__ import annotations

import posixpath

from pybk.storage.fs import FileSystem

__all__ = [
    "check_filesystem",
]


async def check_filesystem(fs: FileSystem, root: str) -> None:
    """Exercise every FileSystem operation under the empty directory ``root``."""
    d = posixpath.join(root, "conf")
    fs.makedirs(d)
    fs.makedirs(d)  # idempotent
    assert fs.exists(d)
    assert fs.listdir(d) == []

    a = posixpath.join(d, "a.seg")
    fh = fs.open_append(a)
    fh.write(b"hello ")
    fh.write(bytearray(b"big "))
    fh.write(memoryview(b"world"))
    assert fh.size() == len(b"hello big world")
    await fh.sync()
    await fs.fsync_dir(d)
    assert fs.file_size(a) == 15
    assert fs.pread(a, 6, 3) == b"big"
    assert fs.pread(a, 10, 100) == b"world", "pread past the end must be short, not an error"
    assert fs.pread(a, 100, 5) == b""
    assert fs.read_file(a) == b"hello big world"
    fh.close()

    fh = fs.open_append(a)  # reopening appends
    assert fh.size() == 15
    fh.write(b"!")
    await fh.sync()
    fh.write(b"?")
    started = fh.start_sync()  # begun now; awaiting it gives the outcome
    fh.write(b"+")  # writing while that sync runs is allowed (the next sync covers it)
    await started
    await fh.start_sync()
    fh.close()
    assert fs.read_file(a) == b"hello big world!?+"

    # in place (a preallocated file): writes replace bytes from the offset on, the file keeps
    # its length, size() is the next write's offset, and a write past the end extends it
    z = posixpath.join(d, "z.seg")
    fh = fs.open_append(z)
    fh.write(b"HEAD" + bytes(12))
    await fh.sync()
    fh.close()
    fh = fs.open_rewrite(z, 4)
    assert fh.size() == 4
    fh.write(b"abc")
    fh.write(b"de")
    assert fh.size() == 9
    await fh.sync()
    assert fs.file_size(z) == 16
    assert fs.read_file(z) == b"HEADabcde" + bytes(7)
    assert fs.pread(z, 4, 5) == b"abcde"
    fh.write(b"0123456789")  # 9..19: past the end of the 16-byte file
    await fh.start_sync()
    fh.close()
    assert fs.read_file(z) == b"HEADabcde0123456789"
    for bad in (-1, 20):
        try:
            fs.open_rewrite(z, bad)
        except ValueError:
            pass
        else:
            raise AssertionError(f"open_rewrite at offset {bad} of a 19-byte file must fail")
    try:
        fs.open_rewrite(posixpath.join(d, "missing.seg"), 0)
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("open_rewrite of a missing file must raise FileNotFoundError")
    fs.delete(z)

    # allocate: the file grows to at least the size, reading as zeros; an append handle's
    # next write goes to the new end, a rewrite handle's stays where it was
    fh = fs.open_append(z)
    fh.write(b"H")
    fh.allocate(8)
    assert fh.size() == 8 and fs.file_size(z) == 8
    fh.write(b"T")
    fh.allocate(4)  # never shrinks
    await fh.sync()
    fh.close()
    assert fs.read_file(z) == b"H" + bytes(7) + b"T"
    fh = fs.open_rewrite(z, 1)
    fh.allocate(16)
    assert fh.size() == 1 and fs.file_size(z) == 16
    fh.write(b"ab")
    await fh.sync()
    fh.close()
    assert fs.read_file(z) == b"Hab" + bytes(5) + b"T" + bytes(7)
    fs.delete(z)

    fs.truncate(a, 5)
    assert fs.read_file(a) == b"hello"

    b = posixpath.join(d, "b.seg")
    await fs.write_file_atomic(b, b"checkpoint-1")
    await fs.write_file_atomic(b, b"checkpoint-2")
    assert fs.read_file(b) == b"checkpoint-2"
    assert fs.listdir(d) == ["a.seg", "b.seg"]

    c = posixpath.join(d, "c.seg")
    fs.rename(a, c)
    assert not fs.exists(a)
    assert fs.read_file(c) == b"hello"
    fs.delete(c)
    await fs.fsync_dir(d)
    assert fs.listdir(d) == ["b.seg"]
    try:
        fs.pread(c, 0, 1)
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("pread of a deleted file must raise FileNotFoundError")
    try:
        fs.delete(c)
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("deleting a missing file must raise FileNotFoundError")

    free, total = fs.disk_usage(d)
    assert 0 <= free <= total and total > 0
