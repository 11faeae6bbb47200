"""Real processes: an offload that dies midway (os._exit right after its objects are written,
before the metadata says complete: a SIGKILL at the worst moment, made deterministic) leaves
the segment on the bookies; the next process's offload deletes the dead attempt's objects,
completes, and leaves no orphan; every record reads back. Against a local folder and a real
S3-compatible server (moto)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from tier_kit import moto_server

pytest.importorskip("fsspec")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHILD = textwrap.dedent("""
    import asyncio, json, os, sys
    import pybk
    from pybk.logs import tier_store

    where, url, opts, role = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]

    async def main():
        async with pybk.LocalCluster(where, 3) as cluster:  # files and SQLite under where
            ns = cluster.client().namespace()
            if role == "crash":
                log = await ns.create_log("l", roll_entries=2)
                async with await log.writer() as w:
                    for i in range(6):
                        await w.append(b"rec-%d" % i)
                await log.set_offload(url, options=opts, deletion_lag=0)
                real = tier_store.TierStore.write_index
                def die(self, path, index):
                    real(self, path, index)
                    print("uploaded", path, flush=True)
                    os._exit(9)
                tier_store.TierStore.write_index = die
                await log.offload()
            else:
                log = await ns.open_log("l")
                segs = await log.segments()
                print("before", json.dumps([[s.seq, s.tier, s.offload is not None and
                                             s.offload.complete] for s in segs]), flush=True)
                done = await log.offload()
                print("done", json.dumps(done), flush=True)
                print("swept", json.dumps(await log.sweep_tier(grace=0)), flush=True)
                last = await log.last_position()
                async with log.reader(stop_at=last) as r:
                    data = [rec.data.decode() async for rec in r]
                print("tiers", json.dumps([s.tier for s in await log.segments()]), flush=True)
                print("data", json.dumps(data), flush=True)

    asyncio.run(main())
""")


async def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    lines = {}
    for line in out.decode().splitlines():
        key, _, rest = line.partition(" ")
        lines[key] = rest
    if proc.returncode not in (0, 9):
        raise AssertionError(err.decode()[-3000:])
    return proc.returncode or 0, lines


async def _crash_and_resume(where: str, url: str, opts: str, list_objects,  # type: ignore[no-untyped-def]
                            env: dict[str, str] | None = None) -> None:
    code, lines = await _run(where, url, opts, "crash", env=env)
    assert code == 9 and "uploaded" in lines
    dead = lines["uploaded"]
    assert any(o.endswith(".index") and dead.rsplit("/", 1)[-1] in o for o in list_objects())
    code, lines = await _run(where, url, opts, "resume", env=env)
    assert code == 0
    before = json.loads(lines["before"])
    assert [tuple(x) for x in before][:1] == [(1, "bookies", False)]  # never taken as complete
    assert json.loads(lines["swept"]) == []  # the dead attempt's objects went with the retry
    assert not any(dead.rsplit("/", 1)[-1] in o for o in list_objects())
    tiers = json.loads(lines["tiers"])
    assert tiers[:3] == ["offloaded"] * 3
    assert json.loads(lines["data"]) == [f"rec-{i}" for i in range(6)]
    assert len(list_objects()) == 2 * len(json.loads(lines["done"]))


async def test_a_crashed_offload_resumes_without_orphans_on_a_folder(tmp_path: Path) -> None:
    tier = tmp_path / "tier"

    def objects() -> list[str]:
        return [str(p) for p in tier.rglob("*") if p.is_file()]

    await _crash_and_resume(str(tmp_path / "wal"), f"file://{tier}", "{}", objects)


async def test_a_crashed_offload_resumes_without_orphans_on_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3fs = pytest.importorskip("s3fs")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with moto_server() as endpoint:
        s3 = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        s3.mkdir("tier-bucket")

        def objects() -> list[str]:
            s3.invalidate_cache()
            return list(s3.find("tier-bucket/p"))

        await _crash_and_resume(str(tmp_path / "wal"), "s3://tier-bucket/p",
                                json.dumps({"endpoint_url": endpoint}), objects, env=env)
