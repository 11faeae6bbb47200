"""Which ledgers a Spark job's tasks made, so that none is left behind whatever fails.

A job (a batch write, one micro-batch of a streaming write, a ``write_partitions`` call) has
a record in the metadata store's key/value namespace, and each task attempt a list of the
ledger ids it made::

    spark/jobs/<job>           {"log", "state": open | committed | aborted, "ctime_ms", "mtime_ms"}
    spark/tasks/<job>/<task>   {"ledgers": [ids]}    (task: p<partition>-a<attempt>)

A batch write's job is a random id; a streaming sink's micro-batch ``N`` run by query run ``R``
is ``<sink>.b<N>/<R>`` (``<sink>`` a hash of the sink id), so that every run's attempt at a
batch can be listed (``list_jobs(store, "<sink>.b<N>")``).

Design notes: docs/internals.md, "pybk/spark/jobs.py".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pybk.errors import BKError, KeyExistsError, LogNotFoundError, NoSuchKeyError, NoSuchLedgerError
from pybk.logs.meta import LogMetadata

if TYPE_CHECKING:
    from pybk.client import Client
    from pybk.client.writer import LedgerHandle
    from pybk.logs.config import LogConfig
    from pybk.metadata.base import MetadataStore

__all__ = [
    "ABORTED",
    "COMMITTED",
    "OPEN",
    "JobClosedError",
    "JobInfo",
    "TaskLedgers",
    "begin_job",
    "finish_job",
    "forget_jobs",
    "job_state",
    "list_jobs",
    "sweep_job",
    "sweep_stale_jobs",
]

log = logging.getLogger(__name__)

OPEN = "open"
COMMITTED = "committed"
ABORTED = "aborted"
JOBS = "spark/jobs"
TASKS = "spark/tasks"
#: how long a finished job's record stays for stragglers to read (ms)
FINISHED_TTL_MS = 3_600_000
#: finished records removed per job start at most (the rest go at later starts)
_EXPIRE_BATCH = 100


class JobClosedError(RuntimeError):
    """This task attempt belongs to a job that was committed or aborted while it ran (a
    straggler or a speculative copy): what it made is deleted and it fails."""


@dataclass(frozen=True)
class JobInfo:
    job: str
    log: str
    state: str
    ctime_ms: int
    mtime_ms: int

    def to_bytes(self) -> bytes:
        return json.dumps({"log": self.log, "state": self.state, "ctime_ms": self.ctime_ms,
                           "mtime_ms": self.mtime_ms}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, job: str, data: bytes) -> JobInfo:
        doc = json.loads(data)
        return cls(job, str(doc["log"]), str(doc["state"]), int(doc["ctime_ms"]),
                   int(doc["mtime_ms"]))


def job_key(job: str) -> str:
    return f"{JOBS}/{job}"


def task_key(job: str, task: str) -> str:
    return f"{TASKS}/{job}/{task}"


async def begin_job(client: Client, job: str, log_key: str, now_ms: int) -> None:
    """Record a new job as open (the driver, before any task runs); expire old finished
    job records on the way."""
    info = JobInfo(job, log_key, OPEN, now_ms, now_ms)
    try:
        await client.store.create_value(job_key(job), info.to_bytes())
    except KeyExistsError:
        pass  # a retried start of the same job
    await _expire(client, now_ms)


async def _expire(client: Client, now_ms: int) -> None:
    """Remove finished jobs' records an hour on, sweeping their task lists once more first
    (a straggler killed before it cleaned up left its list, perhaps a ledger)."""
    store = client.store
    removed = 0
    for key in await store.list_keys(JOBS + "/"):
        if removed >= _EXPIRE_BATCH:
            return
        try:
            value = await store.read_value(key)
            info = JobInfo.from_bytes(key[len(JOBS) + 1 :], value.value)
        except NoSuchKeyError:
            continue
        except (ValueError, KeyError) as exc:
            log.warning("spark job record %s is unreadable (%s); left alone", key, exc)
            continue
        if info.state != OPEN and now_ms - info.mtime_ms > FINISHED_TTL_MS:
            await sweep_job(client, info.job, info.log)
            try:
                await store.delete_value(key, value.version)
                removed += 1
            except (NoSuchKeyError, BKError):
                continue


async def list_jobs(store: MetadataStore, group: str) -> list[str]:
    """The jobs named ``<group>/<name>`` (a streaming sink's runs of one micro-batch)."""
    prefix = f"{JOBS}/{group}/"
    return [k[len(JOBS) + 1 :] for k in await store.list_keys(prefix)]


async def forget_jobs(client: Client, group: str) -> None:
    """Delete the records of the jobs named ``<group>/<name>`` (finished long ago), sweeping
    their task lists once more first."""
    store = client.store
    for job in await list_jobs(store, group):
        try:
            info = JobInfo.from_bytes(job, (await store.read_value(job_key(job))).value)
        except NoSuchKeyError:
            continue
        await sweep_job(client, job, info.log)
        try:
            await store.delete_value(job_key(job))
        except NoSuchKeyError:
            pass


async def job_state(store: MetadataStore, job: str) -> str | None:
    """The job's state, or None when it has no record (expired, or never begun)."""
    try:
        value = await store.read_value(job_key(job))
    except NoSuchKeyError:
        return None
    return JobInfo.from_bytes(job, value.value).state


async def finish_job(store: MetadataStore, job: str, log_key: str, state: str,
                     now_ms: int) -> None:
    """Mark the job committed or aborted (creating the record if it has none)."""
    if state not in (COMMITTED, ABORTED):
        raise ValueError(f"a job finishes committed or aborted, not {state!r}")
    key = job_key(job)

    def change(value: Any) -> bytes | None:
        info = JobInfo.from_bytes(job, value.value)
        if info.state == state:
            return None
        return JobInfo(job, info.log, state, info.ctime_ms, now_ms).to_bytes()

    try:
        await store.update_value(key, change)
    except NoSuchKeyError:
        try:
            await store.create_value(key, JobInfo(job, log_key, state, now_ms, now_ms)
                                     .to_bytes())
        except KeyExistsError:
            await store.update_value(key, change)


async def sweep_job(client: Client, job: str, log_key: str) -> list[int]:
    """Delete every ledger the job's tasks listed that is not a segment of the log, then the
    lists; the ids deleted. Call it only once the job is marked committed or aborted."""
    store = client.store
    try:
        value = await store.read_value(log_key)
        md = LogMetadata.from_bytes(value.value, value.version)
        kept = {s.ledger_id for s in md.segments}
    except (NoSuchKeyError, LogNotFoundError):
        kept = set()
    deleted: list[int] = []
    for key in await store.list_keys(f"{TASKS}/{job}/"):
        try:
            listed = json.loads((await store.read_value(key)).value)["ledgers"]
        except NoSuchKeyError:
            continue
        for lid in listed:
            if int(lid) in kept:
                continue
            try:
                await client.delete_ledger(int(lid))
                deleted.append(int(lid))
            except NoSuchLedgerError:
                pass  # listed before it was made, never made; or already deleted
        try:
            await store.delete_value(key)
        except NoSuchKeyError:
            pass
    return deleted


async def sweep_stale_jobs(client: Client, older_than_ms: int, now_ms: int) -> dict[str, list[int]]:
    """Abort and sweep every job still open ``older_than_ms`` after it began (its driver
    died before committing or aborting it); {job: ledger ids deleted}. A job that is still
    running that long is aborted too: choose the age above your longest job."""
    store = client.store
    out: dict[str, list[int]] = {}
    for key in await store.list_keys(JOBS + "/"):
        job = key[len(JOBS) + 1 :]
        try:
            info = JobInfo.from_bytes(job, (await store.read_value(key)).value)
        except NoSuchKeyError:
            continue
        if info.state == OPEN and now_ms - info.ctime_ms > older_than_ms:
            await finish_job(store, job, info.log, ABORTED, now_ms)
            out[job] = await sweep_job(client, job, info.log)
    return out


class TaskLedgers:
    """The task side: makes ledgers for a :class:`~pybk.logs.SegmentBuilder`, each listed
    under the task before it exists, and refuses once the job is no longer open."""

    def __init__(self, client: Client, job: str, task: str, log_key: str,
                 config: LogConfig) -> None:
        self.client = client
        self.job = job
        self.task = task
        self.log_key = log_key
        self.config = config
        self.ledgers: list[int] = []

    async def start(self, now_ms: int) -> None:
        """Before the first ledger: the job's record (made here if the driver did not make
        one, as for a streaming micro-batch) must be open."""
        info = JobInfo(self.job, self.log_key, OPEN, now_ms, now_ms)
        try:
            await self.client.store.create_value(job_key(self.job), info.to_bytes())
        except KeyExistsError:
            pass
        await self.check_open()

    async def check_open(self) -> None:
        state = await job_state(self.client.store, self.job)
        if state != OPEN:
            raise JobClosedError(
                f"spark job {self.job} is {state or 'gone'}: task attempt {self.task} is a "
                "straggler; what it wrote is deleted"
            )

    async def _list(self, ledger_id: int) -> None:
        store = self.client.store
        key = task_key(self.job, self.task)
        doc = json.dumps({"ledgers": [*self.ledgers, ledger_id]}).encode()
        try:
            await store.create_value(key, doc)
        except KeyExistsError:  # a list from an earlier run of this attempt's code
            await store.update_value(
                key, lambda v: json.dumps({"ledgers": sorted(
                    {*json.loads(v.value)["ledgers"], *self.ledgers, ledger_id})}).encode())
        self.ledgers.append(ledger_id)

    async def create(self, custom_metadata: Mapping[str, bytes]) -> LedgerHandle:
        """Take an id, list it, create the ledger under it, then check the job is open."""
        cfg = self.config
        lid = await self.client.store.allocate_ledger_id()
        await self._list(lid)
        lh = await self.client.create_ledger(
            cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum, cfg.digest_type, b"",
            custom_metadata=custom_metadata, ledger_id=lid,
        )
        try:
            await self.check_open()
        except JobClosedError:
            await self.delete_all()
            raise
        return lh

    async def delete_all(self) -> None:
        """Delete every ledger this attempt made (it failed, or the job closed), then its
        list (the ledgers first: a list outlives what it names, never the reverse)."""
        for lid in self.ledgers:
            try:
                await self.client.delete_ledger(lid)
            except NoSuchLedgerError:
                pass
        try:
            await self.client.store.delete_value(task_key(self.job, self.task))
        except NoSuchKeyError:
            pass
