"""pybk's storage: everything a bookie writes to or reads from its disk.

* ``fs``       the FileSystem seam; ``osfs`` the real one, ``memfs`` one in memory with crash
               semantics (the simulator's disk)
* ``records``  on-disk framing: segment headers, CRC-framed batches and records
* ``journal``  the write side: segment files, serial group commit, rotation (``journalbatch``:
               a batch on its way; ``prealloc``: segment files made ahead of use)
* ``replay``   the read side at start-up: verify segments, torn tail vs corruption
* ``index``    entry locations and per-ledger state (``entryindex``: one ledger's locations in
               array columns), checkpoint file format
* ``engine``   LedgerStorage, the seam a bookie drives its engine through (``engines``
               builds the one ``StoreConfig.storage`` names): ``store`` (LedgerStore, the
               journal is the entry store; default) or ``dbstore`` (DbLedgerStore: write
               cache, entry logs); docs/internals.md has their modules
"""

from pybk.storage.fs import FileHandle, FileSystem, SimulatedCrash
from pybk.storage.memfs import MemFileSystem
from pybk.storage.osfs import OsFileSystem

__all__ = ["FileHandle", "FileSystem", "MemFileSystem", "OsFileSystem", "SimulatedCrash"]
