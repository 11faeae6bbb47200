"""The bookie's identity (rule R4): a cookie in its data directory and in the metadata store.

A cookie names the bookie, a random instance id and the cluster it joined (the metadata
store's own random id, :data:`CLUSTER_KEY`). A data directory that was emptied or swapped
shows up as a disagreement between the two copies, and the bookie refuses to start rather
than serve a directory that may have lost acknowledged entries (BookKeeper's ``Cookie`` /
``LegacyCookieValidation``). So does a data directory brought to a metadata store that does
not know it (the metadata was lost or replaced, or the wrong one named): its ledgers would
collide with the ids the new metadata hands out.
"""

from __future__ import annotations

import json
import posixpath
import random
import uuid

import crc32c

from pybk.errors import BookieStateError, KeyExistsError, NoSuchKeyError
from pybk.metadata.base import MetadataStore
from pybk.storage.fs import FileSystem

__all__ = ["CLUSTER_KEY", "COOKIE_FILE", "check_cookie", "cluster_id", "decode_cookie",
           "encode_cookie"]

#: the metadata store's key holding its cluster's random id (made by the first bookie)
CLUSTER_KEY = "cluster/instance_id"

COOKIE_FILE = "COOKIE"
_COOKIE_MAGIC = b"pybk-cookie v1 "


def encode_cookie(bookie_id: str, instance_id: str, cluster: str = "") -> bytes:
    """A data directory's cookie file (and the copy kept in the metadata store);
    ``cluster``: the id of the metadata store it joined ("" for none known)."""
    fields = {"bookie_id": bookie_id, "instance_id": instance_id}
    if cluster:
        fields["cluster"] = cluster
    doc = json.dumps(fields, sort_keys=True).encode()
    return _COOKIE_MAGIC + f"{crc32c.crc32c(doc):08x} ".encode() + doc


def decode_cookie(data: bytes, where: str) -> dict[str, str]:
    """``{"bookie_id", "instance_id", "cluster"}`` of a cookie (cluster "" in cookies made
    before clusters had ids); BookieStateError naming ``where`` if it
    is damaged or of an unknown version."""
    if not data.startswith(_COOKIE_MAGIC):
        raise BookieStateError(f"{where}: not a pybk cookie (or an unknown cookie version)")
    rest = data[len(_COOKIE_MAGIC):]
    try:
        crc, doc = rest.split(b" ", 1)
        if int(crc, 16) != crc32c.crc32c(doc):
            raise ValueError("checksum mismatch")
        parsed = json.loads(doc)
        return {"bookie_id": str(parsed["bookie_id"]),
                "instance_id": str(parsed["instance_id"]),
                "cluster": str(parsed.get("cluster", ""))}
    except (ValueError, KeyError, TypeError) as exc:
        raise BookieStateError(f"{where}: damaged cookie ({exc})") from None



async def check_cookie(fs: FileSystem, data_dir: str, bookie_id: str,
                       cookie_store: MetadataStore | None, rng: random.Random) -> str:
    """The instance id of the bookie on ``data_dir``: made (and written to both places) on
    the first start, checked against the metadata store's copy on every later one.

    Raises BookieStateError when the directory and the store disagree."""
    path = posixpath.join(data_dir, COOKIE_FILE)
    local = decode_cookie(fs.read_file(path), path) if fs.exists(path) else None
    stored = None
    cluster = ""
    if cookie_store is not None:
        cluster = await cluster_id(cookie_store, rng)
        raw = await cookie_store.read_cookie(bookie_id)
        if raw is not None:
            stored = decode_cookie(raw, f"metadata cookie of {bookie_id}")
    if local is None:
        if stored is not None:
            raise BookieStateError(
                f"bookie {bookie_id}: the metadata store holds its cookie (instance "
                f"{stored['instance_id']}) but {data_dir} has none: the data directory "
                "was emptied or replaced, so this bookie may have lost acknowledged entries. "
                "Refusing to start; an operator must delete the bookie's cookie from the "
                "metadata store (and let re-replication restore its ledgers) to start it "
                "fresh")
        journal = posixpath.join(data_dir, "journal")
        if fs.exists(journal) and fs.listdir(journal):
            raise BookieStateError(
                f"{data_dir} holds journal data but no cookie: refusing to adopt it")
        instance_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        cookie = encode_cookie(bookie_id, instance_id, cluster)
        await fs.write_file_atomic(path, cookie)
        if cookie_store is not None:
            await cookie_store.write_cookie(bookie_id, cookie)
        return instance_id
    if local["bookie_id"] != bookie_id:
        raise BookieStateError(
            f"{data_dir} belongs to bookie {local['bookie_id']!r}, not "
            f"{bookie_id!r}: refusing to start on another bookie's data")
    if cookie_store is None:
        return local["instance_id"]
    if local["cluster"] and local["cluster"] != cluster:
        raise BookieStateError(
            f"bookie {bookie_id}: {data_dir} belongs to cluster {local['cluster']} (instance "
            f"{local['instance_id']}), but this metadata store is cluster {cluster}: it is "
            "not the metadata this bookie joined (lost, replaced, or the wrong one named), "
            "and its ledger ids would collide with this data's. Refusing to start; start it "
            f"with cluster {local['cluster']}'s metadata, or empty {data_dir} to join this "
            "one as a new bookie")
    if stored is None:
        raise BookieStateError(
            f"bookie {bookie_id}: {data_dir} holds instance {local['instance_id']}"
            + (f" of cluster {local['cluster']}" if local["cluster"] else "")
            + f", but the metadata store (cluster {cluster}) has no cookie for this bookie: "
            "the metadata was lost or replaced (or the wrong store named), and its ledger "
            "ids would collide with this data's. Refusing to start; start it with the "
            f"metadata it joined, or empty {data_dir} to join this one as a new bookie")
    if stored["instance_id"] != local["instance_id"]:
        raise BookieStateError(
            f"bookie {bookie_id}: {data_dir} has instance {local['instance_id']} "
            f"but the metadata store says {stored['instance_id']}: the data directory was "
            "swapped; refusing to serve it as if it held this bookie's data")
    if not local["cluster"]:  # a cookie from before clusters had ids: it learns its own
        cookie = encode_cookie(bookie_id, local["instance_id"], cluster)
        await fs.write_file_atomic(path, cookie)
        await cookie_store.write_cookie(bookie_id, cookie)
    return local["instance_id"]


async def cluster_id(store: MetadataStore, rng: random.Random) -> str:
    """The metadata store's cluster id, made (once, whoever comes first) if it has none."""
    try:
        return (await store.read_value(CLUSTER_KEY)).value.decode()
    except NoSuchKeyError:
        pass
    made = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    try:
        await store.create_value(CLUSTER_KEY, made.encode())
    except KeyExistsError:  # another bookie made it first
        return (await store.read_value(CLUSTER_KEY)).value.decode()
    return made
