"""BookieProcess in this process (no subprocess): registry lifecycle and state flips.

Registration carries the TCP address; a read-only flip of the bookie (disk watermark) shows up
in the registry and flips back; a clean stop deregisters. The TcpTransport finds the bookie
through the registry and gets answers from the real Bookie.
"""

from __future__ import annotations

import pytest

from pybk.bookie import BookieConfig
from pybk.errors import BookieUnavailableError
from pybk.metadata.base import LedgerMetadata
from pybk.metadata.memory import MemoryMetadataStore
from pybk.server.process import BookieProcess, BookieProcessConfig
from pybk.transport.tcp import TcpTransport
from pybk.wire import BookieInfoRequest, Status

from .conftest import wait_until_async


async def test_registry_follows_the_bookie_state(tmp_path, capsys):
    store = MemoryMetadataStore()
    config = BookieProcessConfig(
        data_dir=str(tmp_path / "b1"),
        metadata="memory://",
        port=0,
        bookie_id="b1",
        ready_file=str(tmp_path / "ready.json"),
        bookie_config=BookieConfig(disk_check_interval=0),
    )
    process = BookieProcess(config, store=store)
    await process.start()
    try:
        [reg] = await store.list_bookies()
        assert reg.bookie_id == "b1" and reg.address == process.address and not reg.read_only
        assert '"event": "ready"' in capsys.readouterr().out
        assert (tmp_path / "ready.json").exists()

        transport = TcpTransport.from_store(store)
        info = await transport.send("b1", BookieInfoRequest(), 5.0)
        assert info.status == Status.OK and info.state == "writable"

        bookie = process.bookie

        async def registry_read_only() -> list[bool]:
            return [r.read_only for r in await store.list_bookies()]

        async def is_read_only() -> bool:
            return await registry_read_only() == [True]

        async def is_writable() -> bool:
            return await registry_read_only() == [False]

        bookie.config.disk_usage_threshold = 0.0  # every disk is now "full"
        bookie.config.disk_usage_low_water = 0.0  # (and stays so: the collector checks again)
        assert bookie.check_disk() == "read-only"
        await wait_until_async(is_read_only, 10, "registry shows read-only")
        bookie.config.disk_usage_threshold = 2.0
        bookie.config.disk_usage_low_water = 1.5
        assert bookie.check_disk() == "writable"
        await wait_until_async(is_writable, 10, "registry shows writable again")
        await transport.close()
    finally:
        await process.stop()
    assert await store.list_bookies() == []


async def test_token_protects_a_real_bookie(tmp_path, capsys):
    """No token / wrong token: refused, and the bookie holds nothing afterwards."""
    from pybk.wire import AddRequest, DigestManager, ListEntriesRequest, master_key

    store = MemoryMetadataStore()
    config = BookieProcessConfig(
        data_dir=str(tmp_path / "b1"), metadata="memory://", port=0, bookie_id="b1",
        auth_token=b"tok",
    )  # fmt: skip
    process = BookieProcess(config, store=store)
    await process.start()
    await store.create_ledger(LedgerMetadata(5, 1, 1, 1, {0: ("b1",)}))  # (as a client does)
    try:
        body = DigestManager(5).frame(0, -1, 1, b"x")
        add = AddRequest(5, 0, master_key(b""), body)
        for token in (None, b"wrong"):
            transport = TcpTransport.from_store(store, auth_token=token)
            assert (await transport.send("b1", add, 5.0)).status == Status.UNAUTHORIZED
            await transport.close()
        good = TcpTransport.from_store(store, auth_token=b"tok")
        listed = await good.send("b1", ListEntriesRequest(5), 5.0)
        assert listed.ranges == ()  # the refused add changed nothing
        assert (await good.send("b1", add, 5.0)).status == Status.OK
        listed = await good.send("b1", ListEntriesRequest(5), 5.0)
        assert listed.ranges == ((0, 0),)
        await good.close()
    finally:
        await process.stop()


