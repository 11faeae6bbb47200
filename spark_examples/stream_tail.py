"""Structured Streaming over a log that an application keeps writing: the ``pybk`` source
follows the tail (offsets are positions), the ``pybk`` sink copies every micro-batch into a
second log exactly once; the query is stopped mid-way and restarted from its checkpoint while
the writer goes on, and ends with ``trigger(availableNow=True)``.

    .venv/bin/python spark_examples/stream_tail.py [--records 20000] [--metadata URI]
"""

from __future__ import annotations

import asyncio
import collections
import tempfile
import threading
import time

from _cluster import arguments, bookies, check, session

import pybk


async def _records(metadata: str, name: str) -> list[pybk.LogRecord]:
    async with pybk.Client(metadata) as client:
        log = await client.namespace().open_log(name)
        last = await log.last_position()
        if last is None:
            return []
        out: list[pybk.LogRecord] = []
        async with log.reader(stop_at=last) as reader:
            while batch := await reader.read_batch(10_000):
                out.extend(batch)
        return out


async def _create(metadata: str, *names: str) -> None:
    async with pybk.Client(metadata) as client:
        for name in names:
            await client.namespace().create_log(name)


def _writer(metadata: str, name: str, total: int, done: threading.Event,
            paced_by: threading.Semaphore) -> None:
    """The application: appends `total` records with the log's own writer, 200 at a time,
    one chunk each time the main thread lets it (so it writes while queries run and stop)."""

    async def go() -> None:
        async with pybk.Client(metadata) as client:
            log = await client.namespace().open_log(name)
            async with await log.writer(label="app") as w:
                for i in range(0, total, 200):
                    await asyncio.to_thread(paced_by.acquire)
                    await w.append_many([b"reading-%06d" % j for j in range(i, i + 200)])
        done.set()

    asyncio.run(go())


def main() -> None:
    args = arguments(__doc__, records=(int, 20_000, "records the application writes"))
    with bookies(args.metadata) as metadata:
        stamp = int(time.time())
        src, dst = f"sensors-{stamp}", f"sensors-copy-{stamp}"
        asyncio.run(_create(metadata, src, dst))
        checkpoint = tempfile.mkdtemp(prefix="pybk-stream-checkpoint-")
        done, pace = threading.Event(), threading.Semaphore(0)
        app = threading.Thread(target=_writer, args=(metadata, src, args.records, done, pace))
        app.start()
        pace.release(10)  # 2000 records before the query starts
        spark = session(args.master, "pybk stream_tail")

        def query(available_now: bool = False) -> object:
            stream = (spark.readStream.format("pybk").option("metadata", metadata)
                      .option("log", src).option("maxRecordsPerTrigger", "2500").load())
            w = (stream.select("key", "value").writeStream.format("pybk")
                 .option("metadata", metadata).option("log", dst)
                 .option("checkpointLocation", checkpoint))
            return (w.trigger(availableNow=True) if available_now else w).start()

        try:
            q = query()
            for _ in range(args.records // 200 // 2 - 10):  # the app writes while it runs
                pace.release()
            q.processAllAvailable()
            q.stop()
            copied = len(asyncio.run(_records(metadata, dst)))
            print(f"first run stopped after copying {copied} records")
            pace.release(10)  # the app goes on while no query runs
            q = query()
            pace.release(args.records)  # and until the end
            done.wait(300)
            q.processAllAvailable()
            q.stop()
            query(available_now=True).awaitTermination(300)
        finally:
            pace.release(args.records)
            app.join(300)
            spark.stop()
        written = asyncio.run(_records(metadata, src))
        copied_recs = asyncio.run(_records(metadata, dst))
        check(len(written) == args.records, f"the application wrote {args.records} records")
        counts = collections.Counter(r.data for r in copied_recs)
        check(counts == collections.Counter(r.data for r in written),
              "the sink holds every record exactly once across the stop and restart")
        check([r.data for r in copied_recs] == [r.data for r in written],
              "and in the log's order")


if __name__ == "__main__":
    main()
