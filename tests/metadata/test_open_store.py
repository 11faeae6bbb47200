"""Metadata URIs: each backend's form opens it; anything else is a ValueError naming the URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from pybk.metadata import MemoryMetadataStore, open_store
from pybk.metadata.sqlite import SqliteMetadataStore
from pybk.metadata.zookeeper import ZooKeeperMetadataStore


@pytest.mark.parametrize(
    "uri",
    [
        "nonsense",
        "memory://a/b",
        "sqlite://relative.db",
        "sqlite:///",
        "sqlite:///some/dir/",
        "zk://",
        "zk://host:2181",
        "zk://host:2181/",
        "zk://host/root",
        "zk://host:99999/root",
        "zk://host:2181,:2182/root",
        "redis://x",
    ],
)
def test_bad_uri_is_a_value_error_naming_it(uri: str) -> None:
    with pytest.raises(ValueError, match="bad metadata URI") as info:
        open_store(uri)
    assert repr(uri) in str(info.value)


def test_non_string_uri_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        open_store(42)  # type: ignore[arg-type]


async def test_each_form_opens_its_backend(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), MemoryMetadataStore)
    sq = open_store(f"sqlite://{tmp_path}/m.db", ttl=3.0, heartbeat_interval=1.0)
    assert isinstance(sq, SqliteMetadataStore)
    assert sq.path == f"{tmp_path}/m.db" and sq.ttl == 3.0
    await sq.close()
    zk = open_store("zk://127.0.0.1:2181,127.0.0.2:2182/pybk/prod/", session_timeout=6.0)
    assert isinstance(zk, ZooKeeperMetadataStore)  # constructing it does not connect
    assert zk.hosts == "127.0.0.1:2181,127.0.0.2:2182"
    assert zk.root == "/pybk/prod" and zk.session_timeout == 6.0
    await zk.close()
