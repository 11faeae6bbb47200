"""The rules behind the server's bounds, on their own: connection admission with fair
displacement, rate-limited warnings, the limits' validation and their command-line form."""

from __future__ import annotations

import logging

import click
import pytest

from pybk.cli.limits import ByteSize, server_config_from
from pybk.runtime.ratelog import RateLimitedLog
from pybk.transport.admission import (
    CONNECTION_CAP,
    PER_IP_CAP,
    UNPROVEN_BUDGET,
    Admission,
)
from pybk.transport.limits import ServerConfig


def _fill(a: Admission, ip: str, n: int, unproven: bool = False) -> None:
    for _ in range(n):
        assert a.decide(ip, unproven).refused is None
        a.add(ip, unproven)


def test_caps_refuse_in_order_per_address_then_total():
    a = Admission(max_total=4, max_per_ip=2, max_unproven=10)
    _fill(a, "x", 2)
    assert a.decide("x", False).refused == PER_IP_CAP
    _fill(a, "y", 2)
    # full: z (holding none) displaces one of an address holding 2 >= 0 + 2
    d = a.decide("z", False)
    assert d.refused is None and d.displace_ip == "x"
    a.remove("x", False)
    _fill(a, "z", 1)
    # x 1, y 2, z 1: a second z finds nobody holding 1 + 2: refused
    assert a.decide("z", False).refused == CONNECTION_CAP
    assert a.total == 4


def test_no_displacement_between_equals():
    a = Admission(max_total=4, max_per_ip=4, max_unproven=10)
    _fill(a, "x", 2)
    _fill(a, "y", 2)
    assert a.decide("x", False).refused == CONNECTION_CAP  # x holds as many as anyone
    assert a.decide("y", False).refused == CONNECTION_CAP
    d = a.decide("z", False)
    assert d.displace_ip in ("x", "y")  # 2 >= 0 + 2


def test_unproven_connections_have_their_own_budget():
    a = Admission(max_total=100, max_per_ip=100, max_unproven=3)
    _fill(a, "attacker", 3, unproven=True)
    # more unproven from the same address: only in place of one of its own
    d = a.decide("attacker", True)
    assert d.refused == UNPROVEN_BUDGET and d.displace_ip == "attacker" and not d.oldest
    # proven connections are not limited by the unproven budget
    assert a.decide("attacker", False).refused is None
    # another address displaces one of the attacker's unproven connections
    d = a.decide("client", True)
    assert d.refused is None and d.displace_ip == "attacker" and d.unproven_only
    a.remove("attacker", True)
    a.add("client", True)
    a.proven("client")  # authenticated: leaves the budget
    assert a.unproven == 2 and a.unproven_per_ip["attacker"] == 2
    assert "client" not in a.unproven_per_ip and a.per_ip["client"] == 1


def test_a_flood_from_few_addresses_never_displaces_a_lone_client():
    """Two addresses hold the whole unproven budget and reconnect at once when displaced; a
    client's single unproven connection is never their price, whichever of them comes."""
    a = Admission(max_total=1000, max_per_ip=1000, max_unproven=128)
    _fill(a, "x", 64, unproven=True)
    _fill(a, "y", 64, unproven=True)
    d = a.decide("client", True)
    assert d.refused is None and d.displace_ip in ("x", "y")
    a.remove(d.displace_ip, True)
    a.add("client", True)
    for i in range(1000):
        newcomer = "x" if i % 3 else "y"
        d = a.decide(newcomer, True)
        assert d.displace_ip in ("x", "y") and not d.oldest, d
        a.remove(d.displace_ip, True)
        a.add(newcomer, True)
        assert abs(a.unproven_per_ip["x"] - a.unproven_per_ip["y"]) <= 1
    assert a.unproven_per_ip["client"] == 1 and a.unproven == 128


def test_many_lone_addresses_displace_the_oldest():
    a = Admission(max_total=1000, max_per_ip=1000, max_unproven=4)
    for ip in "abcd":
        _fill(a, ip, 1, unproven=True)
    d = a.decide("e", True)
    assert d.oldest and d.displace_ip is None and d.refused == UNPROVEN_BUDGET


