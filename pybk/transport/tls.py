"""TLS contexts for bookie servers and clients (standard ``ssl`` module, TLS >= 1.2).

Kept in one place so both ends agree on the floor version and on what "mutual TLS" means:
the server asks for and verifies a client certificate only when ``require_client_cert`` is
set (Kafka's ``ssl.client.auth=required``; the "requested" half-way mode gives a false sense
of security, so it is not offered).
"""

from __future__ import annotations

import os
import ssl

__all__ = [
    "client_context",
    "server_context",
]


def server_context(
    certfile: str | os.PathLike[str],
    keyfile: str | os.PathLike[str] | None = None,
    *,
    cafile: str | os.PathLike[str] | None = None,
    require_client_cert: bool = False,
) -> ssl.SSLContext:
    """A server-side context presenting ``certfile``; verifies clients against ``cafile``
    when ``require_client_cert`` (which then needs ``cafile``)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile)
    if require_client_cert:
        if cafile is None:
            raise ValueError("require_client_cert needs a CA file (tls_ca) to verify clients")
        ctx.load_verify_locations(cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED
    elif cafile is not None:
        ctx.load_verify_locations(cafile)
    return ctx


def client_context(
    cafile: str | os.PathLike[str] | None = None,
    *,
    certfile: str | os.PathLike[str] | None = None,
    keyfile: str | os.PathLike[str] | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client-side context that verifies the bookie against ``cafile`` (system roots when
    None) and presents ``certfile`` for mutual TLS when given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cafile is not None:
        ctx.load_verify_locations(cafile)
    else:
        ctx.load_default_certs()
    ctx.check_hostname = check_hostname
    if certfile is not None:
        ctx.load_cert_chain(certfile, keyfile)
    return ctx
