"""A durable cursor's metadata record, and reading every cursor of a log.

One value per cursor in the metadata store's key/value namespace, at
``logcursors/<namespace>/<log>/<cursor>`` (beside the logs, not under a log's own key, so a
log's value never has children): ``b"PYBKCUR"`` + header (format u16 = 1, CRC32C u32, length
u32) + JSON::

    {"name", "ctime_ms", "epoch": the owner lock (each subscriber that opens it takes +1),
     "owner": a label, "ledger": the cursor ledger's id (-1: none yet),
     "state": the encoded AckState (hex) as of the last owner change or ledger roll,
     "mark_delete": [segment, entry, slot] or null (a lower bound of the real one, kept
     fresh enough for retention), "start": [segment, entry, slot] or null}

The authoritative state is the last entry of the cursor ledger (Pulsar's cursor ledger with
``ManagedCursorInfo`` pointing at it); the record holds the state it started from, so a
ledger without entries still says where the cursor is.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import crc32c

from pybk.errors import BKError, CorruptRecordError, NoSuchKeyError, NoSuchLedgerError
from pybk.logs.cursor_state import AckState, decode_state
from pybk.logs.position import Position

if TYPE_CHECKING:
    from pybk.logs.catalog import LogCatalog

__all__ = ["CursorRecord", "cursor_key", "cursor_prefix", "read_cursor_states"]

_MAGIC: Final = b"PYBKCUR"
_HDR = struct.Struct(">HII")


def cursor_prefix(namespace: str, log: str) -> str:
    return f"logcursors/{namespace}/{log}/"


def cursor_key(namespace: str, log: str, name: str) -> str:
    return cursor_prefix(namespace, log) + name


def _pos(doc: Any) -> Position | None:
    return None if doc is None else Position(*(int(x) for x in doc))


@dataclass(frozen=True)
class CursorRecord:
    """What the metadata store holds for one cursor (see the module doc)."""

    name: str
    ctime_ms: int = 0
    epoch: int = 0
    owner: str = ""
    ledger: int = -1
    state: bytes = b""
    mark_delete: Position | None = None
    start: Position | None = None
    version: int = -1

    def with_changes(self, **changes: Any) -> CursorRecord:
        return replace(self, **changes)

    def to_bytes(self) -> bytes:
        doc = {
            "name": self.name, "ctime_ms": self.ctime_ms, "epoch": self.epoch,
            "owner": self.owner, "ledger": self.ledger, "state": self.state.hex(),
            "mark_delete": None if self.mark_delete is None else list(self.mark_delete),
            "start": None if self.start is None else list(self.start),
        }  # fmt: skip
        payload = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        return _MAGIC + _HDR.pack(1, crc32c.crc32c(payload), len(payload)) + payload

    @classmethod
    def from_bytes(cls, data: bytes, version: int = -1) -> CursorRecord:
        if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _HDR.size:
            raise CorruptRecordError("cursor record: bad magic")
        fmt, crc, length = _HDR.unpack_from(data, len(_MAGIC))
        payload = data[len(_MAGIC) + _HDR.size:]
        if fmt != 1 or len(payload) != length or crc32c.crc32c(payload) != crc:
            raise CorruptRecordError("cursor record: bad format or checksum")
        try:
            doc = json.loads(payload)
            return cls(name=str(doc["name"]), ctime_ms=int(doc["ctime_ms"]),
                       epoch=int(doc["epoch"]), owner=str(doc["owner"]),
                       ledger=int(doc["ledger"]), state=bytes.fromhex(doc["state"]),
                       mark_delete=_pos(doc["mark_delete"]), start=_pos(doc["start"]),
                       version=version)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(f"cursor record: malformed ({exc})") from exc

    def stored_state(self) -> AckState:
        """The state the record carries (a fresh cursor's: nothing acknowledged)."""
        if self.state:
            return decode_state(self.state)
        return AckState(mark_delete=self.mark_delete, start=self.start)


async def last_state(cat: LogCatalog, record: CursorRecord) -> AckState:
    """The cursor's latest state without disturbing its owner: the last entry its ledger's
    bookies hold (the LAC lags one entry), else the last confirmed one, else the record's."""
    if record.ledger >= 0:
        try:
            rh = await cat.client.open_ledger(record.ledger, recovery=False)
        except NoSuchLedgerError:
            return record.stored_state()
        try:
            lac = rh.last_add_confirmed
            last = max(lac, await rh.read_last_entry_id_unconfirmed())
            for eid in dict.fromkeys((last, lac)):
                if eid < 0:
                    continue
                try:
                    (entry,) = await rh.read_unconfirmed(eid, eid)
                except BKError:
                    continue
                return decode_state(entry.data)
        finally:
            await rh.close()
    return record.stored_state()


async def read_cursor_states(cat: LogCatalog) -> dict[str, AckState]:
    """Every cursor of the log: name -> its latest state (see :func:`last_state`)."""
    prefix = cursor_prefix(cat.namespace, cat.name)
    out: dict[str, AckState] = {}
    for key in await cat.store.list_keys(prefix):
        name = key[len(prefix):]
        if "/" in name:
            continue
        try:
            value = await cat.store.read_value(key)
        except NoSuchKeyError:
            continue  # deleted meanwhile
        out[name] = await last_state(cat, CursorRecord.from_bytes(value.value, value.version))
    return out
