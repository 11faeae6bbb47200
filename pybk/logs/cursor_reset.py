"""Moving a durable cursor from outside its consumer (Pulsar's ``resetCursor``): every record
before a position counts as consumed, and the next consumer resumes there.

What a consumer that keeps its position elsewhere needs (a Spark query keeps it in its
checkpoint and records it here at each commit, so retention by consumption and backlog quotas
see how far it got). The reset takes the cursor over as a new consumer does (its epoch goes
up, so the consumer holding it is fenced at its next record update), stores the new state in
the record itself, then fences and deletes the ledger the old owner acknowledged into.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pybk.errors import CursorNotFoundError, KeyExistsError, NoSuchKeyError
from pybk.logs.cursor import check_cursor_name, retire_ledger
from pybk.logs.cursor_meta import CursorRecord, cursor_key
from pybk.logs.cursor_state import AckState, encode_state
from pybk.logs.position import Position

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog
    from pybk.metadata.base import VersionedValue

__all__ = ["reset_cursor"]


async def reset_cursor(cat: LogCatalog, name: str, position: Position, *,
                       create: bool = False, owner: str = "reset") -> None:
    """Records before ``position`` are consumed by cursor ``name``, and it resumes at
    ``position``; CursorNotFoundError when there is no such cursor, unless ``create``."""
    if not isinstance(position, Position):
        raise TypeError(f"position must be a Position, not {type(position).__name__}")
    key = cursor_key(cat.namespace, cat.name, check_cursor_name(name))
    state = encode_state(AckState(start=position))
    if create:
        try:
            await cat.store.create_value(key, CursorRecord(
                name, ctime_ms=cat.now_ms(), start=position, state=state).to_bytes())
            return
        except KeyExistsError:
            pass
    old: list[int] = []

    def apply(value: VersionedValue) -> bytes:
        record = CursorRecord.from_bytes(value.value, value.version)
        old[:] = [record.ledger]
        return record.with_changes(epoch=record.epoch + 1, owner=owner, ledger=-1,
                                   state=state, mark_delete=None, start=position).to_bytes()

    try:
        await cat.store.update_value(key, apply)
    except NoSuchKeyError:
        raise CursorNotFoundError(f"log {cat.name!r} has no cursor {name!r}") from None
    if old and old[0] >= 0:
        await retire_ledger(cat, old[0])  # its owner is fenced