async def test_client_over_mutual_tls_to_a_real_bookie(tmp_path, capsys):
    """pybk.Client(tls=...) builds a TcpTransport that writes and reads through mTLS."""
    import trustme

    from pybk.client import Client
    from pybk.transport.tls import client_context

    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(tmp_path / "s.pem")
    ca.issue_cert("client").private_key_and_cert_chain_pem.write_to_path(tmp_path / "c.pem")
    store = MemoryMetadataStore()
    config = BookieProcessConfig(
        data_dir=str(tmp_path / "b1"), metadata="memory://", port=0, bookie_id="b1",
        tls_cert=str(tmp_path / "s.pem"), tls_ca=str(tmp_path / "ca.pem"),
        require_client_cert=True,
    )  # fmt: skip
    process = BookieProcess(config, store=store)
    await process.start()
    try:
        tls = client_context(tmp_path / "ca.pem", certfile=tmp_path / "c.pem")
        async with Client(store, tls=tls) as client:
            lh = await client.create_ledger(ensemble_size=1, write_quorum=1, ack_quorum=1)
            assert await lh.append_many([b"a", b"b"]) == [0, 1]
            await lh.close()
            rh = await client.open_ledger(lh.id, recovery=False)
            assert [e.data for e in await rh.read(0, 1)] == [b"a", b"b"]
        no_cert = client_context(tmp_path / "ca.pem")
        async with Client(store, tls=no_cert) as client:
            rh = await client.open_ledger(lh.id, recovery=False)
            with pytest.raises(BookieUnavailableError):
                await rh.read(0, 1)
    finally:
        await process.stop()


async def test_metrics_over_http(tmp_path, capsys):
    import asyncio
    import urllib.request

    store = MemoryMetadataStore()
    config = BookieProcessConfig(
        data_dir=str(tmp_path / "b1"), metadata="memory://", port=0, bookie_id="b1",
        metrics_port=0,
    )  # fmt: skip
    process = BookieProcess(config, store=store)
    await process.start()
    try:
        transport = TcpTransport.from_store(store)
        assert (await transport.send("b1", BookieInfoRequest(), 5.0)).status == Status.OK
        await transport.close()
        url = f"http://{process.metrics_address}/metrics"

        def fetch() -> str:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return str(resp.read().decode())

        text = await asyncio.to_thread(fetch)
        assert 'pybk_server_events_total{event="requests"} 1.0' in text
        assert "pybk_server_connections" in text
    finally:
        await process.stop()


def test_advertised_address():
    import socket

    def cfg(**kw):
        return BookieProcessConfig(data_dir="/x", metadata="memory://", **kw)

    assert cfg(host="127.0.0.1").advertise() == "127.0.0.1"
    assert cfg(host="0.0.0.0").advertise() == socket.getfqdn()  # never register a wildcard
    assert cfg(host="0.0.0.0", advertised_host="bk1.example").advertise() == "bk1.example"
    assert cfg(host="10.0.0.5", port=3181).resolved_bookie_id() == "10.0.0.5:3181"
    with pytest.raises(ValueError, match="--bookie-id"):
        cfg(port=0).resolved_bookie_id()
    with pytest.raises(ValueError, match="--tls-cert"):
        cfg(tls_ca="/ca.pem").ssl_context()


def test_a_bookie_process_tunes_its_garbage_collector() -> None:
    """``pybk bookie`` freezes what start-up built and raises the gen0 threshold (process-wide,
    so checked in a child process rather than in the test runner)."""
    import subprocess
    import sys

    code = (
        "import gc\n"
        "from pybk.server.process import SERVER_GC_THRESHOLD, tune_gc_for_server\n"
        "before = gc.get_threshold()\n"
        "tune_gc_for_server()\n"
        "assert gc.get_threshold() == SERVER_GC_THRESHOLD != before, gc.get_threshold()\n"
        "assert gc.get_freeze_count() > 0\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_the_gc_is_tuned_before_the_bookie_is_registered_or_its_stalls_counted(
        tmp_path, monkeypatch):
    """``pybk bookie`` tunes the collector (one full collection: tens of milliseconds of a
    held loop) before registering, and the loop watch starts after it: the start-up's
    collection is neither met by a client nor counted as a stall."""
    import pybk.server.process as process_module

    store = MemoryMetadataStore()
    seen: list[tuple[bool, bool]] = []
    process: BookieProcess | None = None

    def tune() -> None:
        assert process is not None
        seen.append((process.loop_watch._handle is not None, process._registered))

    monkeypatch.setattr(process_module, "tune_gc_for_server", tune)
    config = BookieProcessConfig(data_dir=str(tmp_path / "b1"), metadata="memory://", port=0,
                                 bookie_id="b1", bookie_config=BookieConfig(
                                     disk_check_interval=0))
    process = BookieProcess(config, store=store)
    await process.start(tune_gc=True)
    try:
        assert seen == [(False, False)]  # tuned with the watch not started, nobody registered
        assert process.loop_watch._handle is not None and len(await store.list_bookies()) == 1
    finally:
        await process.stop()
