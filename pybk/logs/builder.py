"""Building segments away from the log: records packed into ledgers of their own, which no
reader sees until :mod:`pybk.logs.publish` adds them to the log, all at once.

Why: a bulk writer (a Spark task, a batch import) must be able to write a lot and then either
make all of it visible in one step or throw all of it away, and several such writers must be
able to work in parallel on one log. A log's single writer cannot do that; ledgers that are
not yet segments can. A :class:`SegmentBuilder` writes envelopes (the log's entry format, with
optional record keys) into ledgers made with the log's ensemble, quorums, digest and codec,
rolls to a new ledger at the log's ``roll_bytes`` / ``roll_entries``, and on :meth:`finish`
closes them and describes each as a :class:`BuiltSegment` for the publisher. Nothing here
touches the log's metadata record.

Appends are pipelined: up to ``max_pending_bytes`` of envelopes are in flight at once; an
envelope is acknowledged by Qa bookies as the ledger's own entries are. A failed append fails
the builder: every later call raises that error, and :meth:`abort` deletes what it made.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pybk.errors import BKError, NoSuchLedgerError, RecordTooLargeError, fresh_copy
from pybk.logs import envelope
from pybk.logs.config import LogConfig

if TYPE_CHECKING:
    from pybk.client import Client
    from pybk.client.writer import LedgerHandle

__all__ = ["BuiltSegment", "SegmentBuilder"]

log = logging.getLogger(__name__)

#: makes the builder's next ledger, given the custom metadata to tag it with
LedgerFactory = Callable[[Mapping[str, bytes]], Awaitable["LedgerHandle"]]


@dataclass(frozen=True)
class BuiltSegment:
    """A closed ledger holding records in the log's format, ready to be published: its last
    entry and the last record's slot there, its record count and its length in bytes."""

    ledger_id: int
    last_entry: int
    last_slot: int
    records: int
    bytes: int

    def to_doc(self) -> dict[str, int]:
        return {"ledger": self.ledger_id, "last_entry": self.last_entry,
                "last_slot": self.last_slot, "records": self.records, "bytes": self.bytes}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> BuiltSegment:
        return cls(int(doc["ledger"]), int(doc["last_entry"]), int(doc["last_slot"]),
                   int(doc["records"]), int(doc["bytes"]))


