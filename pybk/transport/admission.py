"""Who may connect: the connection caps, and fair displacement when they are full.

Pure bookkeeping (no sockets), so the rules can be tested on their own. A connection counts
from its accept until it is gone; it is *unproven* while the server waits for its TLS
handshake or AUTH token, and unproven ones hold at most the small ``max_unproven`` budget.

A full cap does not lock a newcomer out. An address holding two more connections than the
newcomer's gives one up. A full unproven budget is paid for by an address holding several
(the newcomer's own when it holds as many as anyone): a flood from a few addresses churns
its own places, and a client's lone connection keeps its time to prove itself. With every
address holding one, the oldest unproven connection (else the oldest silent one) makes
room: thousands of addresses cannot lock out a client that proves itself before it is oldest.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

__all__ = ["Admission", "Decision"]

#: reasons a connection is refused (also the server's counter names)
PER_IP_CAP = "refused_per_ip_cap"
CONNECTION_CAP = "refused_connection_cap"
UNPROVEN_BUDGET = "refused_unauthenticated_budget"


@dataclass(frozen=True, slots=True)
class Decision:
    """Admit (``refused is None``), possibly after displacing one connection of
    ``displace_ip`` (an unproven one when ``unproven_only``), or refuse for ``refused``."""

    refused: str | None = None
    displace_ip: str | None = None
    unproven_only: bool = False
    #: refused unless the caller displaces the oldest unproven connection (``unproven_only``)
    #: or, when none, the oldest that has sent nothing
    oldest: bool = False


ADMIT = Decision()


class Admission:
    """Counts connections per address and proven/unproven; decides on each newcomer."""

    def __init__(self, max_total: int, max_per_ip: int, max_unproven: int) -> None:
        self.max_total = max_total
        self.max_per_ip = max_per_ip
        self.max_unproven = max_unproven
        self.per_ip: collections.Counter[str] = collections.Counter()
        self.unproven_per_ip: collections.Counter[str] = collections.Counter()
        self.total = 0
        self.unproven = 0

    def decide(self, ip: str, unproven: bool) -> Decision:
        """May a connection from ``ip`` (starting unproven or not) come in?"""
        if self.per_ip[ip] >= self.max_per_ip:
            return Decision(PER_IP_CAP)
        if unproven and self.unproven >= self.max_unproven:
            top = _top(self.unproven_per_ip)
            own = self.unproven_per_ip[ip]
            if top is not None and top[1] >= 2:
                # an address holding several pays for the newcomer: the newcomer's own one
                # when it holds as many as anyone, else the one holding the most. A lone
                # unproven connection of another address is never the price of a flood
                victim = ip if own >= top[1] else top[0]
                return Decision(UNPROVEN_BUDGET if victim == ip else None,
                                displace_ip=victim, unproven_only=True)
            return Decision(UNPROVEN_BUDGET, unproven_only=True, oldest=True)
        if self.total >= self.max_total:
            top = _top(self.per_ip)
            if top is not None and top[1] >= self.per_ip[ip] + 2:
                return Decision(displace_ip=top[0])
            return Decision(CONNECTION_CAP, unproven_only=self.unproven > 0, oldest=True)
        return ADMIT

    def add(self, ip: str, unproven: bool) -> None:
        self.total += 1
        self.per_ip[ip] += 1
        if unproven:
            self.unproven += 1
            self.unproven_per_ip[ip] += 1

    def proven(self, ip: str) -> None:
        """A connection from ``ip`` authenticated: it leaves the unproven budget."""
        self.unproven -= 1
        _decrement(self.unproven_per_ip, ip)

    def remove(self, ip: str, unproven: bool) -> None:
        self.total -= 1
        _decrement(self.per_ip, ip)
        if unproven:
            self.proven(ip)


def _top(counts: collections.Counter[str]) -> tuple[str, int] | None:
    """The address holding the most (ties: any of them), or None."""
    if not counts:
        return None
    ip, n = max(counts.items(), key=lambda item: item[1])
    return ip, n


def _decrement(counts: collections.Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
