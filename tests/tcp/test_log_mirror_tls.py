"""``pybk log mirror`` from a cluster whose bookies want TLS and a token to a plain one:
each side takes its own ``--from-*`` / ``--to-*`` security options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trustme

from pybk.client import Client
from pybk.logs.mirror import unframe
from pybk.transport.tls import client_context

from .proc_cluster import ProcCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _mirror(a: str, b: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pybk", "log", "mirror", "--from", a, "--to", b, "orders",
         "--drain", "--timeout", "10", *extra],
        capture_output=True, text=True, timeout=120, check=False)


async def test_a_mirror_reads_a_tls_and_token_cluster_with_its_own_options(
        tmp_path: Path) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "s.pem")
    (tmp_path / "token").write_bytes(b"s3cret")
    secure = ["--tls-cert", str(tmp_path / "s.pem"), "--tls-ca", str(tmp_path / "ca.pem"),
              "--auth-token-file", str(tmp_path / "token")]
    a = ProcCluster(tmp_path / "a", 2, extra_args=secure)
    b = ProcCluster(tmp_path / "b", 2)
    await a.start()
    await b.start()
    try:
        tls = client_context(tmp_path / "ca.pem")
        async with Client(a.metadata, tls=tls, auth_token=b"s3cret") as client:
            log = await client.namespace().create_log("orders", ensemble_size=2,
                                                      write_quorum=2, ack_quorum=2)
            async with await log.writer() as w:
                written = await w.append_many([b"order-%d" % i for i in range(30)])
        ok = _mirror(a.metadata, b.metadata, "--from-tls-ca", str(tmp_path / "ca.pem"),
                     "--from-auth-token-file", str(tmp_path / "token"))
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert ok.stdout.strip().splitlines()[-1] == str(written[-1])  # after the ready line
        async with Client(b.metadata) as client:
            target = await client.namespace().open_log("orders")
            async with target.reader(stop_at=await target.last_position()) as r:
                copied = [unframe(rec.data) async for rec in r]
        assert [(c.source_position, c.data) for c in copied] == [
            (p, b"order-%d" % i) for i, p in enumerate(written)]
    finally:
        a.stop_all()
        b.stop_all()
