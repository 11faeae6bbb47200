"""What ``pybk log show`` prints: a log's description as a JSON-able document (configuration,
writer, first and last positions, truncation point, end of stream, segments) and as tables."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pybk.logs.position import Position

__all__ = ["pos_str", "print_show", "show_doc"]


def pos_str(pos: Position | None) -> str | None:
    """A position as the commands print it (None stays None: JSON null)."""
    return None if pos is None else str(pos)


def show_doc(md: Any, first: Position | None, last: Position | None) -> dict[str, Any]:
    """The description of the log whose metadata is ``md`` (``show --json`` prints it)."""
    segments = []
    for s in md.segments:
        known = not s.in_progress  # an in-progress segment's counts are known at completion
        segments.append({
            "seq": s.seq,
            "ledger_id": s.ledger_id,
            "state": s.state,
            "records": s.records if known else None,
            "bytes": s.bytes if known else None,
            "last_position": pos_str(s.last_position) if known else None,
            "max_txid": (s.max_txid if s.max_txid >= 0 else None) if known else None,
            "ctime_ms": s.ctime_ms,
            "mtime_ms": s.mtime_ms,
            "tier": s.tier,
        })  # fmt: skip
    return {
        "namespace": md.namespace,
        "name": md.name,
        "ctime_ms": md.ctime_ms,
        "config": md.config.to_doc(),
        "writer": md.writer or None,
        "epoch": md.epoch,
        "next_seq": md.next_seq,
        "segments": segments,
        "allocated": list(md.allocated),
        "first_position": pos_str(first),
        "last_position": pos_str(last),
        "max_txid": md.max_txid if md.max_txid >= 0 else None,
        "truncated_before": pos_str(md.truncated_before),
        "end_of_stream": md.end_of_stream,
        "version": md.version,
    }


def _when(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _opt(value: Any, unit: str = "") -> str:
    return "-" if value is None else f"{value:,}{unit}"


def print_show(doc: dict[str, Any]) -> None:
    """Print the description ``doc`` as tables on stdout (the log, then its segments)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    cfg = doc["config"]
    about = Table.grid(padding=(0, 2))
    about.add_column(style="bold")
    about.add_column()
    about.add_row("log", f"{doc['namespace']}/{doc['name']} "
                         f"(created {_when(doc['ctime_ms'])} UTC)")
    about.add_row("quorums", f"E={cfg['ensemble_size']} Qw={cfg['write_quorum']} "
                             f"Qa={cfg['ack_quorum']}, digest {cfg['digest_type']}")
    about.add_row("compression", cfg["compression"])
    about.add_row("roll", f"bytes {_opt(cfg['roll_bytes'])}, entries {_opt(cfg['roll_entries'])}"
                          f", seconds {_opt(cfg['roll_seconds'])}")
    about.add_row("retention", f"seconds {_opt(cfg['retention_seconds'])}, "
                               f"bytes {_opt(cfg['retention_bytes'])}")
    about.add_row("writer", f"{doc['writer'] or '-'} (epoch {doc['epoch']})")
    about.add_row("first position", doc["first_position"] or "- (no records)")
    about.add_row("last position", doc["last_position"] or "- (no records)")
    about.add_row("max txid", _opt(doc["max_txid"]))
    about.add_row("truncated before", doc["truncated_before"] or "-")
    about.add_row("end of stream", "yes" if doc["end_of_stream"] else "no")
    console.print(about)
    # where each segment lives, once any has left the bookies (a column fewer at 80 columns)
    tiered = any(s["tier"] != "bookies" for s in doc["segments"])
    table = Table("seq", "ledger", "state", "records", "bytes", "last", "max txid",
                  "modified (UTC)", *(["tier"] if tiered else []), title="segments",
                  box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    for column in table.columns:
        column.no_wrap = True
    for s in doc["segments"]:
        table.add_row(
            str(s["seq"]), str(s["ledger_id"]), s["state"],
            "?" if s["records"] is None else f"{s['records']:,}",
            "?" if s["bytes"] is None else f"{s['bytes']:,}",
            s["last_position"] or ("?" if s["state"] == "in-progress" else "-"),
            "-" if s["max_txid"] is None else str(s["max_txid"]),
            _when(s["mtime_ms"]), *([s["tier"]] if tiered else []),
        )  # fmt: skip
    if doc["segments"]:
        console.print(table)
    else:
        console.print("no segments")


