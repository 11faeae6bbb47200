"""Shared consumption of one cursor by several consumers in one process (Pulsar's shared
subscription, the process that owns the cursor playing the broker's part).

``c = cursor.consumer()`` gives a handle; each record the cursor hands out goes to exactly one
consumer (whichever asks first, in turn), so workers process a log in parallel while one
cursor remembers what all of them acknowledged. A consumer keeps the positions it received
and has not settled; when it closes (or its worker fails and closes it), those go back to the
cursor and are handed out again at once, to the others. As in Pulsar's shared subscriptions,
there is no cumulative acknowledgement: records are processed out of order.

Across processes a cursor has one owner (``subscribe`` takes it over, fencing the previous
one); workers in other processes share it through that owner.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybk.logs.position import LogRecord, Position

if TYPE_CHECKING:
    from pybk.logs.cursor import Cursor

__all__ = ["CursorConsumer"]


class CursorConsumer:
    """One consumer of a shared cursor (make it with :meth:`pybk.logs.Cursor.consumer`)."""

    def __init__(self, cursor: Cursor, name: str) -> None:
        self.cursor = cursor
        self.name = name
        self._held: set[Position] = set()  # received, not yet acknowledged nor handed back
        self._closed = False

    async def receive(self) -> LogRecord | None:
        """The next record for this consumer (see :meth:`pybk.logs.Cursor.receive`); None
        once the log is ended and the cursor has nothing left to hand out."""
        self._check()
        rec = await self.cursor.receive()
        if rec is not None:
            if self._closed:  # (closed while it waited: the record goes to the others)
                self.cursor.nack(rec.position, 0.0)
                raise ValueError(f"consumer {self.name!r} is closed")
            self._held.add(rec.position)
        return rec

    def __aiter__(self) -> CursorConsumer:
        return self

    async def __anext__(self) -> LogRecord:
        rec = await self.receive()
        if rec is None:
            raise StopAsyncIteration
        return rec

    async def ack(self, position: Position | LogRecord) -> None:
        """Acknowledge a record this consumer received; returns once durable. ValueError for
        one it did not receive (or already handed back)."""
        self._check()
        pos = self._position(position)
        if pos not in self._held:
            raise ValueError(f"consumer {self.name!r} did not receive {pos}")
        await self.cursor.ack(pos)
        self._held.discard(pos)

    def nack(self, position: Position | LogRecord, delay: float | None = None) -> None:
        """Hand a record this consumer received back to the cursor, for any consumer after
        ``delay`` (default the cursor's ``redelivery_delay``)."""
        self._check()
        pos = self._position(position)
        if pos not in self._held:
            raise ValueError(f"consumer {self.name!r} did not receive {pos}")
        self._held.discard(pos)
        self.cursor.nack(pos, delay)

    def pending(self) -> list[Position]:
        """What this consumer received and has not settled, in log order."""
        return sorted(self._held)

    def close(self) -> None:
        """Stop consuming: what this consumer holds is handed out again at once (to the
        other consumers). Idempotent; the cursor stays open."""
        if self._closed:
            return
        self._closed = True
        held, self._held = sorted(self._held), set()
        for pos in held:
            try:
                self.cursor.nack(pos, 0.0)
            except ValueError:
                return  # (the cursor itself closed: its next owner redelivers them)

    async def __aenter__(self) -> CursorConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed:
            raise ValueError(f"consumer {self.name!r} is closed")

    def _position(self, position: Position | LogRecord) -> Position:
        return position.position if isinstance(position, LogRecord) else position

    def __repr__(self) -> str:
        return f"<CursorConsumer {self.name} holding {len(self._held)}>"
