"""A journal whose process (or system) is out of file descriptors for a moment: creating the
next segment fails with EMFILE/ENFILE. The journal keeps writing the active segment, tells
its owner (who frees descriptors: a bookie process closes connections) and rotates after a
later batch once files open again; it never turns the bookie read-only for good."""

from __future__ import annotations

import errno
import uuid

import pytest

from pybk.storage import MemFileSystem
from pybk.storage.fs import FileHandle
from pybk.storage.journal import parse_segment_name
from pybk.storage.store import LedgerStore, StoreConfig
from pybk.wire import DigestManager

IID = str(uuid.UUID(int=12, version=4))
KEY = b"k" * 32


class ShortOfDescriptors(MemFileSystem):
    """Opening a file for writing fails with ``errno_`` while ``short`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.short = False
        self.errno_ = errno.EMFILE
        self.refused = 0

    def _check(self, path: str) -> None:
        if self.short:
            self.refused += 1
            raise OSError(self.errno_, f"{path}: Too many open files")

    def open_append(self, path: str, *, bulk: bool = False) -> FileHandle:
        self._check(path)
        return super().open_append(path, bulk=bulk)

    def open_rewrite(self, path: str, offset: int) -> FileHandle:
        self._check(path)
        return super().open_rewrite(path, offset)


def body(eid: int) -> bytes:
    return DigestManager(1).frame(eid, eid - 1, 0, bytes([eid % 256]) * 100)


@pytest.mark.parametrize("preallocate", [False, True])
@pytest.mark.parametrize("err", [errno.EMFILE, errno.ENFILE])
async def test_rotation_without_descriptors_waits_and_retries(preallocate, err):
    fs = ShortOfDescriptors()
    fs.errno_ = err
    told: list[OSError] = []
    fatal: list[BaseException] = []
    config = StoreConfig(journal_preallocate=preallocate, segment_size=1024)
    s = LedgerStore(fs, "/data", IID, config, on_write_error=told.append,
                    on_fatal=fatal.append)
    await s.open()
    fs.short = True
    for eid in range(30):  # ~4 KB through 1 KB segments: every rotation fails
        await s.add(1, eid, body(eid), KEY)
    assert fs.refused >= 1 and s.journal.failed is None and not fatal
    assert told and all(e.errno == err for e in told)
    stuck = s.journal.segment_seq
    fs.short = False
    for eid in range(30, 40):  # descriptors again: the next batch rotates
        await s.add(1, eid, body(eid), KEY)
    assert s.journal.segment_seq > stuck
    assert [s.read(1, e) for e in range(40)] == [body(e) for e in range(40)]
    segments = [q for q in map(parse_segment_name, fs.listdir(s.journal_dir)) if q is not None]
    assert len(segments) >= 2
    await s.close()
    reopened = LedgerStore(fs, "/data", IID, config)
    await reopened.open()
    assert [reopened.read(1, e) for e in range(40)] == [body(e) for e in range(40)]
    await reopened.close()
