"""Pictures of one simulated run, for a person reading a failure (Jepsen's artifacts):
``timeline.html`` (each process's operations over virtual time, faults as bands, each
violation marked and linked to its events), ``history.jsonl`` (every event), and with the
``plots`` extra (matplotlib) ``latency-raw.png``, ``latency-quantiles.png`` and ``rate.png``.
"""

from __future__ import annotations

import html
import json
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pybk.sim.history import OK, Event

if TYPE_CHECKING:
    from pybk.sim.result import SimResult

__all__ = ["FAULT_COLOR", "VIOLATION_COLOR", "operations", "write_report"]

#: colours a test (and a reader) looks for: a violation's mark, a fault's band
VIOLATION_COLOR = "#ff0000"
FAULT_COLOR = "#ffd700"
_OUTCOME_COLORS = {OK: "#2e8b57", "fail": "#ff8c00", "info": "#9e9e9e"}
_LANE, _LEFT, _WIDTH = 18, 150, 1400
#: events drawn as marks on their process's lane (adds are drawn as bars)
_MARKED = frozenset({"bookie_ack", "bookie_absent", "read", "read_error", "lac", "close_done",
                     "metadata", "log_read", "log_append_done"})


def operations(events: Sequence[Event]) -> list[tuple[str, float, float, str, str]]:
    """(process, start, end, outcome, label) of every add: invoke paired with completion."""
    open_: dict[tuple[str, int, int], Event] = {}
    out = []
    for ev in events:
        key = (ev.process, ev.ledger, ev.entry)
        if ev.kind == "add_invoke":
            open_[key] = ev
        elif ev.kind == "add_done" and key in open_:
            start = open_.pop(key)
            out.append((ev.process, start.t, ev.t, ev.outcome, f"add L{ev.ledger}:{ev.entry}"))
    return out


def _lanes(events: Sequence[Event]) -> list[str]:
    names = {ev.process for ev in events if ev.process}
    return sorted(names, key=lambda n: (n.startswith("b"), n.startswith("meta"), n))


def _timeline(result: SimResult, events: Sequence[Event]) -> str:
    lanes = _lanes(events)
    row = {name: i for i, name in enumerate(lanes)}
    end = max([ev.t for ev in events] + [result.duration, 1e-9])

    def x(t: float) -> float:
        return _LEFT + (t / end) * _WIDTH

    height = 40 + _LANE * len(lanes)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + _WIDTH + 20}" '
           f'height="{height}" font-family="monospace" font-size="11">']
    for ev in events:  # faults first: bands behind everything
        if ev.kind == "fault":
            kind = ev.detail.split("|")[0]
            svg.append(f'<rect class="fault" x="{x(ev.t):.1f}" y="20" width="'
                       f'{max(6.0, _WIDTH * 0.004):.1f}" height="{height - 20}" '
                       f'fill="{FAULT_COLOR}" fill-opacity="0.6"><title>fault {html.escape(kind)}'
                       f' {html.escape(ev.process)} at {ev.t:.3f}s</title></rect>')
    for name, i in row.items():
        y = 30 + i * _LANE
        svg.append(f'<text x="4" y="{y + 4}">{html.escape(name)}</text>'
                   f'<line x1="{_LEFT}" y1="{y}" x2="{_LEFT + _WIDTH}" y2="{y}" '
                   f'stroke="#ddd"/>')
    for proc, start, stop, outcome, label in operations(events):
        y = 30 + row[proc] * _LANE - 5
        color = _OUTCOME_COLORS.get(outcome, "#9e9e9e")
        svg.append(f'<rect x="{x(start):.1f}" y="{y}" width="{max(1.5, x(stop) - x(start)):.1f}"'
                   f' height="10" fill="{color}"><title>{html.escape(label)} -> '
                   f'{html.escape(outcome)} ({(stop - start) * 1000:.1f} ms)</title></rect>')
    for ev in events:  # what bookies and readers did: a thin mark each
        if ev.kind in _MARKED and ev.process in row:
            y = 30 + row[ev.process] * _LANE - 4
            svg.append(f'<rect x="{x(ev.t):.1f}" y="{y}" width="1" height="8" fill="#5c6bc0" '
                       f'fill-opacity="0.5"/>')
    by_line = {ev.line: ev for ev in events if ev.line >= 0}
    for n, v in enumerate(result.violations):
        hits = [by_line[ln] for ln in v.lines if ln in by_line]
        t = hits[0].t if hits else end
        svg.append(f'<a href="#violation-{n}"><line class="violation" x1="{x(t):.1f}" y1="12" '
                   f'x2="{x(t):.1f}" y2="{height}" stroke="{VIOLATION_COLOR}" stroke-width="4">'
                   f'<title>{html.escape(v.invariant)}: {html.escape(v.message)}</title></line>'
                   f'</a><text x="{x(t) + 4:.1f}" y="12" fill="{VIOLATION_COLOR}">'
                   f'{html.escape(v.invariant)}</text>')
    svg.append("</svg>")
    rows = []
    for n, v in enumerate(result.violations):
        links = " ".join(f'<a href="#event-{by_line[ln].index}">event {by_line[ln].index}</a>'
                         for ln in v.lines if ln in by_line)
        rows.append(f'<li id="violation-{n}"><b style="color:{VIOLATION_COLOR}">'
                    f'{html.escape(v.invariant)}</b> {html.escape(v.message)} {links}</li>')
    marked = {by_line[ln].index for v in result.violations for ln in v.lines if ln in by_line}
    table = [f'<tr id="event-{ev.index}"{" class=marked" if ev.index in marked else ""}>'
             f'<td>{ev.t:.6f}</td><td>{html.escape(ev.process)}</td><td>{ev.kind}</td>'
             f'<td>{html.escape(_text(ev))}</td></tr>' for ev in events]
    status = "ok" if result.ok else "FAILED"
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>seed {result.seed}: '
            f'{status}</title><style>body{{font-family:sans-serif}} tr.marked{{background:'
            f'#fdd}} td{{font-family:monospace;font-size:11px;padding:0 6px}}</style></head>'
            f'<body><h1>seed {result.seed}: {status}</h1><pre>{html.escape(result.report())}'
            f'</pre><p>reproduce: <code>{html.escape(result.command())}</code></p>'
            + "".join(svg) + f'<h2>violations</h2><ol start="0">{"".join(rows) or "none"}'
            f'</ol><h2>events</h2><table>{"".join(table)}</table></body></html>')


