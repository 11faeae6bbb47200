"""``pybk log mirror`` whose credentials a cluster refuses stops with exit status 3 and a
line naming the side, the bookie and the option, instead of retrying forever; the library
raises MirrorAccessError; a cluster whose bookies stop and come back still heals.

Two clusters of bookie processes: ``secure`` (TLS with a trustme CA, a token) and ``plain``;
``pybk.sync.LogMirror`` reaches each with its own TLS and token options (a third cluster wants
client certificates).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

import pybk
from pybk.cli.log_mirror import EXIT_REFUSED
from pybk.client import Client
from pybk.logs.mirror import LogMirror, MirrorAccessError, open_target, unframe
from pybk.ops.mirror import MirrorService
from pybk.transport.refusals import speaks_plain, speaks_tls
from pybk.transport.tls import client_context

from .proc_cluster import ProcCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: a refusal must be reported within this (the first failure plus its TLS probe)
BOUND = 20.0


@dataclass
class Clusters:
    secure: ProcCluster
    plain: ProcCluster
    files: Path

    def opt(self, name: str) -> str:
        return str(self.files / name)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clusters]:
    tmp = tmp_path_factory.mktemp("refused")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp / "ca.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp / "s.pem")
    trustme.CA().cert_pem.write_to_path(tmp / "other-ca.pem")
    (tmp / "token").write_bytes(b"s3cret")
    (tmp / "bad-token").write_bytes(b"guessed")
    secure = ProcCluster(tmp / "secure", 2, extra_args=[
        "--tls-cert", str(tmp / "s.pem"), "--tls-ca", str(tmp / "ca.pem"),
        "--auth-token-file", str(tmp / "token")])
    plain = ProcCluster(tmp / "plain", 2)
    try:
        asyncio.run(secure.start())
        asyncio.run(plain.start())
        asyncio.run(_seed(secure, plain, tmp))
        yield Clusters(secure, plain, tmp)
    finally:
        secure.stop_all()
        plain.stop_all()


async def _seed(secure: ProcCluster, plain: ProcCluster, tmp: Path) -> None:
    tls = client_context(tmp / "ca.pem")
    for cluster, opts in ((secure, {"tls": tls, "auth_token": b"s3cret"}), (plain, {})):
        async with Client(cluster.metadata, **opts) as client:  # type: ignore[arg-type]
            lg = await client.namespace().create_log("orders", ensemble_size=2,
                                                     write_quorum=2, ack_quorum=2)
            async with await lg.writer() as w:
                await w.append_many([b"order-%d" % i for i in range(10)])


def _mirror(src: str, dst: str, *extra: str) -> tuple[int, str, float]:
    """Run ``pybk log mirror`` to its end: (exit status, last stderr line, seconds)."""
    began = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "pybk", "log", "mirror", "--from", src, "--to", dst, "orders",
         "--timeout", "10", *extra],
        capture_output=True, text=True, timeout=BOUND + 30, check=False)
    lines = r.stderr.strip().splitlines()
    return r.returncode, lines[-1] if lines else "", time.monotonic() - began


@pytest.mark.parametrize("mode", [["--drain"], []], ids=["drain", "follow"])
def test_no_tls_options_against_a_tls_and_token_source_exits_3(
        clusters: Clusters, mode: list[str]) -> None:
    code, line, took = _mirror(clusters.secure.metadata, clusters.plain.metadata,
                               "--to-log", "copy", *mode)
    assert code == EXIT_REFUSED, line
    assert took < BOUND, took
    assert re.match(r"pybk: error: MirrorAccessError: source bookie bookie-\d at "
                    r"127\.0\.0\.1:\d+ refused the connection without TLS", line), line
    assert line.endswith("pass --from-tls-ca FILE (the CA of the source cluster's bookies; "
                         "--from-tls-cert and --from-tls-key too if they want a client "
                         "certificate)"), line
    ports = {a.rpartition(":")[2] for a in clusters.secure.addresses.values()}
    assert any(f":{p} " in line for p in ports), (line, ports)


@pytest.mark.parametrize(("extra", "said", "hint"), [
    (["--from-tls-ca", "ca.pem", "--from-auth-token-file", "bad-token"],
     "refused the auth token (authentication failed)",
     "check --from-auth-token-file: the source bookies do not accept its token"),
    (["--from-tls-ca", "ca.pem"], "wants an auth token and none was given",
     "pass --from-auth-token-file FILE (the source cluster's token)"),
    (["--from-tls-ca", "other-ca.pem", "--from-auth-token-file", "token"],
     "presented a certificate that failed verification",
     "check --from-tls-ca: it must hold the CA that signed the source bookies' certificates"),
], ids=["wrong-token", "no-token", "wrong-ca"])
def test_refused_source_credentials_exit_3_naming_what_to_fix(
        clusters: Clusters, extra: list[str], said: str, hint: str) -> None:
    args = [clusters.opt(a) if not a.startswith("--") else a for a in extra]
    code, line, took = _mirror(clusters.secure.metadata, clusters.plain.metadata,
                               "--to-log", "copy", "--drain", *args)
    assert code == EXIT_REFUSED, line
    assert took < BOUND, took
    assert re.match(rf"pybk: error: MirrorAccessError: source bookie bookie-\d at "
                    rf"127\.0\.0\.1:\d+ {re.escape(said)}", line), line
    assert line.endswith(hint), line


@pytest.mark.parametrize(("source", "target", "said", "hint"), [
    ("plain", "secure", "wants an auth token and none was given",
     "pass --to-auth-token-file FILE (the target cluster's token)"),
    ("plain", "plain", "does not speak TLS (it answers plain TCP; TLS was given)",
     "drop --to-tls-ca, --to-tls-cert and --to-tls-key: the target cluster's bookies do not "
     "speak TLS"),
], ids=["no-token", "tls-to-plain"])
def test_a_target_refusing_the_mirror_names_the_target_and_its_options(
        clusters: Clusters, source: str, target: str, said: str, hint: str) -> None:
    """(Follow mode: the failed appends end the run although the source has nothing new.)"""
    code, line, took = _mirror(getattr(clusters, source).metadata,
                               getattr(clusters, target).metadata, "--to-log", "copy",
                               "--to-tls-ca", clusters.opt("ca.pem"))
    assert code == EXIT_REFUSED, line
    assert took < BOUND, took
    assert re.match(rf"pybk: error: MirrorAccessError: target bookie bookie-\d at "
                    rf"127\.0\.0\.1:\d+ {re.escape(said)}", line), line
    assert line.endswith(hint), line


async def test_the_library_raises_mirror_access_error(clusters: Clusters) -> None:
    async with Client(clusters.secure.metadata) as sc, Client(clusters.plain.metadata) as pc:
        source = await sc.namespace().open_log("orders")
        target = await open_target(source, pc.namespace(), "copy-lib")
        service = MirrorService(source, target, max_backoff=0.5)
        with pytest.raises(MirrorAccessError) as caught:
            await asyncio.wait_for(service.run(), BOUND)
        err = caught.value
        assert err.side == "source" and err.kinds == ("needs-tls",), err
        assert {r.bookie_id for r in err.refusals} <= set(clusters.secure.addresses)
        assert isinstance(err, pybk.UnauthorizedError)
        assert service.stats.last_error.startswith("MirrorAccessError: source bookie")
        with pytest.raises(MirrorAccessError):
            await asyncio.wait_for(LogMirror(source, target).drain(), BOUND)
    # the sync facade (no credentials at all) raises it from drain()
    with pybk.sync.LogMirror(clusters.secure.metadata, clusters.plain.metadata, "orders",
                             target_name="copy-sync") as m, pytest.raises(MirrorAccessError):
        m.drain()


def _poll(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def test_a_source_whose_bookies_are_down_then_restart_heals(
        clusters: Clusters, tmp_path: Path) -> None:
    """A drain started while the (plain) source's bookies are stopped retries (connections
    refused, bookies not registered: nothing a retry cannot mend) and completes once they
    are back; the target side has TLS and a token."""
    plain, secure = clusters.plain, clusters.secure
    for bookie_id in plain.ids:
        plain.sigterm(bookie_id)
    for bookie_id in plain.ids:
        assert asyncio.run(plain.wait_exit(bookie_id)) == 0
    err = tmp_path / "mirror.err"
    with err.open("wb") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pybk", "log", "mirror", "--from", plain.metadata, "--to",
             secure.metadata, "orders", "--to-log", "healed", "--drain", "--to-tls-ca",
             clusters.opt("ca.pem"), "--to-auth-token-file", clusters.opt("token")],
            stdout=subprocess.PIPE, stderr=err_file)
    try:
        _poll(lambda: err.read_bytes().count(b"restarting in about") >= 2,
              "the mirror to fail and retry")
        assert proc.poll() is None, err.read_text()
        asyncio.run(plain.start())  # back (on other ports)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.read_text()[-3000:]
        assert "MirrorAccessError" not in err.read_text()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
    tls = client_context(clusters.files / "ca.pem")
    with pybk.sync.Client(secure.metadata, tls=tls, auth_token=b"s3cret") as sc:
        lg = sc.namespace().open_log("healed")
        with lg.reader(stop_at=lg.last_position()) as r:
            copied = [unframe(rec.data) for rec in r]
    assert [c.data for c in copied] == [b"order-%d" % i for i in range(10)]
    assert out.decode().strip().splitlines()[-1] == str(copied[-1].source_position)


async def test_only_a_completed_tls_handshake_says_a_peer_wants_tls(tmp_path: Path) -> None:
    """The probes behind ``needs-tls`` and ``no-tls``: a listener that drops connections (as
    a stopping bookie does) or a closed port is taken for neither a TLS nor a plain bookie
    (a real plain bookie answering: the ``tls-to-plain`` case above)."""
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    plain = await asyncio.start_server(drop, "127.0.0.1", 0)
    tls = await asyncio.start_server(drop, "127.0.0.1", 0, ssl=server_ctx)
    closed = await asyncio.start_server(drop, "127.0.0.1", 0)
    closed_port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    try:
        assert await speaks_tls("127.0.0.1", tls.sockets[0].getsockname()[1], 5.0)
        assert not await speaks_tls("127.0.0.1", plain.sockets[0].getsockname()[1], 5.0)
        assert not await speaks_tls("127.0.0.1", closed_port, 5.0)
        # and the reverse probe (a TLS client meeting a plain bookie): neither is plain
        assert not await speaks_plain("127.0.0.1", tls.sockets[0].getsockname()[1], 5.0)
        assert not await speaks_plain("127.0.0.1", plain.sockets[0].getsockname()[1], 5.0)
        assert not await speaks_plain("127.0.0.1", closed_port, 5.0)
    finally:
        for server in (plain, tls):
            server.close()
            await server.wait_closed()


def _copied(metadata: str, name: str, **credentials: object) -> list[bytes]:
    with pybk.sync.Client(metadata, **credentials) as client:
        lg = client.namespace().open_log(name)
        with lg.reader(stop_at=lg.last_position()) as r:
            return [unframe(rec.data).data for rec in r]


ORDERS = [b"order-%d" % i for i in range(10)]


def test_the_sync_mirror_takes_each_sides_tls_and_token_files(clusters: Clusters) -> None:
    """``pybk.sync.LogMirror`` with the options ``pybk log mirror`` has, as keywords: the
    TLS-and-token source with the from_ ones, then back into it with the to_ ones."""
    with pybk.sync.LogMirror(clusters.secure.metadata, clusters.plain.metadata, "orders",
                             target_name="sync-from-files",
                             from_tls_ca=clusters.opt("ca.pem"),
                             from_auth_token_file=clusters.opt("token")) as m:
        last = m.drain()
    assert last is not None and _copied(clusters.plain.metadata, "sync-from-files") == ORDERS
    with pybk.sync.LogMirror(clusters.plain.metadata, clusters.secure.metadata, "orders",
                             target_name="sync-to-files", to_tls_ca=clusters.files / "ca.pem",
                             to_auth_token_file=clusters.opt("token")) as m:
        assert m.drain() is not None
    tls = client_context(clusters.files / "ca.pem")
    assert _copied(clusters.secure.metadata, "sync-to-files", tls=tls,
                   auth_token=b"s3cret") == ORDERS


def test_the_sync_mirror_takes_contexts_and_tokens_and_names_the_side_refused(
        clusters: Clusters) -> None:
    """The forms ``pybk.Client`` takes (an SSLContext, token bytes), per side; a side left
    without them is the one MirrorAccessError names."""
    tls = client_context(clusters.files / "ca.pem")
    secure = clusters.secure.metadata
    with pybk.sync.LogMirror(secure, secure, "orders", target_name="sync-objects",
                             from_tls=tls, from_auth_token=b"s3cret", to_tls=tls,
                             to_auth_token=b"s3cret") as m:
        assert m.drain() is not None
    assert _copied(secure, "sync-objects", tls=tls, auth_token=b"s3cret") == ORDERS
    with pytest.raises(MirrorAccessError) as caught, pybk.sync.LogMirror(
            clusters.plain.metadata, secure, "orders", target_name="sync-no-token",
            to_tls=tls, max_backoff=0.5) as m:
        m.drain()
    assert caught.value.side == "target" and caught.value.kinds == ("needs-token",)


def test_the_sync_mirror_presents_each_sides_client_certificate(
        clusters: Clusters, tmp_path: Path) -> None:
    """Bookies that require a client certificate (mutual TLS): ``to_tls_cert`` and
    ``to_tls_key`` present one signed by their CA."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "s.pem")
    client = ca.issue_cert("mirror")
    client.cert_chain_pems[0].write_to_path(tmp_path / "client.pem")
    client.private_key_pem.write_to_path(tmp_path / "client.key")
    mutual = ProcCluster(tmp_path / "mutual", 2, extra_args=[
        "--tls-cert", str(tmp_path / "s.pem"), "--tls-ca", str(tmp_path / "ca.pem"),
        "--require-client-cert"])
    try:
        asyncio.run(mutual.start())
        with pybk.sync.LogMirror(clusters.plain.metadata, mutual.metadata, "orders",
                                 target_name="sync-mutual", to_tls_ca=tmp_path / "ca.pem",
                                 to_tls_cert=tmp_path / "client.pem",
                                 to_tls_key=tmp_path / "client.key") as m:
            assert m.drain() is not None
        tls = client_context(tmp_path / "ca.pem", certfile=tmp_path / "client.pem",
                             keyfile=tmp_path / "client.key")
        assert _copied(mutual.metadata, "sync-mutual", tls=tls) == ORDERS
    finally:
        mutual.stop_all()
