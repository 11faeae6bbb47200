"""Looking at real child processes from tests: which children a process has, read from /proc
(a process's helpers must not outlive it)."""

from __future__ import annotations

import os
from pathlib import Path


def children(pid: int, running: str) -> list[int]:
    """Live (not zombie) child processes of ``pid`` whose command line mentions ``running``,
    from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z" and \
                    running in Path(f"/proc/{entry}/cmdline").read_text(errors="replace"):
                out.append(int(entry))
        except OSError:  # it ended while we looked
            continue
    return out
