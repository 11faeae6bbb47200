"""An offload whose process dies mid-upload on S3 leaves a multipart upload: no listing of
objects shows it and the store keeps its parts. The orphan sweep lists such uploads under the
log's folder and aborts those of attempts no segment records, sparing recorded ones (a real
S3-compatible server, and a child process killed in the middle of production's upload)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from logs_kit import mem_cluster
from tier_kit import moto_server

pytest.importorskip("s3fs")
pytestmark = pytest.mark.timeout(120)

#: a child that uploads an attempt's data object through production's TierStore, 5 MiB
#: parts, and dies (no close, no abort) once two parts are sent
CRASHING_UPLOAD = """
import os, sys
from pybk.logs.tier_store import TierStore
store = TierStore(sys.argv[1], {"endpoint_url": sys.argv[2], "skip_instance_cache": True,
                                "default_block_size": 5 << 20})
def chunks():
    yield [b"x" * (6 << 20)]
    yield [b"y" * (6 << 20)]
    os._exit(0)
store.write_data(sys.argv[3], chunks())
"""


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    with moto_server() as endpoint:
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        fs.mkdir("tier-bucket")
        yield fs, endpoint


def _uploads(fs) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(u["Key"] for u in fs.list_multipart_uploads("tier-bucket"))


async def test_a_crashed_upload_is_aborted_and_a_recorded_attempts_upload_spared(
        s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fs, endpoint = s3
    url = "s3://tier-bucket/logs"
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l", roll_entries=3)
        async with await log.writer() as w:
            last = [await w.append(b"rec-%d" % i) for i in range(6)][-1]
        await log.set_offload(url, options={"endpoint_url": endpoint}, deletion_lag=0)
        assert await log.offload() == [1, 2]
        recorded = [s for s in await log.segments() if s.offload is not None]
        kept = f"logs/default/l/{recorded[0].seq}-{recorded[0].ledger_id}-" \
               f"{recorded[0].offload.uid}.data"
        # an upload under a recorded attempt's name (as an offload in progress has)
        fs.call_s3("create_multipart_upload", Bucket="tier-bucket", Key=kept)
        # an attempt no segment records, its uploader killed in the middle
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CRASHING_UPLOAD, url, endpoint,
            "tier-bucket/logs/default/l/9-99-deadbeef", env={**os.environ},
            stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(child.communicate(), 60)
        assert child.returncode == 0, err.decode()[-2000:]
        orphan = "logs/default/l/9-99-deadbeef.data"
        assert _uploads(fs) == sorted([kept, orphan])
        fs.invalidate_cache()
        assert not fs.exists(f"tier-bucket/{orphan}")  # no object: only the upload's parts

        assert await log.sweep_tier(grace=0) == ["tier-bucket/logs/default/l/9-99-deadbeef"]
        assert _uploads(fs) == [kept]
        assert await log.sweep_tier(grace=0) == []  # nothing left to sweep
        async with log.reader(stop_at=last) as r:
            assert [rec.data async for rec in r] == [b"rec-%d" % i for i in range(6)]


async def test_a_local_folder_has_no_uploads_to_abort(tmp_path: Path) -> None:
    from pybk.logs.tier_store import TierStore

    assert TierStore(f"file://{tmp_path}").list_uploads("default", "l") == []
