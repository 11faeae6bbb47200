"""The ZooKeeperServer test helper: loud failures, stop by PID, restart on the same port."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pybk.testing.zookeeper import ZooKeeperServer, ZooKeeperUnavailable, four_letter_word


def test_missing_java_fails_loudly_naming_the_fix(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path, java=str(tmp_path / "no-java"))
    with pytest.raises(ZooKeeperUnavailable, match="zookeeper package"):
        server.start()


def test_missing_jar_fails_loudly_naming_the_fix(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path, jar=str(tmp_path / "missing.jar"))
    with pytest.raises(ZooKeeperUnavailable, match=r"missing\.jar"):
        server.start()


def test_restart_keeps_port_and_data_and_stop_ends_the_process(tmp_path: Path) -> None:
    from kazoo.client import KazooClient

    with ZooKeeperServer(tmp_path) as server:
        port, first_pid = server.port, server.pid
        assert first_pid is not None
        zk = KazooClient(hosts=server.hosts)
        zk.start(timeout=10)
        zk.create("/kept", b"value")
        zk.stop()
        zk.close()
        server.restart()
        assert server.port == port and server.pid not in (None, first_pid)
        reply = four_letter_word(server.host, server.port, "srvr")
        assert reply is not None and reply.startswith("Zookeeper version:")
        zk = KazooClient(hosts=server.hosts)
        zk.start(timeout=10)
        assert zk.get("/kept")[0] == b"value"
        zk.stop()
        zk.close()
        last_pid = server.pid
        assert last_pid is not None
    # the context manager stopped it: the PID is gone, nothing answers on the port
    with pytest.raises(ProcessLookupError):
        os.kill(last_pid, 0)
    assert four_letter_word("127.0.0.1", port, "srvr", timeout=0.5) is None


def test_a_taken_auto_port_is_replaced_but_an_explicit_one_fails_loudly(tmp_path: Path) -> None:
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        explicit = ZooKeeperServer(tmp_path / "explicit", port=taken)
        with pytest.raises(ZooKeeperUnavailable, match=f"port {taken}"):
            explicit.start()
        explicit.close()
        auto = ZooKeeperServer(tmp_path / "auto")
        auto.port = taken  # as if another process grabbed the chosen port first
        try:
            auto.start()
            assert auto.port != taken
            reply = four_letter_word(auto.host, auto.port, "srvr")
            assert reply is not None and reply.startswith("Zookeeper version:")
        finally:
            auto.close()
