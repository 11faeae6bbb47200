"""A log segment's objects in tiered storage (any fsspec filesystem: ``file://``, ``s3://``,
...): their names, their format, writing, verifying, reading and deleting them.

Two objects per offload attempt, under ``<url>/<namespace>/<log>/``:

* ``<seq>-<ledger>-<uid>.data``: the segment's ledger entries one after the other, each
  framed ``[length u32][entry id i64][payload]`` (big-endian), the payload exactly the
  ledger entry (the log's envelope, with its own CRC);
* ``<seq>-<ledger>-<uid>.index``: ``b"PYBKIDX"`` + CRC32C u32 of the JSON + the JSON:
  ``{"format": 1, "namespace", "log", "seq", "ledger", "last_entry", "ledger_length",
  "data_length", "data_crc32c", "offsets": base64 of one u64 per entry (its frame's
  offset), "ledger_metadata": {ensemble size, quorums, digest, ensembles}}``.

The index is written only after the data object is complete, and an offload counts only
once the index parses, names the same segment and the data object's length and CRC32C match
it: a half-written upload (no index, a short data object, a torn index) is never taken for a
complete one. Calls are blocking fsspec calls; :mod:`pybk.logs.offload` runs them in a
worker thread, off the event loop.
"""

from __future__ import annotations

import base64
import datetime
import json
import math
import struct
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import crc32c

from pybk.errors import CorruptRecordError

__all__ = ["FRAME", "SegmentIndex", "TierStore", "attempt_base", "frame_entries"]

FRAME: Final = struct.Struct(">Iq")
_IDX_MAGIC: Final = b"PYBKIDX"
_CRC = struct.Struct(">I")
_VERIFY_CHUNK: Final = 8 << 20
#: a sweep lists at most this many pages of a log's unfinished uploads (1,000 per page)
_MAX_UPLOAD_PAGES: Final = 100


