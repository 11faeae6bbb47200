"""Where the ZooKeeper backend keeps what, below its root (docs/zookeeper.md)::

    ledgers/<id // 10^8 : 11 digits>/<(id // 10^4) % 10^4 : 4 digits>/L<id % 10^4 : 4 digits>
    idgen                       next unclaimed ledger id (ASCII); clients claim blocks by CAS
    bookies/writable/<bookie>   ephemeral, JSON {"address": ..., "rack": ...}
    bookies/readonly/<bookie>   ephemeral, same content
    cookies/<bookie>            the bookie's cookie bytes
    underreplication/ledgers/<same two levels>/urL<id % 10^4>   JSON list of missing bookies
    kv/<key path>               the key/value namespace: a key's znode holds b"\\x01" + value;
                                nodes made only as parents of deeper keys hold b""
    locks/<lock name>           ephemeral, the holder's owner label
    elections/<name>/n_<seq>    ephemeral-sequential, one per candidate (its label); the
                                lowest sequence number leads

Pure functions and one small value object: no I/O here.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BASE_DIRS", "CANDIDATE_PREFIX", "Layout", "ledger_id_from", "ledger_subpath"]

#: Persistent directories made when a store first connects.
BASE_DIRS: Final = ("ledgers", "bookies/writable", "bookies/readonly", "cookies",
                    "underreplication/ledgers", "kv", "locks", "elections")

#: Name prefix of an election candidate's ephemeral-sequential node.
CANDIDATE_PREFIX: Final = "n_"


def ledger_subpath(ledger_id: int, prefix: str = "L") -> str:
    """Hierarchical path of a ledger below ``ledgers/`` (at most 10^4 children per node)."""
    top, rest = divmod(ledger_id, 10**8)
    mid, low = divmod(rest, 10**4)
    return f"{top:011d}/{mid:04d}/{prefix}{low:04d}"


def ledger_id_from(top: str, mid: str, leaf: str, prefix: str) -> int | None:
    """The ledger id a ``top/mid/leaf`` path names, or None for a foreign node."""
    if not (top.isdigit() and mid.isdigit() and leaf.startswith(prefix)):
        return None
    low = leaf[len(prefix):]
    if not low.isdigit():
        return None
    return int(top) * 10**8 + int(mid) * 10**4 + int(low)


class Layout:
    """Absolute znode paths of one store's root."""

    def __init__(self, root: str) -> None:
        if not root.startswith("/") or (root.endswith("/") and root != "/"):
            raise ValueError(f"ZooKeeper root must be an absolute path, got {root!r}")
        self.root = root.rstrip("/")

    def p(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def ledger(self, ledger_id: int) -> str:
        return self.p("ledgers", ledger_subpath(ledger_id))

    def bookie(self, bookie_id: str, read_only: bool) -> str:
        return self.p("bookies", "readonly" if read_only else "writable", bookie_id)

    def bookies(self, read_only: bool) -> str:
        return self.p("bookies", "readonly" if read_only else "writable")

    def cookie(self, bookie_id: str) -> str:
        return self.p("cookies", bookie_id)

    def under_replicated(self, ledger_id: int) -> str:
        return self.p("underreplication", "ledgers", ledger_subpath(ledger_id, "urL"))

    def kv(self, key: str = "") -> str:
        return self.p("kv", key) if key else self.p("kv")

    def lock(self, name: str = "") -> str:
        return self.p("locks", name) if name else self.p("locks")

    def election(self, name: str) -> str:
        return self.p("elections", name)

    @property
    def idgen(self) -> str:
        return self.p("idgen")
