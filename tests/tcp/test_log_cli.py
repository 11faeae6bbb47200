"""`pybk log` end to end against bookie processes started by `pybk cluster up`: create,
append (arguments and stdin), read, show, truncate, tail until the end of stream, delete, a
second writer fencing the first, Ctrl-C, and bad input (each a one-line error, nothing
acknowledged lost). The commands run in-process through click's runner where they end by
themselves, and as `python -m pybk` processes where a test must signal them or feed them
over time. Every wait is on a condition, with a bound."""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from click.testing import CliRunner, Result

from pybk import Position
from pybk.cli import main

pytestmark = pytest.mark.integration

T = TypeVar("T")
WAIT = 60.0  # bound on any one wait for a process's output or exit
BINARY = b"\x00\xffbin\ttab"  # not printable as text: shown in hex


def _pybk(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pybk", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})  # fmt: skip


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("logcli") / "c"
    up = _pybk("cluster", "up", "--root", str(root), "--bookies", "3")
    try:
        assert up.returncode == 0, up.stderr
        yield up.stdout.strip()
    finally:
        down = _pybk("cluster", "down", "--root", str(root))
        assert down.returncode == 0, down.stderr


def run(uri: str, *args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(main, ["log", *args], env={"PYBK_METADATA": uri}, input=input)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.output)
    return result


def error_line(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("pybk: error: "), result.output
    assert "Traceback" not in result.output
    return lines[-1]


def positions(result: Result) -> list[Position]:
    return [Position.parse(line) for line in ok(result).stdout.splitlines()]


def records(uri: str, name: str, *args: str) -> list[tuple[str, bytes, int | None]]:
    out = ok(run(uri, "read", name, "--format", "json", *args)).stdout.splitlines()
    docs = [json.loads(line) for line in out]
    return [(d["position"], base64.b64decode(d["data"]), d["txid"]) for d in docs]


def until(probe: Callable[[], T], done: Callable[[T], bool]) -> T:
    """Probe until ``done(result)`` holds; fail after WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not done(result := probe()):
        assert time.monotonic() < deadline, f"not reached within {WAIT} s: {result}"
    return result


class Proc:
    """A `python -m pybk log ...` process whose stdout lines are collected by a thread, so a
    test waits for the next line with a bound; stopped by PID at the end."""

    def __init__(self, uri: str, *args: str, stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pybk", "log", *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, "PYBK_METADATA": uri},
            # Ctrl-C must reach it even when the test run itself ignores SIGINT (a job
            # started in the background by a shell without job control)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode().rstrip("\n"))
        self.lines.put(None)

    def next_lines(self, n: int) -> list[str]:
        out = []
        for _ in range(n):
            line = self.lines.get(timeout=WAIT)
            assert line is not None, f"exited early: {self.finish()}"
            out.append(line)
        return out

    def feed(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

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


def test_a_log_session(uri):
    ok(run(uri, "create", "events", "--compression", "zstd"))
    assert "events" in ok(run(uri, "list")).stdout.split()
    assert "LogExistsError" in error_line(run(uri, "create", "events"))

    first = positions(run(uri, "append", "events", "alpha", "beta", "gamma"))
    assert first == sorted(first) and len(set(first)) == 3 and first[0] == Position(1, 0, 0)
    stdin = b"one\ntwo\n" + BINARY + b"\nlast without newline"
    second = positions(run(uri, "append", "events", "-", "--txid", "100", input=stdin))
    assert len(second) == 4 and second == sorted(second) and second[0] > first[-1]
    assert second[0].segment == 2  # each append opens the writer: a new segment

    r = ok(run(uri, "read", "events"))
    assert r.stdout.splitlines() == [
        f"{first[0]}\talpha", f"{first[1]}\tbeta", f"{first[2]}\tgamma",
        f"{second[0]}\tone", f"{second[1]}\ttwo",
        f"{second[2]}\thex:{BINARY.hex()}", f"{second[3]}\tlast without newline",
    ]  # fmt: skip
    assert records(uri, "events") == [
        (str(first[0]), b"alpha", None), (str(first[1]), b"beta", None),
        (str(first[2]), b"gamma", None), (str(second[0]), b"one", 100),
        (str(second[1]), b"two", 101), (str(second[2]), BINARY, 102),
        (str(second[3]), b"last without newline", 103),
    ]  # fmt: skip
    r = ok(run(uri, "read", "events", "--format", "raw", "--from", str(second[0])))
    assert r.stdout_bytes == b"one\ntwo\n" + BINARY + b"\nlast without newline\n"
    r = ok(run(uri, "read", "events", "--format", "hex", "--from", str(first[1]), "--count", "2"))
    assert r.stdout.splitlines() == [f"{first[1]}\t{b'beta'.hex()}",
                                     f"{first[2]}\t{b'gamma'.hex()}"]
    assert [p for p, _, _ in records(uri, "events", "--txid", "102")] == [str(second[2]),
                                                                           str(second[3])]
    assert records(uri, "events", "--txid", "104") == []
    assert records(uri, "events", "--from", str(second[3].next_slot())) == []

    doc = json.loads(ok(run(uri, "show", "events", "--json")).stdout)
    assert doc["first_position"] == str(first[0]) and doc["last_position"] == str(second[3])
    assert doc["max_txid"] == 103 and doc["end_of_stream"] is False
    assert [(s["seq"], s["state"], s["records"], s["last_position"], s["max_txid"])
            for s in doc["segments"]] == [(1, "completed", 3, str(first[2]), None),
                                          (2, "completed", 4, str(second[3]), 103)]
    assert all(s["bytes"] > 0 for s in doc["segments"])
    text = ok(run(uri, "show", "events")).stdout
    for needle in ("default/events", "zstd", str(first[0]), str(second[3]), "completed"):
        assert needle in text, (needle, text)

    # truncation: reading before the point fails with the clear error, after it works
    ok(run(uri, "truncate", "events", "--before", str(second[1])))
    line = error_line(run(uri, "read", "events", "--from", str(first[0])))
    assert line == (f"pybk: error: AlreadyTruncatedError: log 'events': position {first[0]} is "
                    f"before the truncation point {second[1]}")
    assert "AlreadyTruncatedError" in error_line(
        run(uri, "read", "events", "--from", str(second[0])))
    assert [d for _, d, _ in records(uri, "events")] == [b"two", BINARY, b"last without newline"]
    doc = json.loads(ok(run(uri, "show", "events", "--json")).stdout)
    assert doc["truncated_before"] == str(second[1])
    assert doc["first_position"] == str(second[1])
    assert [s["seq"] for s in doc["segments"]] == [2]  # segment 1 and its ledger are gone
    line = error_line(run(uri, "truncate", "events", "--before", "9:0:0"))
    assert line.startswith("pybk: error: ValueError: cannot truncate log 'events' before 9:0:0")

    # bad input against the live cluster: unknown log, malformed position
    assert "LogNotFoundError" in error_line(run(uri, "read", "nosuch"))
    assert "LogNotFoundError" in error_line(run(uri, "append", "nosuch", "x"))
    r = run(uri, "read", "events", "--from", "2:x:0")
    assert r.exit_code == 2 and "not a position: '2:x:0'" in r.output

    ok(run(uri, "delete", "events", "--yes"))
    assert "LogNotFoundError" in error_line(run(uri, "read", "events"))
    assert "LogNotFoundError" in error_line(run(uri, "show", "events"))
    assert "events" not in run(uri, "list").stdout.split()


def test_tail_follows_until_the_end_of_stream(uri):
    ok(run(uri, "create", "feed"))
    head = positions(run(uri, "append", "feed", "a", "b"))
    tail = Proc(uri, "tail", "feed", "--format", "json")
    try:
        got = [json.loads(line) for line in tail.next_lines(2)]
        assert [(d["position"], d["data"]) for d in got] == [
            (str(head[0]), base64.b64encode(b"a").decode()),
            (str(head[1]), base64.b64encode(b"b").decode())]
        more = positions(run(uri, "append", "feed", "c"))
        assert json.loads(tail.next_lines(1)[0])["position"] == str(more[0])
        last = positions(run(uri, "append", "feed", "-", "--end-of-stream", input="d\ne\n"))
        got = [json.loads(line) for line in tail.next_lines(2)]
        assert [d["position"] for d in got] == [str(p) for p in last]
        status, rest, err = tail.finish()
        assert status == 0 and rest == [] and "log 'feed' ended" in err, err
    finally:
        tail.stop()
    # a tail of an ended log prints what is there and ends; appending to it fails
    r = ok(run(uri, "tail", "feed", "--from", str(more[0])))
    assert [line.split("\t")[1] for line in r.stdout.splitlines()] == ["c", "d", "e"]
    line = error_line(run(uri, "append", "feed", "late"))
    assert line == "pybk: error: EndOfStreamError: log 'feed' is marked ended; no more records"
    assert json.loads(ok(run(uri, "show", "feed", "--json")).stdout)["end_of_stream"] is True


def test_ctrl_c_exits_130_and_an_interrupted_append_keeps_what_it_printed(uri):
    ok(run(uri, "create", "ctl"))
    append = Proc(uri, "append", "ctl", "-", stdin=True)
    try:
        append.feed(b"r1\nr2\n")
        printed = [Position.parse(p) for p in append.next_lines(2)]
        append.proc.send_signal(signal.SIGINT)  # its stdin stays open: it must not wait on it
        status, rest, err = append.finish()
        assert status == 130 and rest == [] and err.strip() == "pybk: interrupted", err
    finally:
        append.stop()
    assert [(p, d) for p, d, _ in records(uri, "ctl")] == [(str(printed[0]), b"r1"),
                                                            (str(printed[1]), b"r2")]
    tail = Proc(uri, "tail", "ctl")
    try:
        assert tail.next_lines(2) == [f"{printed[0]}\tr1", f"{printed[1]}\tr2"]
        tail.proc.send_signal(signal.SIGINT)
        status, rest, err = tail.finish()
        assert status == 130 and rest == [] and err.strip() == "pybk: interrupted", err
    finally:
        tail.stop()


def test_a_new_writer_fences_a_running_append(uri):
    ok(run(uri, "create", "fence"))
    old = Proc(uri, "append", "fence", "-", "--label", "old-writer", stdin=True)
    try:
        old.feed(b"a1\n")
        (a1,) = [Position.parse(p) for p in old.next_lines(1)]
        # while it writes: its segment is in progress, counts unknown until completed; the
        # last position is what the bookies confirm (the writer's explicit LAC, within 0.2 s)
        doc = until(lambda: json.loads(ok(run(uri, "show", "fence", "--json")).stdout),
                    lambda d: d["last_position"] == str(a1))
        (seg,) = doc["segments"]
        assert seg["state"] == "in-progress" and seg["records"] is None
        assert seg["last_position"] is None and doc["writer"] == "old-writer"
        assert "in-progress" in ok(run(uri, "show", "fence")).stdout
        assert records(uri, "fence") == [(str(a1), b"a1", None)]
        (b1,) = positions(run(uri, "append", "fence", "b1"))
        assert b1 > a1
        old.feed(b"a2\n")
        status, rest, err = old.finish()  # its stdin is still open
        assert status == 1 and rest == [], (rest, err)
        assert err.strip().splitlines()[-1].startswith("pybk: error: LedgerFencedError"), err
    finally:
        old.stop()
    assert [(p, d) for p, d, _ in records(uri, "fence")] == [(str(a1), b"a1"), (str(b1), b"b1")]


def test_bad_records_fail_in_one_line_after_the_good_ones_are_acknowledged(uri):
    ok(run(uri, "create", "strict"))
    too_long = b"ok\n" + b"x" * ((1 << 20) + 10) + b"\nnever\n"
    r = run(uri, "append", "strict", "-", input=too_long)
    assert "RecordTooLargeError" in error_line(r)
    (ok_pos,) = [Position.parse(line) for line in r.stdout.splitlines()]
    positions(run(uri, "append", "strict", "t5", "--txid", "5"))
    line = error_line(run(uri, "append", "strict", "t3", "--txid", "3"))
    assert line == ("pybk: error: ValueError: txid 3 is below the log's last txid 5 (txids never "
                    "decrease)")
    assert [(p, d) for p, d, _ in records(uri, "strict")][:1] == [(str(ok_pos), b"ok")]
    assert [d for _, d, _ in records(uri, "strict")] == [b"ok", b"t5"]

    ok(run(uri, "create", "wide", "-e", "5", "-w", "3", "-a", "2"))  # 3 bookies run
    assert "NotEnoughBookiesError" in error_line(run(uri, "append", "wide", "x",
                                                     "--timeout", "20"))
    assert ok(run(uri, "read", "wide")).stdout == ""


def test_log_commands_are_listed_by_the_cli():
    assert set(main.commands["log"].commands) == {  # type: ignore[attr-defined]
        "create", "list", "show", "append", "read", "tail", "truncate", "delete",
        "cursors", "delete-cursor", "reset-cursor", "retention", "offload", "mirror",
        "consume", "offload-service"}


def test_a_tail_whose_reader_goes_away_ends_quietly(uri):
    """`pybk log tail NAME | head -1`: once the pipe's reader is gone, the next record ends
    the tail with status 141 (128 + SIGPIPE, as a shell shows it) and no error message."""
    import select

    ok(run(uri, "create", "piped"))
    positions(run(uri, "append", "piped", "first"))
    proc = subprocess.Popen([sys.executable, "-m", "pybk", "log", "tail", "piped"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYBK_METADATA": uri})  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        ready, _, _ = select.select([proc.stdout], [], [], WAIT)
        assert ready, "no output from the tail"
        assert proc.stdout.readline().decode().endswith("\tfirst\n")
        proc.stdout.close()
        positions(run(uri, "append", "piped", "second"))
        assert proc.wait(WAIT) == 141
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        proc.stderr.close()  # type: ignore[union-attr]
