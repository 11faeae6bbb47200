"""``pybk bookie``'s limit options: one per field of
:class:`pybk.transport.limits.ServerConfig`, so every bound on what a remote peer can make a
bookie hold can be set from the command line (docs/protocol.md, "Limits")."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from pybk.transport.limits import ServerConfig

__all__ = ["ByteSize", "server_config_from", "server_limit_options"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


if TYPE_CHECKING:  # generic in recent click (8.3+), a plain class before
    _IntParam = click.ParamType[int, Any]
else:
    _IntParam = click.ParamType


class ByteSize(_IntParam):
    """A byte count: ``4096``, ``512KiB``, ``16M`` (binary), ``1GB`` (decimal)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(value))
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _UNITS:
            self.fail(f"{value!r} is not a size (e.g. 4096, 512KiB, 16MiB, 1GiB)", param, ctx)
        return int(match.group(1)) * _UNITS[unit]


# (field, help, type) in the order --help lists them; the option is the field's name with
# dashes (e.g. --max-connections), its default the field's default
_LIMITS: list[tuple[str, str, Any]] = [
    ("max_connections", "Connections in all (handshakes and unauthenticated ones included); "
     "lowered at start to what the open-file limit allows after --fd-reserve.", int),
    ("max_connections_per_ip", "Connections from one address.", int),
    ("max_unauthenticated", "Connections in their TLS handshake or (with a token) before "
     "AUTH; authenticated ones never compete with them.", int),
    ("auth_timeout", "Seconds an unauthenticated connection has to authenticate.", float),
    ("tls_handshake_timeout", "Seconds a TLS handshake may take.", float),
    ("max_in_flight", "Requests running at once per connection.", int),
    ("max_entries_in_flight", "Entries in requests running at once per connection (an "
     "ADD_BATCH counts its entries): past it the bookie stops reading the connection.", int),
    ("bookie_entries_in_flight", "Entries in flight over all connections (past it: each "
     "connection gets a fair share).", int),
    ("max_queued_bytes", "Bytes of requests read ahead of them (the bookie keeps reading "
     "to notice a peer that closes).", ByteSize()),
    ("connection_budget", "Bytes in flight per connection: add bodies being stored and "
     "answers the peer has not taken yet.", ByteSize()),
    ("bookie_budget", "Bytes in flight over all connections.", ByteSize()),
    ("max_frame", "Largest frame (request) accepted.", ByteSize()),
    ("long_poll_max_timeout", "Seconds a long poll waits at most, whatever it asks.", float),
    ("max_long_polls", "Long polls waiting at once (beyond: answered at once).", int),
    ("fd_reserve", "File descriptors kept for the bookie's own files.", int),
    ("keepalive", "TCP keepalive: seconds of silence before probing a peer (0: off).", float),
    ("idle_timeout", "Seconds before a quiet connection is closed.", float),
    ("frame_timeout", "Seconds a frame may take to arrive whole (slowloris).", float),
    ("write_timeout", "Seconds a peer may go without taking any of our answers.", float),
    ("log_interval", "Seconds between warnings about refused connections or failing "
     "accepts (they are counted in between).", float),
]


def server_limit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add one option per limit; the command receives them as keyword arguments named like
    the fields (pass them to :func:`server_config_from`)."""
    defaults = ServerConfig()
    for name, text, kind in reversed(_LIMITS):
        default = getattr(defaults, name)
        fn = click.option(
            "--" + name.replace("_", "-"), name, type=kind,
            default=_size_text(default) if isinstance(kind, ByteSize) else default,
            show_default=True, help=text,
        )(fn)
    return fn


def _size_text(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def server_config_from(options: dict[str, Any], **extra: Any) -> ServerConfig:
    """A ServerConfig from the options' values (and ``extra`` fields, e.g. stop_grace);
    click.BadParameter naming the option when a value is out of range."""
    values = {name: options[name] for name, _, _ in _LIMITS if name in options}
    try:
        return ServerConfig(**values, **extra)
    except ValueError as exc:
        field = next((f.name for f in dataclasses.fields(ServerConfig)
                      if f"ServerConfig.{f.name} " in str(exc)), None)
        hint = "--" + field.replace("_", "-") if field else None
        raise click.BadParameter(str(exc), param_hint=hint) from None
