"""``pybk simulate`` keeps the command line's rule: data (the summary) on stdout, the progress
bar on stderr and only when stderr is a terminal (as ``pybk ledger append`` does), so a
sweep's output piped to a file or another program is the summary alone."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

SWEEP = [sys.executable, "-m", "pybk", "simulate", "--seeds", "0..1", "--duration", "2",
         "--faults", "none", "--workers", "1"]


def test_off_a_terminal_there_is_no_bar_and_stdout_is_the_summary() -> None:
    out = subprocess.run(SWEEP, capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stdout.lstrip().startswith("pybk simulate"), out.stdout[:300]
    assert "simulating" not in out.stdout and "\r" not in out.stdout
    assert "\x1b[" not in out.stdout  # no cursor movement or colours in a pipe
    assert out.stderr == "", out.stderr


def test_on_a_terminal_the_bar_goes_to_stderr_only() -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(SWEEP, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=slave, env={**os.environ, "TERM": "xterm",
                                                   "COLUMNS": "100"})
    finally:
        os.close(slave)
    terminal = b""
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:  # drain the terminal while the sweep runs
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the sweep closed its end
                    break
                if not chunk:
                    break
                terminal += chunk
            elif proc.poll() is not None:
                break
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(60)
        os.close(master)
    assert b"simulating" in terminal, terminal[-500:]
    assert "simulating" not in stdout and stdout.lstrip().startswith("pybk simulate"), stdout
