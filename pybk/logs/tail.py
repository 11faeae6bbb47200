"""Read-your-writes: the live writers of this process, and the log's last position.

A log's readers learn of acknowledged entries from the bookies' LAC, which lags one entry and,
for an idle writer, arrives only with the explicit LAC (``ClientConfig.explicit_lac_interval``).
A reader (or ``Log.last_position``) in the client that holds the log's live writer need not
wait: the writer registers here, per client and log, and what it knows acknowledged (on Qa
bookies) may be read at once, beyond the LAC.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING

from pybk.errors import NoSuchLedgerError
from pybk.logs import envelope
from pybk.logs.position import Position, make_position

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog
    from pybk.logs.writer import LogWriter

__all__ = ["last_position", "live_writer", "register_writer", "unregister_writer"]

#: client -> log key -> its live writer in this process
_LIVE: weakref.WeakKeyDictionary[object, dict[str, LogWriter]] = weakref.WeakKeyDictionary()


def register_writer(cat: LogCatalog, writer: LogWriter) -> None:
    _LIVE.setdefault(cat.client, {})[cat.key] = writer


def unregister_writer(cat: LogCatalog, writer: object) -> None:
    """Forget ``writer`` as the log's live writer (if it still is: compared by identity)."""
    per = _LIVE.get(cat.client)
    if per is not None and per.get(cat.key) is writer:
        del per[cat.key]


def live_writer(cat: LogCatalog) -> LogWriter | None:
    """This client's healthy writer of the log on the running loop, if any."""
    per = _LIVE.get(cat.client)
    w = per.get(cat.key) if per is not None else None
    if w is None or w.error is not None or not w.same_loop(asyncio.get_running_loop()):
        return None
    return w


async def last_position(cat: LogCatalog) -> Position | None:
    """The log's last acknowledged record (None when it holds none): the live writer's own
    view when this client holds it, else the metadata and the in-progress segment's LAC."""
    md = await cat.read()
    tb = md.truncated_before
    w = live_writer(cat)
    if w is not None and w.epoch == md.epoch and w.last_position is not None:
        pos = w.last_position
        return None if tb is not None and pos < tb else pos
    tail = md.segments[-1] if md.segments else None
    if tail is not None and tail.in_progress:
        try:
            rh = await cat.client.open_ledger(tail.ledger_id, recovery=False)
        except NoSuchLedgerError:
            rh = None
        if rh is not None:
            try:
                lac = rh.last_add_confirmed
                if lac >= 0:
                    (entry,) = await rh.read(lac, lac)
                    header = envelope.decode_header(entry.data)
                    pos = make_position(tail.seq, lac, header.count - 1)
                    return None if tb is not None and pos < tb else pos
            finally:
                await rh.close()
    return md.last_position()