def test_counts_return_to_zero():
    a = Admission(max_total=10, max_per_ip=10, max_unproven=10)
    _fill(a, "x", 3, unproven=True)
    a.proven("x")
    a.remove("x", False)
    a.remove("x", True)
    a.remove("x", True)
    assert a.total == a.unproven == 0 and not a.per_ip and not a.unproven_per_ip


def test_rate_limited_log_reports_counts(caplog):
    now = [0.0]
    warnings = RateLimitedLog(logging.getLogger("test.ratelog"), 10.0, lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.ratelog"):
        for i in range(1000):
            now[0] = i * 0.001
            warnings.event("refused connections", f"attempt {i}")
        warnings.flush()  # the interval has not passed: nothing yet
        now[0] = 11.0
        warnings.flush()
        warnings.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and warnings.emitted == 2
    assert "attempt 0" in messages[0]
    assert "999 more" in messages[1] and "attempt 999" in messages[1]


def test_limits_are_checked_when_made():
    with pytest.raises(ValueError, match="connection_budget"):
        ServerConfig(connection_budget=0)
    with pytest.raises(ValueError, match="auth_timeout"):
        ServerConfig(auth_timeout=0)
    with pytest.raises(ValueError, match="max_connections"):
        ServerConfig(max_connections=-1)
    with pytest.raises(ValueError, match="max_frame"):
        ServerConfig(max_frame=3)
    with pytest.raises(ValueError, match="keepalive"):
        ServerConfig(keepalive=float("nan"))
    assert ServerConfig(max_connections=0).max_connections == 0  # refuse everyone: allowed


def test_byte_sizes_on_the_command_line():
    size = ByteSize()
    assert size.convert("4096", None, None) == 4096
    assert size.convert("512KiB", None, None) == 512 << 10
    assert size.convert("16M", None, None) == 16 << 20
    assert size.convert("1GB", None, None) == 10**9
    for bad in ("", "12 parsecs", "-1", "1.5MiB"):
        with pytest.raises(click.BadParameter):
            size.convert(bad, None, None)


def test_bad_limit_names_its_option():
    with pytest.raises(click.BadParameter) as info:
        server_config_from({"bookie_budget": 0})
    assert "--bookie-budget" in str(info.value.param_hint)


def test_every_limit_is_a_bookie_option():
    """Each ServerConfig field is settable from ``pybk bookie`` (bar stop_grace, which has
    its own older option, the pre-auth frame cap and the listen backlog)."""
    import dataclasses

    from click.testing import CliRunner

    from pybk.cli import main

    help_text = CliRunner().invoke(main, ["bookie", "--help"], terminal_width=200).output
    for field in dataclasses.fields(ServerConfig):
        if field.name in ("pre_auth_max_frame", "backlog"):
            continue
        assert "--" + field.name.replace("_", "-") in help_text, field.name


def test_what_a_request_is_charged():
    """Adds: their body; reads: the entry the bookie's index says the answer carries (a
    whole frame when it cannot tell); long polls: nothing up front; anything else: the bytes
    it carries, batches' bodies included."""
    import dataclasses as dc

    from pybk.transport.limits import REQUEST_OVERHEAD as O
    from pybk.transport.server import BookieServer
    from pybk.wire import (
        AddRequest,
        BookieInfoRequest,
        Op,
        ReadLacRequest,
        ReadRequest,
        WriteLacRequest,
    )

    sizes = {ReadRequest: 1000, ReadLacRequest: None}
    server = BookieServer(lambda r: None,  # type: ignore[arg-type, return-value]
                          response_size=lambda r: sizes[type(r)])
    assert server.request_cost(AddRequest(1, 0, b"k", bytes(700))) == O + 700
    assert server.request_cost(ReadRequest(1, 0)) == O + 1000
    assert server.request_cost(ReadLacRequest(1)) == O + server.config.max_frame
    assert server.request_cost(ReadRequest(1, 0, previous_lac=-1, timeout=5.0)) == O
    assert server.request_cost(WriteLacRequest(1, 0, b"kk", bytes(48))) == O + 50
    assert server.request_cost(BookieInfoRequest()) == O

    @dc.dataclass(frozen=True)
    class SomeBatch:  # the shape of a batch of adds: a sequence of bodies
        ledger_id: int
        bodies: tuple[bytes, ...]
        op = Op.ADD

    assert server.request_cost(SomeBatch(1, (bytes(10), bytes(20)))) == O + 30  # type: ignore[arg-type]
