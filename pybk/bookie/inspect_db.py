"""Offline inspection of a db bookie's data directory (:mod:`pybk.storage.dbstore`), for
:func:`pybk.bookie.inspect.inspect_data_dir`: its checkpoint (format, journal mark, ledgers),
every entry log it names verified row by row and body by body against their checksums, logs
no checkpoint names (a start-up deletes them), and the journal from the mark on, as the
start-up would read it. It only reads; damage is reported, never raised.
"""

from __future__ import annotations

import json
import posixpath

from pybk.bookie.inspect import DataDirReport, EntryLogReport, listdir_reported, scan_report
from pybk.errors import BKError
from pybk.storage.dbstore import DB_CHECKPOINT, ENTRY_LOG_DIR
from pybk.storage.entrylogs import LOG_FORMAT, EntryLogs, summary_from_json
from pybk.storage.fs import FileSystem
from pybk.storage.index import Index, Position
from pybk.storage.journal import parse_segment_name
from pybk.storage.store import JOURNAL_DIR

__all__ = ["inspect_db_dir"]


def inspect_db_dir(fs: FileSystem, data_dir: str, report: DataDirReport) -> None:
    """Fill ``report`` for a db bookie's ``data_dir`` (the cookie is read already)."""
    report.storage = "db"
    logs = EntryLogs(fs, posixpath.join(data_dir, ENTRY_LOG_DIR))
    pos = _load(fs, data_dir, report, logs)
    for log_id in sorted(logs.logs):
        report.entry_logs.append(_verify(fs, logs, log_id, report))
    named = {f"{i:016d}.{ext}" for i in logs.logs for ext in ("log", "idx")}
    for name in sorted(listdir_reported(fs, logs.dir, report) if fs.exists(logs.dir) else []):
        stem = name.split(".")[0]
        if name not in named and name.endswith(".log") and stem.isdigit():
            report.entry_logs.append(EntryLogReport(
                int(stem), fs.file_size(posixpath.join(logs.dir, name)), state="unnamed",
                detail="no checkpoint names it (a flush cut off): deleted at start"))
    report.entry_logs.sort(key=lambda r: r.log_id)
    journal_dir = posixpath.join(data_dir, JOURNAL_DIR)
    seqs = sorted(s for s in map(parse_segment_name, listdir_reported(fs, journal_dir, report))
                  if s is not None and (pos is None or s >= pos.seg))
    replayed = Index()
    for seq in seqs:
        report.segments.append(scan_report(fs, journal_dir, seq, seq == seqs[-1], report, replayed,
                                     None, start=pos))
    report.entries = sum(r.rows for r in report.entry_logs if r.state != "unnamed") + sum(
        len(st.entries) for st in replayed.ledgers.values())


def _load(fs: FileSystem, data_dir: str, report: DataDirReport,
          logs: EntryLogs) -> Position | None:
    """The checkpoint, described in ``report.checkpoint``; its logs added to ``logs``; the
    journal mark (None: none, or unreadable)."""
    cp = report.checkpoint
    path = posixpath.join(data_dir, DB_CHECKPOINT)
    if not fs.exists(path):
        cp.detail = "no checkpoint: a start-up replays the whole journal"
        return None
    try:
        doc = json.loads(fs.read_file(path))
        if doc.get("format", 1) != LOG_FORMAT:
            raise ValueError(f"entry logs of format {doc.get('format', 1)}, this version "
                             f"reads {LOG_FORMAT}: a start-up refuses")
        for log_id, summary in doc["logs"].items():
            logs.add(summary_from_json(int(log_id), summary))
        ledgers = doc["ledgers"]
        deleted = doc["deleted"]
    except (ValueError, KeyError, TypeError, OSError) as exc:
        cp.state, cp.detail = "damaged", str(exc)
        report.problems.append(f"{path}: {exc}")
        return None
    cp.state = "ok"
    cp.ledgers = report.ledgers = len(ledgers)
    report.fenced = sum(1 for st in ledgers.values() if st[1])
    report.deleted = sum(hi - lo + 1 for lo, hi in deleted)
    cp.entries = sum(run.hi - run.lo for info in logs.logs.values()
                     for run in info.ledgers.values())
    cp.position = None if doc["pos"] is None else Position(*doc["pos"])
    return cp.position


def _verify(fs: FileSystem, logs: EntryLogs, log_id: int,
            report: DataDirReport) -> EntryLogReport:
    """One named log: every row and body checked (EntryLogs.check_entry, as the scrubber)."""
    info = logs.logs[log_id]
    out = EntryLogReport(log_id, ledgers=len(info.ledgers),
                         live_bytes=sum(r.nbytes for r in info.ledgers.values()))
    for ext in ("log", "idx"):
        if not fs.exists(logs.path(log_id, ext)):
            out.state, out.detail = "missing", f"{logs.path(log_id, ext)} is gone"
            report.problems.append(f"entry log {log_id}: {out.detail} (the checkpoint names "
                                   "it: its entries are lost on this bookie)")
            return out
    out.size = fs.file_size(logs.path(log_id, "log"))
    first = ""
    try:
        for _lid, _eid, _size, row in logs.scrub_rows(log_id):
            out.rows += 1
            try:
                logs.check_entry(log_id, row)
            except (BKError, OSError) as exc:
                out.damaged += 1
                first = first or str(exc)
    except (BKError, OSError) as exc:  # (its rows cannot be read at all)
        out.damaged += 1
        first = first or str(exc)
    if out.damaged:
        out.state, out.detail = "damaged", first
        report.problems.append(f"entry log {log_id}: {out.damaged} damaged row(s) or "
                               f"bodies, e.g. {first}")
    return out
