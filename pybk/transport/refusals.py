"""Bookies that refused a client for its credentials: failures retrying cannot mend.

Why: a connection a bookie drops is normally transient (it restarts, the network blips) and
the replication code retries it. A bookie that wants TLS while the client speaks plain TCP,
a certificate the client cannot verify, a token missing or refused: these fail the same way
on every try, until someone changes the client's configuration. A long-running caller (a log
mirror) must tell the two apart to stop and say what is missing instead of looping.

The TCP transport records each such refusal here, per bookie, with the bookie's address;
a later answer from that bookie, or a connection it refuses (it is down), forgets it.
Only proof counts: a plain connection dropped before any answer is *probed* with a TLS
handshake (no verification, nothing sent after it), and only a handshake that completes
(or a TLS alert from the peer) records ``needs-tls``; a TLS handshake that fails is probed
with a plain BOOKIE_INFO request, and only an answer records ``no-tls``. A bookie that is
restarting refuses or drops the probe too and stays transient.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Final, NamedTuple

from pybk.transport import codec
from pybk.wire import BookieInfoRequest

__all__ = ["NEEDS_TLS", "NEEDS_TOKEN", "NO_TLS", "REFUSAL_KINDS", "TLS_VERIFY",
           "TOKEN_REFUSED", "Refusal", "RefusalLog", "speaks_plain", "speaks_tls"]

#: the bookie speaks TLS; this client connected without it
NEEDS_TLS: Final = "needs-tls"
#: the bookie speaks plain TCP; this client connected with TLS
NO_TLS: Final = "no-tls"
#: the bookie's certificate failed this client's verification (another CA, another name)
TLS_VERIFY: Final = "tls-verify"
#: the bookie wants a token; this client sent none
NEEDS_TOKEN: Final = "needs-token"
#: the bookie refused this client's token
TOKEN_REFUSED: Final = "token-refused"
REFUSAL_KINDS: Final = (NEEDS_TLS, NO_TLS, TLS_VERIFY, NEEDS_TOKEN, TOKEN_REFUSED)


class Refusal(NamedTuple):
    """One bookie refused this client for its credentials (``kind``: one of
    :data:`REFUSAL_KINDS`); ``at`` is the loop time it was seen."""

    bookie_id: str
    address: str
    kind: str
    detail: str
    at: float

    def describe(self) -> str:
        """One phrase for an error message."""
        what = {
            NEEDS_TLS: "refused the connection without TLS (it speaks TLS; no TLS was given)",
            NO_TLS: "does not speak TLS (it answers plain TCP; TLS was given)",
            TLS_VERIFY: "presented a certificate that failed verification",
            NEEDS_TOKEN: "wants an auth token and none was given",
            TOKEN_REFUSED: "refused the auth token",
        }[self.kind]
        detail = f" ({self.detail})" if self.detail else ""
        return f"bookie {self.bookie_id} at {self.address} {what}{detail}"


async def speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` completes a TLS handshake (or answers it with a TLS alert).
    Nothing is verified and nothing is sent after the handshake; any other outcome
    (refused, dropped, timed out) is False."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port, ssl=ctx)
    except ssl.SSLError as exc:  # an alert means a TLS peer (e.g. it wants a client cert)
        return "ALERT" in (exc.reason or "").upper()
    except (OSError, TimeoutError, EOFError):
        return False
    writer.close()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            await writer.wait_closed()
    return True


async def speaks_plain(host: str, port: int, timeout: float) -> bool:
    """Whether ``host:port`` answers a plain BOOKIE_INFO request with a well-formed response
    (whatever its status: a bookie wanting a token refuses it, in plain TCP)."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(codec.encode_request(1, BookieInfoRequest()))
                conn = codec.Connection("client")
                while data := await reader.read(65536):
                    if events := conn.receive_data(data):
                        return isinstance(events[0], codec.ResponseReceived)
                return False
            finally:
                writer.close()
    except Exception:  # refused, dropped, timed out, not the protocol: not proof
        return False


class RefusalLog:
    """The refusals a transport saw, the latest per bookie, and its probes in flight."""

    def __init__(self) -> None:
        self._by_bookie: dict[str, Refusal] = {}
        self._probes: set[asyncio.Task[None]] = set()

    def record(self, bookie_id: str, address: str, kind: str, detail: str = "") -> None:
        if kind not in REFUSAL_KINDS:
            raise ValueError(f"unknown refusal kind {kind!r}")
        now = asyncio.get_running_loop().time()
        self._by_bookie[bookie_id] = Refusal(bookie_id, address, kind, detail, now)

    def touch(self, bookie_id: str) -> None:
        """The bookie's refusal still holds (the transport refused a request without trying
        it again, backing off after that refusal): it counts as seen now."""
        if (refusal := self._by_bookie.get(bookie_id)) is not None:
            self._by_bookie[bookie_id] = refusal._replace(at=asyncio.get_running_loop().time())

    def forget(self, bookie_id: str) -> None:
        """The bookie answered: whatever it refused before is mended."""
        self._by_bookie.pop(bookie_id, None)

    def probe(self, bookie_id: str, address: str, host: str, port: int, timeout: float,
              *, tls: bool) -> None:
        """Probe a bookie that dropped a connection unanswered: with ``tls`` (the connection
        was plain) whether it speaks TLS, else whether it speaks plain TCP (at most one
        probe per bookie at a time)."""
        if any(t.get_name() == bookie_id for t in self._probes):
            return

        async def probe() -> None:
            if tls and await speaks_tls(host, port, timeout):
                self.record(bookie_id, address, NEEDS_TLS)
            elif not tls and await speaks_plain(host, port, timeout):
                self.record(bookie_id, address, NO_TLS)

        task = asyncio.get_running_loop().create_task(probe(), name=bookie_id)
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def settled(self, since: float | None = None) -> list[Refusal]:
        """The refusals (seen at or after loop time ``since``), once the probes in flight
        have ended (each is bounded by its timeout)."""
        if self._probes:
            await asyncio.gather(*self._probes, return_exceptions=True)
        return sorted((r for r in self._by_bookie.values() if since is None or r.at >= since),
                      key=lambda r: r.bookie_id)

    async def close(self) -> None:
        for task in list(self._probes):
            task.cancel()
        if self._probes:
            await asyncio.gather(*self._probes, return_exceptions=True)
