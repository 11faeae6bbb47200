"""Where everything lives below the store's root (pure functions, bytes keys).

``/root/ledgers/<20-digit id>``, ``/root/idgen``, ``/root/kv/<key>``, ``/root/bookies/<id>``
(leased), ``/root/cookies/<id>``, ``/root/underreplicated/<20-digit id>``,
``/root/locks/<name>`` (leased; elections are the locks ``elections/<name>``).
"""

from __future__ import annotations

import base64

__all__ = ["Keys"]


def _text(key: str | bytes) -> str:
    """A key as the gateway returns it (base64) or as bytes, decoded."""
    raw = key if isinstance(key, bytes) else base64.b64decode(key)
    return raw.decode()


class Keys:
    """The key layout of one root."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.prefix = (root.rstrip("/") + "/").encode()
        self.ledgers = self.prefix + b"ledgers/"
        self.idgen = self.prefix + b"idgen"
        self.bookies = self.prefix + b"bookies/"
        self.marks = self.prefix + b"underreplicated/"
        self._kv = self.prefix + b"kv/"
        self._cookies = self.prefix + b"cookies/"
        self._locks = self.prefix + b"locks/"

    def ledger(self, ledger_id: int) -> bytes:
        return self.ledgers + b"%020d" % ledger_id

    def ledger_id(self, key: str | bytes) -> int:
        return int(_text(key)[len(self.ledgers):])

    def mark(self, ledger_id: int) -> bytes:
        return self.marks + b"%020d" % ledger_id

    def mark_id(self, key: str | bytes) -> int:
        return int(_text(key)[len(self.marks):])

    def value(self, key: str) -> bytes:
        return self._kv + key.encode()

    def value_name(self, key: str | bytes) -> str:
        return _text(key)[len(self._kv):]

    def bookie(self, bookie_id: str) -> bytes:
        return self.bookies + bookie_id.encode()

    def bookie_name(self, key: str | bytes) -> str:
        return _text(key)[len(self.bookies):]

    def cookie(self, bookie_id: str) -> bytes:
        return self._cookies + bookie_id.encode()

    def lock(self, name: str) -> bytes:
        return self._locks + name.encode()

    def lock_name(self, key: str | bytes) -> str:
        return _text(key)[len(self._locks):]
