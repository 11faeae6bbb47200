"""`pybk log` without bookies: the commands that need only the metadata store (create, list,
show and delete of a log without segments), and every kind of bad input, each a clear one-line
error with its exit status (1: the operation failed, 2: bad usage) and never a traceback.

The commands that read and write records run against bookie processes in
tests/tcp/test_log_cli.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from pybk.cli import main

COMMANDS = ["create", "list", "show", "append", "read", "tail", "truncate", "delete"]


@pytest.fixture
def uri(tmp_path) -> str:
    """A cluster's metadata store without bookies (client commands need it to exist)."""
    import asyncio

    from pybk.metadata import open_store

    uri = f"sqlite://{tmp_path / 'meta.db'}"

    async def make() -> None:
        store = open_store(uri)
        await store.list_bookies()
        await store.close()

    asyncio.run(make())
    return uri


def run(uri: str, *args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(main, ["log", *args], env={"PYBK_METADATA": uri}, input=input)


def one_error_line(result: Result) -> str:
    """The single line a failed operation prints (exit 1), with no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pybk: error: "), result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    return lines[0]


def usage_error(result: Result) -> str:
    """Click's bad-usage report (exit 2): the last line names what was wrong."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    return result.output.strip().splitlines()[-1]


def test_every_log_command_has_help():
    runner = CliRunner()
    for cmd in ["", *COMMANDS]:
        result = runner.invoke(main, ["log", *([cmd] if cmd else []), "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, (cmd, result.output)
    result = runner.invoke(main, ["log", "append", "--help"])
    assert "fences any earlier writer" in " ".join(result.output.split())


def test_create_list_show_delete_without_records(uri):
    r = run(uri, "create", "orders", "--compression", "zstd", "-e", "3", "-w", "3", "-a", "2",
            "--roll-entries", "100", "--retention-bytes", "1000000")
    assert r.exit_code == 0, r.output
    assert "created log 'orders' in namespace 'default'" in r.stderr
    assert run(uri, "create", "billing", "-n", "other").exit_code == 0
    assert run(uri, "create", "audit").exit_code == 0

    r = run(uri, "list")
    assert r.exit_code == 0 and r.stdout.split() == ["audit", "orders"]
    assert run(uri, "list", "--namespace", "other").stdout.split() == ["billing"]
    r = run(uri, "list", "--namespace", "empty")
    assert r.exit_code == 0 and r.stdout == "" and "no logs in namespace 'empty'" in r.stderr
    docs = [json.loads(line) for line in run(uri, "list", "--json").stdout.splitlines()]
    assert [d["name"] for d in docs] == ["audit", "orders"]
    assert docs[1] == {"namespace": "default", "name": "orders", "segments": 0,
                       "records_completed": 0, "in_progress": False, "truncated_before": None,
                       "end_of_stream": False, "writer": None}

    r = run(uri, "show", "orders", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["config"] == {
        "ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2, "digest_type": "CRC32C",
        "compression": "zstd", "roll_bytes": 64 << 20, "roll_entries": 100,
        "roll_seconds": None, "retention_seconds": None, "retention_bytes": 1000000,
    }
    assert doc["segments"] == [] and doc["first_position"] is None
    assert doc["last_position"] is None and doc["truncated_before"] is None
    assert doc["end_of_stream"] is False and doc["name"] == "orders"
    r = run(uri, "show", "orders")
    assert r.exit_code == 0, r.output
    assert "default/orders" in r.stdout and "zstd" in r.stdout and "no segments" in r.stdout
    assert "E=3 Qw=3 Qa=2" in r.stdout

    # --roll-bytes 0 turns the size rule off
    assert run(uri, "create", "unrolled", "--roll-bytes", "0").exit_code == 0
    assert json.loads(run(uri, "show", "unrolled", "--json").stdout)["config"]["roll_bytes"] is None

    # read of an empty log prints nothing and succeeds
    r = run(uri, "read", "audit")
    assert r.exit_code == 0 and r.stdout == ""

    r = run(uri, "delete", "audit", input="n\n")  # asks first, like `pybk ledger delete`
    assert r.exit_code == 1 and "delete log 'audit'" in r.output
    assert "audit" in run(uri, "list").stdout.split()
    r = run(uri, "delete", "audit", input="y\n")
    assert r.exit_code == 0 and "deleted log 'audit'" in r.stderr
    r = run(uri, "delete", "orders", "--yes")
    assert r.exit_code == 0
    assert run(uri, "list").stdout.split() == ["unrolled"]


def test_duplicate_create_fails_and_keeps_the_first_log(uri):
    assert run(uri, "create", "orders", "--compression", "zstd").exit_code == 0
    line = one_error_line(run(uri, "create", "orders"))
    assert line == ("pybk: error: LogExistsError: log 'orders' already exists in namespace "
                    "'default'")
    doc = json.loads(run(uri, "show", "orders", "--json").stdout)
    assert doc["config"]["compression"] == "zstd"
    assert run(uri, "create", "orders", "-n", "elsewhere").exit_code == 0  # another namespace


@pytest.mark.parametrize("args", [
    ["show", "nosuch"], ["show", "nosuch", "--json"], ["append", "nosuch", "x"],
    ["read", "nosuch"], ["tail", "nosuch"], ["truncate", "nosuch", "--before", "1:0:0"],
    ["delete", "nosuch", "--yes"], ["append", "nosuch", "--end-of-stream"],
], ids=lambda a: "-".join(a[:1] + a[2:]))
def test_unknown_log_is_one_line_exit_1(uri, args):
    line = one_error_line(run(uri, *args))
    assert line == "pybk: error: LogNotFoundError: log 'nosuch' does not exist in namespace " \
                   "'default'"


def test_append_to_unknown_log_reads_no_stdin_and_fails_first(uri):
    line = one_error_line(run(uri, "append", "nosuch", "-", input="a\nb\n"))
    assert "LogNotFoundError" in line


@pytest.mark.parametrize("value, why", [
    ("abc", "not a position: 'abc' (expected 'segment:entry:slot')"),
    ("1:2", "not a position: '1:2' (expected 'segment:entry:slot')"),
    ("1:2:3:4", "not a position: '1:2:3:4'"),
    ("-1:0:0", "not a position: '-1:0:0'"),
    ("0:0:0", "not a position: '0:0:0' (Position segment must be in 1..2**63-1, got 0)"),
    ("1:0:99999999999999999999", "not a position: '1:0:99999999999999999999'"),
    ("", "not a position: ''"),
])
@pytest.mark.parametrize("command", ["read --from", "tail --from", "truncate --before"])
def test_a_malformed_position_is_bad_usage_naming_the_value(uri, command, value, why):
    assert run(uri, "create", "orders").exit_code == 0
    name, option = command.split()
    line = usage_error(run(uri, name, "orders", option, value))
    assert line.startswith(f"Error: Invalid value for '{option}': {why}"), line


@pytest.mark.parametrize("name", ["bad/name", ".hidden", "-dash", "x" * 201, "sp ace"])
def test_a_bad_log_name_is_bad_usage(uri, name):
    for args in (["create", "--", name], ["show", "--", name], ["read", "--", name]):
        line = usage_error(run(uri, *args))
        assert line.startswith("Error: Invalid value for 'NAME': bad log name"), line
    line = usage_error(run(uri, "list", "--namespace", "a/b"))
    assert "bad namespace name 'a/b'" in line


@pytest.mark.parametrize("args, why", [
    (["-e", "2", "-w", "3"], "ensemble_size (2) must be >= write_quorum (3)"),
    (["-w", "2", "-a", "3"], "write_quorum (2) must be >= ack_quorum (3)"),
    (["-e", "0"], "Invalid value for '--ensemble' / '-e': 0 is not in the range x>=1"),
    (["--compression", "lz4"], "Invalid value for '--compression'"),
    (["--roll-seconds", "0"], "Invalid value for '--roll-seconds'"),
    (["--retention-bytes", "-5"], "Invalid value for '--retention-bytes'"),
])
def test_a_bad_configuration_is_refused_before_anything_is_stored(uri, args, why):
    line = usage_error(run(uri, "create", "orders", *args))
    assert why in line, line
    assert run(uri, "list").stdout == ""


def test_options_that_cannot_go_together_are_bad_usage(uri):
    assert run(uri, "create", "orders").exit_code == 0
    assert "give --from or --txid, not both" in usage_error(
        run(uri, "read", "orders", "--from", "1:0:0", "--txid", "3"))
    assert "nothing to append" in usage_error(run(uri, "append", "orders"))
    assert "cannot be mixed" in usage_error(run(uri, "append", "orders", "a", "-"))
    assert "--txid" in usage_error(run(uri, "append", "orders", "a", "--txid", "-1"))
    assert "--count" in usage_error(run(uri, "read", "orders", "--count", "0"))
    assert "--before" in usage_error(run(uri, "truncate", "orders"))  # required


def test_truncating_an_empty_log_says_why(uri):
    assert run(uri, "create", "orders").exit_code == 0
    line = one_error_line(run(uri, "truncate", "orders", "--before", "1:0:0"))
    assert line == ("pybk: error: ValueError: cannot truncate log 'orders' before 1:0:0: its "
                    "last record is None")


def test_without_bookies_an_append_fails_in_one_line_and_leaves_the_log_readable(uri):
    assert run(uri, "create", "orders").exit_code == 0
    line = one_error_line(run(uri, "append", "orders", "x", "--timeout", "20"))
    assert "NotEnoughBookiesError" in line
    doc = json.loads(run(uri, "show", "orders", "--json").stdout)
    assert doc["segments"] == [] and doc["last_position"] is None
    assert run(uri, "read", "orders").exit_code == 0


def test_a_timeout_is_one_line_naming_the_bound(uri):
    assert run(uri, "create", "orders").exit_code == 0
    line = one_error_line(run(uri, "show", "orders", "--timeout", "0.000001"))
    assert line.startswith("pybk: error: TimeoutError: not done within 1e-06 s")
    for args in (["read", "orders"], ["tail", "orders"], ["append", "orders", "x"],
                 ["truncate", "orders", "--before", "1:0:0"]):
        line = one_error_line(run(uri, *args, "--timeout", "0.000001"))
        assert line.startswith("pybk: error: TimeoutError: not done within 1e-06 s"), args
