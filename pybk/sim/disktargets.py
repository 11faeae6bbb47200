"""Where the simulator's disk faults may strike a bookie's committed data: journal batches
followed by later data (never mistakable for a torn tail), and a db bookie's entry logs (each
body and each location row), as (path, offset, length, where the file's data ends)."""

from __future__ import annotations

import posixpath
from typing import Any

from pybk.sim.cluster import DATA_DIR
from pybk.storage.dbstore import ENTRY_LOG_DIR
from pybk.storage.entrylogs import ROW, row_ok
from pybk.storage.records import BATCH_HEADER_SIZE, SEGMENT_HEADER_SIZE, batch_at

__all__ = ["damage_targets", "entry_log_items", "journal_batches"]


def damage_targets(fs: Any) -> list[tuple[str, int, int, int]]:
    """Every place of committed data a disk fault may damage, journal first."""
    return journal_batches(fs) + entry_log_items(fs)


def journal_batches(fs: Any) -> list[tuple[str, int, int, int]]:
    """Every journal batch followed by at least 1 KiB of later data in its file (damage
    there is mid-log corruption, never mistakable for a torn tail): (path, offset, length of
    the batch with its header, where the file's data ends)."""
    jdir = posixpath.join(DATA_DIR, "journal")
    if not fs.exists(jdir):
        return []
    out = []
    for name in fs.listdir(jdir):
        if not name.endswith(".seg"):
            continue
        path = posixpath.join(jdir, name)
        try:
            data = fs.read_file(path)
        except OSError:
            continue  # (already damaged: a latent read error)
        # where the data ends: a preallocated segment's zero tail is not data
        end = len(data.rstrip(b"\0"))
        pos = SEGMENT_HEADER_SIZE
        while pos < end:
            found = batch_at(data, pos)
            if found is None:
                break
            size = BATCH_HEADER_SIZE + found[1]
            if pos + size + 1024 <= end:
                out.append((path, pos, size, end))
            pos += size
    return out


def entry_log_items(fs: Any) -> list[tuple[str, int, int, int]]:
    """Each body and each location row of a db bookie's entry logs (none on a journal
    bookie), a log's rows after its bodies, logs in name order. Logs the checkpoint does not
    name yet are included: a flush syncs its log before the checkpoint names it."""
    ldir = posixpath.join(DATA_DIR, ENTRY_LOG_DIR)
    if not fs.exists(ldir):
        return []
    out = []
    for name in sorted(fs.listdir(ldir)):
        if not name.endswith(".idx"):
            continue
        idx = posixpath.join(ldir, name)
        log = idx[:-len("idx")] + "log"
        try:
            raw = fs.read_file(idx)
            size = fs.file_size(log)
        except OSError:
            continue  # (already damaged: a latent read error; or half made)
        rows = []
        log_id = int(name.split(".")[0])
        for i in range(len(raw) // ROW.size):
            if row_ok(raw, i, log_id, 0):
                _, _, off, length, _ = ROW.unpack_from(raw, i * ROW.size)
                if length and off + length <= size:
                    out.append((log, off, length, size))
            rows.append((idx, i * ROW.size, ROW.size, len(raw)))
        out.extend(rows)
    return out