class SegmentBuilder:
    """Writes records into fresh ledgers for one log (see the module doc).

    ``log_key`` is the log's metadata key (every ledger is tagged ``pybk.log = log_key``, as a
    writer's are, plus ``custom_metadata``); ``config`` the log's :class:`LogConfig`.
    ``create_ledger`` replaces how a ledger is made (e.g. to record its id somewhere before it
    exists); it gets the custom metadata and must use the config's quorums and digest.
    """

    def __init__(
        self,
        client: Client,
        log_key: str,
        config: LogConfig,
        *,
        flush_bytes: int = 1 << 20,
        flush_records: int = 100_000,
        max_envelope_bytes: int = 4 << 20,
        max_pending_bytes: int = 64 << 20,
        custom_metadata: Mapping[str, bytes] | None = None,
        create_ledger: LedgerFactory | None = None,
    ) -> None:
        for name, value in (("flush_bytes", flush_bytes), ("flush_records", flush_records),
                            ("max_envelope_bytes", max_envelope_bytes),
                            ("max_pending_bytes", max_pending_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be an int > 0, got {value!r}")
        if max_envelope_bytes > envelope.MAX_RAW_SIZE:
            raise ValueError(f"max_envelope_bytes must be <= {envelope.MAX_RAW_SIZE}, got "
                             f"{max_envelope_bytes}")
        self._client = client
        self._key = log_key
        self._config = config
        self._codec = config.codec
        self._compressor = envelope.make_compressor(self._codec)
        self._flush_bytes = min(flush_bytes, max_envelope_bytes - envelope.HEADER_SIZE)
        self._flush_records = flush_records
        self._room = max_envelope_bytes - envelope.HEADER_SIZE
        self._max_pending = max_pending_bytes
        self._custom = {"pybk.log": log_key.encode(), **dict(custom_metadata or {})}
        self._factory = create_ledger
        self._lh: LedgerHandle | None = None
        self._seg_records = 0
        self._seg_entries = 0
        self._seg_bytes = 0
        self._last_count = 0
        self._pending: deque[tuple[asyncio.Future[int], int]] = deque()
        self._pending_bytes = 0
        self._done: list[BuiltSegment] = []
        self._made: list[int] = []  # every ledger made, in order
        self._error: BaseException | None = None
        self._finished = False
        #: what was written: entries (envelopes), records, raw bytes, bytes stored
        self.stats = {"entries": 0, "records": 0, "raw_bytes": 0, "stored_bytes": 0}

    @property
    def ledger_ids(self) -> list[int]:
        """Every ledger this builder made so far (published or not, in order)."""
        return list(self._made)

    # -- writing -----------------------------------------------------------------------------

    async def append_many(
        self, records: Sequence[bytes], keys: Sequence[bytes | None] | None = None
    ) -> None:
        """Add records (and their keys, None for none), packed into envelopes of up to
        ``flush_bytes`` / ``flush_records``. Returns once they are sent (not acknowledged:
        :meth:`finish` waits for that)."""
        items = list(records)
        for i, item in enumerate(items):
            if not isinstance(item, bytes):
                raise TypeError(f"append_many() takes bytes, record {i} is "
                                f"{type(item).__name__}")
        key_list = None if keys is None else list(keys)
        if key_list is not None:
            if len(key_list) != len(items):
                raise ValueError(f"{len(items)} records but {len(key_list)} keys")
            for i, k in enumerate(key_list):
                if k is not None and not isinstance(k, bytes):
                    raise TypeError(f"keys are bytes or None, key {i} is {type(k).__name__}")
            if all(k is None for k in key_list):
                key_list = None
        per = envelope.PER_RECORD_OVERHEAD + (0 if key_list is None else envelope.KEY_OVERHEAD)
        for i, item in enumerate(items):
            size = len(item) + per + (len(key_list[i] or b"") if key_list is not None else 0)
            if size > self._room:
                raise RecordTooLargeError(
                    f"record {i} ({size} bytes with its key and framing) does not fit an "
                    f"envelope of at most {self._room} bytes"
                )
        start = 0
        raw = 0
        for i, item in enumerate(items):
            size = len(item) + per + (len(key_list[i] or b"") if key_list is not None else 0)
            if i > start and (raw + size > self._flush_bytes
                              or i - start >= self._flush_records):
                await self._add_list(items[start:i],
                                     None if key_list is None else key_list[start:i])
                start, raw = i, 0
            raw += size
        if start < len(items):
            await self._add_list(items[start:], None if key_list is None else key_list[start:])

    async def _add_list(self, records: list[bytes], keys: list[bytes | None] | None) -> None:
        lengths = array("I", map(len, records))
        key_lengths = key_data = None
        if keys is not None:
            key_lengths = _le(array("i", (-1 if k is None else len(k) for k in keys)))
            key_data = b"".join(k for k in keys if k is not None)
        await self.add_packed(len(records), _le(lengths), b"".join(records),
                              key_lengths=key_lengths, key_data=key_data)

    async def add_packed(
        self,
        count: int,
        lengths: bytes | memoryview,
        data: bytes | memoryview,
        *,
        key_lengths: bytes | memoryview | None = None,
        key_data: bytes | memoryview | None = None,
    ) -> None:
        """Add one envelope of ``count`` records already packed (see
        :func:`pybk.logs.envelope.encode_packed`): the caller splits its records into
        envelopes (``flush_bytes`` is a good size). The sizes are checked: lengths that do not
        add up to ``data`` are a ValueError, an envelope above the limit RecordTooLargeError;
        nothing is sent then."""
        self._check_open()
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        if len(lengths) != 4 * count:
            raise ValueError(f"{count} records need {4 * count} bytes of lengths, got "
                             f"{len(lengths)}")
        lens = array("I")
        lens.frombytes(bytes(lengths))
        if _SWAP:
            lens.byteswap()
        if sum(lens) != len(data):
            raise ValueError(f"the lengths add up to {sum(lens)} bytes, the data holds "
                             f"{len(data)}")
        raw = len(lengths) + len(data)
        if key_lengths is not None:
            if len(key_lengths) != 4 * count:
                raise ValueError(f"{count} records need {4 * count} bytes of key lengths, got "
                                 f"{len(key_lengths)}")
            klens = array("i")
            klens.frombytes(bytes(key_lengths))
            if _SWAP:
                klens.byteswap()
            kd = len(key_data) if key_data is not None else 0
            if min(klens) < -1 or sum(k for k in klens if k > 0) != kd:
                raise ValueError("the key lengths do not add up to the key data")
            raw += len(key_lengths) + kd
        if raw > self._room:
            raise RecordTooLargeError(
                f"an envelope of {raw} bytes is larger than max_envelope_bytes allows "
                f"({self._room} after its header)"
            )
        if self._lh is None:
            self._lh = await self._new_ledger()
        data_out = envelope.encode_packed(
            count, lengths, data, self._seg_records, -1, self._codec, self._compressor,
            key_lengths=key_lengths, key_data=key_data,
        )
        while self._pending and self._pending_bytes + len(data_out) > self._max_pending:
            await self._settle_one()
        self._check_open()
        lh = self._lh
        try:
            fut = lh.append(data_out)
        except BaseException as exc:
            self._error = exc
            raise
        self._pending.append((fut, len(data_out)))
        self._pending_bytes += len(data_out)
        self._seg_records += count
        self._seg_entries += 1
        self._seg_bytes += len(data_out)
        self._last_count = count
        st = self.stats
        st["entries"] += 1
        st["records"] += count
        st["raw_bytes"] += raw
        st["stored_bytes"] += len(data_out)
        cfg = self._config
        if (cfg.roll_bytes is not None and self._seg_bytes >= cfg.roll_bytes) or (
                cfg.roll_entries is not None and self._seg_entries >= cfg.roll_entries):
            await self._close_current()

    async def _new_ledger(self) -> LedgerHandle:
        cfg = self._config
        if self._factory is not None:
            lh = await self._factory(dict(self._custom))
        else:
            lh = await self._client.create_ledger(
                cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum, cfg.digest_type, b"",
                custom_metadata=self._custom,
            )
        self._made.append(lh.id)
        self._seg_records = self._seg_entries = self._seg_bytes = self._last_count = 0
        return lh

    async def _settle_one(self) -> None:
        fut, size = self._pending.popleft()
        self._pending_bytes -= size
        try:
            await fut
        except BaseException as exc:
            if self._error is None:
                self._error = exc
            raise

    async def _settle_all(self) -> None:
        while self._pending:
            await self._settle_one()

    async def _close_current(self) -> None:
        lh, self._lh = self._lh, None
        if lh is None:
            return
        await self._settle_all()
        await lh.close()
        if lh.last_add_confirmed >= 0:
            self._done.append(BuiltSegment(lh.id, lh.last_add_confirmed, self._last_count - 1,
                                           self._seg_records, lh.length))

    def _check_open(self) -> None:
        if self._error is not None:
            raise fresh_copy(self._error)
        if self._finished:
            raise RuntimeError("this segment builder is finished")

    # -- the end -----------------------------------------------------------------------------

    async def finish(self) -> list[BuiltSegment]:
        """Wait for every envelope, close the last ledger and describe every ledger written
        (in order). An empty ledger is deleted, not described."""
        self._check_open()
        try:
            await self._close_current()
        except BaseException as exc:
            if self._error is None:
                self._error = exc
            raise
        self._finished = True
        named = {b.ledger_id for b in self._done}
        for lid in self._made:
            if lid not in named:  # made but never written (an empty roll)
                failure = await _delete(self._client, lid)
                if failure is not None:
                    raise failure
        return list(self._done)

    async def abort(self) -> None:
        """Delete every ledger this builder made (nothing of it was published). Entries still
        in flight are left to fail or succeed on a ledger that is gone."""
        self._finished = True
        if self._error is None:
            self._error = RuntimeError("this segment builder was aborted")
        for fut, _ in self._pending:
            fut.add_done_callback(_retrieve)
        self._pending.clear()
        self._lh = None
        failed: list[BaseException] = []
        for lid in self._made:
            exc = await _delete(self._client, lid)
            if exc is not None:
                failed.append(exc)
        if failed:
            raise failed[0]


_SWAP = array("I", [1]).tobytes()[0] != 1


def _le(values: array[int]) -> bytes:
    if _SWAP:
        values.byteswap()
    return values.tobytes()


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


async def _delete(client: Client, ledger_id: int) -> BKError | None:
    """Delete one ledger (one already gone is fine); the error when it could not be."""
    try:
        await client.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass
    except BKError as exc:
        log.warning("could not delete unpublished ledger %d: %s", ledger_id, exc)
        return exc
    return None