def _text(ev: Event) -> str:
    parts = [f"L{ev.ledger}" if ev.ledger >= 0 else "", f"e{ev.entry}" if ev.entry >= 0 else "",
             ev.outcome, ev.detail]
    return " ".join(p for p in parts if p)


def _history_line(ev: Event) -> str:
    doc: dict[str, Any] = {"index": ev.index, "time": ev.t, "kind": ev.kind,
                           "process": ev.process}
    for key in ("ledger", "entry", "value"):
        if getattr(ev, key) != -1:
            doc[key] = getattr(ev, key)
    if ev.outcome:
        doc["outcome"] = ev.outcome
    if ev.detail:
        doc["detail"] = ev.detail
    if ev.payload is not None:
        doc["payload"] = ev.payload.decode(errors="replace")
    return json.dumps(doc)


def _plots(events: Sequence[Event], directory: pathlib.Path) -> list[pathlib.Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the optional plots extra is not installed
        return []
    ops = operations(events)
    written = []
    fig, ax = plt.subplots(figsize=(10, 4))
    for outcome, color in _OUTCOME_COLORS.items():
        pts = [(a, (b - a) * 1000) for _p, a, b, o, _l in ops if o == outcome]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=4, c=color, label=outcome)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("add latency (ms)")
    ax.legend()
    written.append(_save(fig, directory / "latency-raw.png", plt))
    fig, ax = plt.subplots(figsize=(10, 4))
    end = max([b for _p, _a, b, _o, _l in ops] + [1.0])
    buckets: dict[int, list[float]] = {}
    for _p, a, b, _o, _l in ops:
        buckets.setdefault(int(b), []).append((b - a) * 1000)
    seconds = sorted(buckets)
    for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99"), (1.0, "max")):
        ax.plot(seconds, [sorted(buckets[s])[min(len(buckets[s]) - 1,
                                                 int(q * len(buckets[s])))] for s in seconds],
                label=name)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("add latency (ms)")
    ax.legend()
    written.append(_save(fig, directory / "latency-quantiles.png", plt))
    fig, ax = plt.subplots(figsize=(10, 4))
    for outcome, color in _OUTCOME_COLORS.items():
        counts = [0] * (int(end) + 1)
        for _p, _a, b, o, _l in ops:
            if o == outcome:
                counts[int(b)] += 1
        ax.plot(range(len(counts)), counts, c=color, label=outcome)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("adds completed per second")
    ax.legend()
    written.append(_save(fig, directory / "rate.png", plt))
    return written


def _save(fig: Any, path: pathlib.Path, plt: Any) -> pathlib.Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def write_report(result: SimResult, directory: str | pathlib.Path) -> list[pathlib.Path]:
    """Write the run's report files into ``directory`` (made if missing); their paths.
    ``result`` must come from ``run(..., keep_history=True)``."""
    events = result.history
    if events is None:
        raise ValueError("the run kept no history: run it with keep_history=True")
    out = pathlib.Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    timeline = out / "timeline.html"
    timeline.write_text(_timeline(result, events))
    history = out / "history.jsonl"
    history.write_text("".join(_history_line(ev) + "\n" for ev in events))
    return [timeline, history, *_plots(events, out)]
