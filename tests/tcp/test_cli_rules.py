"""The command line keeps its own rules: one flag, one meaning (``--timeout`` on both tails),
usage errors exit 2 naming what was wrong (a malformed metadata URI on every command that
takes one), data on stdout as it is made (``ledger append -`` prints the id at once and
appends each line as it arrives), and a missing ledger or log is reported before anything is
asked. Commands that end by themselves run in-process through click's runner; those a test
must feed or follow over time run as ``python -m pybk`` processes. Every wait is bounded."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner, Result

from pybk.cli import main

pytestmark = pytest.mark.integration

WAIT = 60.0  # bound on any one wait for a process's output or exit
BAD_URIS = ["sqlite://tmp/x", "foo://bar", "/tmp/x"]


def _pybk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("cli-rules") / "c"
    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "3")
    try:
        assert up.returncode == 0, up.stderr
        yield up.stdout.strip()
    finally:
        down = _pybk("cluster", "down", "--root", str(root))
        assert down.returncode == 0, down.stderr


def run(uri: str, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env={"PYBK_METADATA": uri}, input=input)


def one_error_line(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pybk: error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


class Proc:
    """A ``python -m pybk ...`` process whose stdout lines a thread collects, so a test waits
    for the next line with a bound; killed by PID at the end if still running."""

    def __init__(self, uri: str, *args: str, stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pybk", *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYBK_METADATA": uri})
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode().rstrip("\n"))
        self.lines.put(None)

    def next_line(self, bound: float = WAIT) -> str:
        try:
            line = self.lines.get(timeout=bound)
        except queue.Empty:
            raise AssertionError(f"no line within {bound} s") from None
        assert line is not None, f"exited early: {self.finish()}"
        return line

    def feed(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def finish(self) -> tuple[int, list[str], str]:
        """Wait for the exit: (status, the stdout lines not yet taken, stderr)."""
        status = self.proc.wait(WAIT)
        self._reader.join(WAIT)
        rest = []
        while (line := self.lines.get_nowait()) is not None:
            rest.append(line)
        assert self.proc.stderr is not None
        return status, rest, self.proc.stderr.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


# -- --metadata -------------------------------------------------------------------------------


def _commands_taking_metadata(group: click.Group,
                              prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    if any(p.name == "metadata" for p in group.params):
        out.append(prefix)
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out += _commands_taking_metadata(cmd, (*prefix, name))
        elif any(p.name == "metadata" for p in cmd.params):
            out.append((*prefix, name))
    return out


def test_a_malformed_metadata_uri_is_bad_usage_on_every_command_naming_it() -> None:
    commands = _commands_taking_metadata(main)
    for expected in [("bookie",), ("autorecovery",), ("bench",), ("ledger", "append"),
                     ("log", "tail"), ("bookie", "list"), ("autorecovery", "status")]:
        assert expected in commands, commands
    runner = CliRunner()
    for path in commands:
        for bad in BAD_URIS:
            r = runner.invoke(main, [*path, "--metadata", bad])
            assert r.exit_code == 2, (path, bad, r.exit_code, r.output)
            assert "Traceback" not in r.output and isinstance(r.exception, SystemExit)
            last = r.output.strip().splitlines()[-1]
            assert re.match(r"Error: Invalid value for '?--metadata'?: bad metadata URI "
                            + re.escape(repr(bad)), last), (path, r.output)
    # from the environment too, and before a bookie makes its data directory
    r = runner.invoke(main, ["bookie", "--data", "never-made"],
                      env={"PYBK_METADATA": "foo://bar"})
    assert r.exit_code == 2 and "bad metadata URI 'foo://bar'" in r.output, r.output
    assert not os.path.exists("never-made")


# -- --timeout on the tails -------------------------------------------------------------------


def test_both_tails_say_the_same_about_timeout() -> None:
    said = []
    for group, what in (("ledger", "entry"), ("log", "record")):
        r = CliRunner().invoke(main, [group, "tail", "--help"], terminal_width=400)
        text = " ".join(r.output.split())
        rule = (f"with --timeout SECONDS it gives up (exit 1) when no new {what} arrives for "
                "that long")
        assert rule in text, text
        said.append(rule.replace(what, "X"))
    assert said[0] == said[1]


def test_an_idle_log_tail_gives_up_after_its_timeout(uri: str) -> None:
    assert run(uri, "log", "create", "idle").exit_code == 0
    assert run(uri, "log", "append", "idle", "only").exit_code == 0
    began = time.monotonic()
    out = _pybk("log", "tail", "idle", "--timeout", "2", env={"PYBK_METADATA": uri})
    took = time.monotonic() - began
    assert out.returncode == 1, out.stderr
    assert [line.split("\t")[1] for line in out.stdout.splitlines()] == ["only"]
    assert out.stderr.strip() == ("pybk: error: TimeoutError: no new record in log 'idle' "
                                  "within 2 s (raise --timeout to wait longer)")
    assert 2 <= took < 15, took
    # an empty log too
    assert run(uri, "log", "create", "empty").exit_code == 0
    out = _pybk("log", "tail", "empty", "--timeout", "1", env={"PYBK_METADATA": uri})
    assert out.returncode == 1 and out.stdout == "", out
    assert "no new record in log 'empty' within 1 s" in out.stderr


# -- ledger append - --------------------------------------------------------------------------


def test_ledger_append_from_a_live_pipe_is_followed_by_a_tail(uri: str) -> None:
    append = Proc(uri, "ledger", "append", "-", stdin=True)
    tail: Proc | None = None
    try:
        ledger = append.next_line(30)  # the id, before any input
        assert ledger.isdigit(), ledger
        tail = Proc(uri, "ledger", "tail", ledger)
        for i, line in enumerate([b"one", b"two", b"three"]):
            append.feed(line + b"\n")  # the pipe stays open: each line goes as it comes
            assert tail.next_line() == f"{i}\t{line.decode()}"
        append.feed(b"last, no newline")
        append.close_stdin()
        status, rest, err = append.finish()
        assert status == 0 and rest == [], (status, rest, err)
        assert err.strip() == f"appended 4 entries to ledger {ledger}"
        assert tail.next_line() == "3\tlast, no newline"
        status, rest, err = tail.finish()  # the append closed the ledger: the tail ends
        assert status == 0 and rest == [], (status, rest, err)
    finally:
        append.stop()
        if tail is not None:
            tail.stop()


def test_ledger_append_arguments_and_mixing(uri: str) -> None:
    r = run(uri, "ledger", "append", "a", "b")
    assert r.exit_code == 0 and r.stdout.strip().isdigit(), r.output
    assert f"appended 2 entries to ledger {r.stdout.strip()}" in r.stderr
    r = run(uri, "ledger", "append", "a", "-")
    assert r.exit_code == 2 and "'-' (entries from stdin) cannot be mixed with DATA" in r.output


def test_a_too_long_stdin_line_fails_in_one_line_after_the_earlier_ones(uri: str) -> None:
    from pybk.client.context import DEFAULT_MAX_ENTRY_SIZE

    r = run(uri, "ledger", "append", "-",
            input="fine\n" + "x" * (DEFAULT_MAX_ENTRY_SIZE + 70_000) + "\n")
    ledger = r.stdout.strip()
    assert ledger.isdigit(), r.output
    line = one_error_line(r)
    assert line.startswith("pybk: error: EntryTooLargeError: a line of stdin is longer than")
    read = run(uri, "ledger", "read", ledger)  # sealed with what was acknowledged
    assert read.exit_code == 0 and read.stdout == "0\tfine\n", read.output


# -- show and delete --------------------------------------------------------------------------


def test_ledger_show_prints_when_the_ledger_was_created(uri: str) -> None:
    import json

    before = int(time.time() * 1000)
    ledger = run(uri, "ledger", "create").stdout.strip()
    after = int(time.time() * 1000)
    r = run(uri, "ledger", "show", ledger)
    assert r.exit_code == 0, r.output
    ctime = json.loads(r.stdout)["ctime_ms"]
    assert before - 1000 <= ctime <= after + 1000, (before, ctime, after)


def test_deleting_what_does_not_exist_says_so_before_asking(uri: str) -> None:
    r = run(uri, "ledger", "delete", "999999", input="y\n")
    assert one_error_line(r) == ("pybk: error: NoSuchLedgerError: ledger 999999 does not "
                                 "exist")
    assert "delete ledger" not in r.output  # never asked
    r = run(uri, "log", "delete", "nosuchlog", input="y\n")
    assert re.match(r"pybk: error: LogNotFoundError: .*nosuchlog", one_error_line(r))
    assert "delete log" not in r.output
    # an existing one is asked about, and kept on "no"
    ledger = run(uri, "ledger", "create").stdout.strip()
    r = run(uri, "ledger", "delete", ledger, input="n\n")
    assert r.exit_code == 1 and f"delete ledger {ledger}?" in r.output
    assert run(uri, "ledger", "show", ledger).exit_code == 0
    r = run(uri, "ledger", "delete", ledger, input="y\n")
    assert r.exit_code == 0 and f"deleted ledger {ledger}" in r.stderr
    assert "NoSuchLedgerError" in one_error_line(run(uri, "ledger", "show", ledger))
