"""pybk's storage: everything a bookie writes to or reads from its disk.

* ``fs``       the FileSystem seam; ``osfs`` the real one, ``memfs`` one in memory with crash
               semantics (the simulator's disk)
* ``records``  on-disk framing: segment headers, CRC-framed batches and records
* ``journal``  the write side: segment files, serial group commit, rotation
* ``replay``   the read side at start-up: verify segments, torn tail vs corruption
* ``index``    entry locations and per-ledger state, checkpoint file format
* ``store``    LedgerStore: the engine the bookie drives, put together from ``config``
               (its knobs), ``startup`` (checkpoint chain + replay), ``writes`` (adds,
               fences, LAC writes, deletions, the journal callbacks), ``reads``,
               ``checkpointer`` (bases and deltas) and ``compaction``
* ``engine``   LedgerStorage, the seam a bookie drives its engine through; ``engines``
               builds the one ``StoreConfig.storage`` names
* ``dbstore``  DbLedgerStore, the second engine: ``dbledgers`` (ledger state, write cache,
               adds and reads), ``entrylogs`` (entry logs, location index, read-ahead)

In the default engine the journal *is* the entry store: entries are read back from the
segment files through the index, so there is no second copy to keep consistent.
"""

from pybk.storage.fs import FileHandle, FileSystem, SimulatedCrash
from pybk.storage.memfs import MemFileSystem
from pybk.storage.osfs import OsFileSystem

__all__ = ["FileHandle", "FileSystem", "MemFileSystem", "OsFileSystem", "SimulatedCrash"]