@dataclass(frozen=True)
class SegmentIndex:
    """The parsed index object of one offloaded segment."""

    namespace: str
    log: str
    seq: int
    ledger: int
    last_entry: int
    ledger_length: int
    data_length: int
    data_crc32c: int
    offsets: array  # type: ignore[type-arg]
    ledger_metadata: dict[str, Any]

    def span(self, first: int, last: int) -> tuple[int, int]:
        """Byte range [start, end) of entries ``first..last`` in the data object."""
        end = self.offsets[last + 1] if last + 1 < len(self.offsets) else self.data_length
        return self.offsets[first], end

    def to_bytes(self) -> bytes:
        offsets = array("Q", self.offsets)
        offsets.byteswap()  # stored big-endian
        doc = {
            "format": 1, "namespace": self.namespace, "log": self.log, "seq": self.seq,
            "ledger": self.ledger, "last_entry": self.last_entry,
            "ledger_length": self.ledger_length, "data_length": self.data_length,
            "data_crc32c": self.data_crc32c,
            "offsets": base64.b64encode(offsets.tobytes()).decode(),
            "ledger_metadata": self.ledger_metadata,
        }  # fmt: skip
        payload = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return _IDX_MAGIC + _CRC.pack(crc32c.crc32c(payload)) + payload

    @classmethod
    def from_bytes(cls, data: bytes) -> SegmentIndex:
        head = len(_IDX_MAGIC) + _CRC.size
        if not data.startswith(_IDX_MAGIC) or len(data) < head:
            raise CorruptRecordError("offload index: bad magic")
        (crc,) = _CRC.unpack_from(data, len(_IDX_MAGIC))
        payload = data[head:]
        if crc32c.crc32c(payload) != crc:
            raise CorruptRecordError("offload index: checksum mismatch (torn or damaged)")
        try:
            doc = json.loads(payload)
            if doc["format"] != 1:
                raise CorruptRecordError(f"offload index: unknown format {doc['format']}")
            offsets = array("Q")
            offsets.frombytes(base64.b64decode(doc["offsets"]))
            offsets.byteswap()
            idx = cls(namespace=str(doc["namespace"]), log=str(doc["log"]), seq=int(doc["seq"]),
                      ledger=int(doc["ledger"]), last_entry=int(doc["last_entry"]),
                      ledger_length=int(doc["ledger_length"]),
                      data_length=int(doc["data_length"]),
                      data_crc32c=int(doc["data_crc32c"]), offsets=offsets,
                      ledger_metadata=dict(doc["ledger_metadata"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(f"offload index: malformed ({exc})") from exc
        if len(idx.offsets) != idx.last_entry + 1:
            raise CorruptRecordError("offload index: offsets do not match the entry count")
        return idx


def attempt_base(name: str) -> str | None:
    """The attempt an object belongs to (its name without ``.data``/``.index``); None for
    a name that is not an offload object."""
    for suffix in (".data", ".index"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


#: the fields fsspec filesystems date an object by (local and memory, s3fs, gcsfs...)
_TIME_FIELDS: Final = ("mtime", "LastModified", "last_modified", "updated", "created")


def _seconds(value: object) -> float | None:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return _seconds(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def frame_entries(entries: Iterable[tuple[int, bytes]]) -> list[bytes]:
    """The data object's frames of ``(entry id, payload)`` pairs."""
    out: list[bytes] = []
    for eid, payload in entries:
        out.append(FRAME.pack(len(payload), eid))
        out.append(payload)
    return out


def parse_frames(buf: bytes, first: int, last: int) -> list[tuple[int, bytes]]:
    """Entries ``first..last`` from ``buf`` (which starts at entry ``first``'s frame)."""
    out: list[tuple[int, bytes]] = []
    off = 0
    for expect in range(first, last + 1):
        if off + FRAME.size > len(buf):
            raise CorruptRecordError(f"offloaded data: entry {expect} is cut short")
        length, eid = FRAME.unpack_from(buf, off)
        off += FRAME.size
        if eid != expect or off + length > len(buf):
            raise CorruptRecordError(
                f"offloaded data: expected entry {expect}, found {eid} (length {length})")
        out.append((eid, buf[off:off + length]))
        off += length
    return out


class TierStore:
    """One tier URL (``file:///...``, ``s3://bucket/prefix``) through fsspec."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        try:
            import fsspec
        except ImportError as exc:  # the optional extra
            raise ImportError("tiered storage needs fsspec (pip install 'pybk[tiered]')") from exc
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **(options or {}))

    def base(self, namespace: str, log: str, seq: int, ledger: int, uid: str) -> str:
        return f"{self.root}/{namespace}/{log}/{seq}-{ledger}-{uid}"

    def write_data(self, path: str, chunks: Iterable[list[bytes]]) -> tuple[int, int]:
        """Write the data object from chunks of frames; its (length, CRC32C)."""
        crc, length = 0, 0
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        with self.fs.open(path + ".data", "wb") as f:
            for frames in chunks:
                for part in frames:
                    f.write(part)
                    crc = crc32c.crc32c(part, crc)
                    length += len(part)
        return length, crc

    def write_index(self, path: str, index: SegmentIndex) -> None:
        with self.fs.open(path + ".index", "wb") as f:
            f.write(index.to_bytes())

    def read_index(self, path: str) -> SegmentIndex:
        return SegmentIndex.from_bytes(self.fs.cat_file(path + ".index"))

    def verify(self, path: str, seq: int, ledger: int) -> SegmentIndex:
        """The index, once the data object matches it (CorruptRecordError otherwise)."""
        idx = self.read_index(path)
        if idx.seq != seq or idx.ledger != ledger:
            raise CorruptRecordError(f"offload {path}: index names segment {idx.seq} "
                                     f"ledger {idx.ledger}")
        size = self.fs.size(path + ".data")
        if size != idx.data_length:
            raise CorruptRecordError(f"offload {path}: data object has {size} bytes, the "
                                     f"index says {idx.data_length}")
        crc, off = 0, 0
        while off < size:
            chunk = self.fs.cat_file(path + ".data", start=off,
                                     end=min(size, off + _VERIFY_CHUNK))
            crc = crc32c.crc32c(chunk, crc)
            off += len(chunk)
            if not chunk:
                break
        if crc != idx.data_crc32c:
            raise CorruptRecordError(f"offload {path}: data object checksum mismatch")
        return idx

    def read_range(self, path: str, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(path + ".data", start=start, end=end))

    def delete(self, path: str) -> None:
        """Delete both objects of one attempt (those that exist)."""
        for suffix in (".index", ".data"):
            try:
                self.fs.rm_file(path + suffix)
            except FileNotFoundError:
                pass

    def list_segments(self, namespace: str, log: str) -> list[str]:
        """The object bases (path without suffix) under a log's folder."""
        folder = f"{self.root}/{namespace}/{log}"
        try:
            names = self.fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        bases = {str(n).rsplit(".", 1)[0] for n in names
                 if str(n).endswith((".data", ".index"))}
        return sorted(bases)

    def list_objects(self, namespace: str, log: str) -> list[tuple[str, float]]:
        """Every offload object under a log's folder (``.data``/``.index``, whole or not),
        with when it was last modified (seconds since the epoch, by the store's clock; +inf
        when the filesystem does not say: such an object never looks old)."""
        folder = f"{self.root}/{namespace}/{log}"
        try:
            infos = self.fs.ls(folder, detail=True)
        except FileNotFoundError:
            return []
        out: list[tuple[str, float]] = []
        for info in infos:
            name = str(info["name"])
            if info.get("type", "file") != "file" or attempt_base(name) is None:
                continue
            out.append((name, self._mtime(name, info)))
        return sorted(out)

    def list_uploads(self, namespace: str, log: str) -> list[tuple[str, str, float]]:
        """Multipart uploads begun under a log's folder and never completed nor aborted (an
        offload whose process died mid-upload on S3: no listing of objects shows them, and
        the store keeps their parts until they are aborted): (object name, upload id, when
        begun, +inf when the store does not say). Empty where the filesystem has none."""
        call = getattr(self.fs, "call_s3", None)
        if call is None:  # (only S3-like stores keep uploads apart from objects)
            return []
        bucket, _, prefix = f"{self.root}/{namespace}/{log}/".partition("/")
        out: list[tuple[str, str, float]] = []
        args: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        for _ in range(_MAX_UPLOAD_PAGES):
            page = call("list_multipart_uploads", **args)
            for up in page.get("Uploads") or ():
                name = f"{bucket}/{up['Key']}"
                if attempt_base(name) is not None:
                    when = _seconds(up.get("Initiated"))
                    out.append((name, str(up["UploadId"]),
                                when if when is not None else math.inf))
            if not page.get("IsTruncated"):
                break
            args.update(KeyMarker=page.get("NextKeyMarker", ""),
                        UploadIdMarker=page.get("NextUploadIdMarker", ""))
        return sorted(out)

    def abort_upload(self, name: str, upload_id: str) -> None:
        """Abort one multipart upload (its parts freed); one already gone is no error."""
        bucket, _, key = name.partition("/")
        try:
            self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key,
                            UploadId=upload_id)
        except FileNotFoundError:
            pass

    def _mtime(self, name: str, info: Mapping[str, Any]) -> float:
        for key in _TIME_FIELDS:
            when = _seconds(info.get(key))
            if when is not None:
                return when
        try:
            when = _seconds(self.fs.modified(name))
        except (NotImplementedError, OSError):
            when = None
        return when if when is not None else math.inf
