"""Segments built away from the log (SegmentBuilder) and published in one compare-and-set:
what readers see, how a publish meets a live writer (refused, or fenced with fence_writer),
idempotency (same ledgers, same origin, a sink's replayed batch), and bad descriptions refused
before anything changes."""

from __future__ import annotations

import dataclasses

import pytest
from logs_kit import MetaOps, mem_cluster

from pybk.errors import (
    EndOfStreamError,
    LedgerFencedError,
    NoSuchLedgerError,
    RecordTooLargeError,
    WriterConflictError,
)
from pybk.logs import COMPLETED, BuiltSegment, LogMetadata, Position
from pybk.metadata.memory import MemoryMetadataStore


async def _read_all(log, stop_at=None):  # type: ignore[no-untyped-def]
    last = stop_at or await log.last_position()
    if last is None:
        return []
    async with log.reader(stop_at=last) as r:
        out = []
        while True:
            batch = await r.read_batch(1000)
            if not batch:
                return out
            out.extend(batch)


async def _build(log, records, keys=None, **knobs):  # type: ignore[no-untyped-def]
    b = await log.segment_builder(**knobs)
    await b.append_many(records, keys)
    return b, await b.finish()


async def test_two_builders_publish_in_one_cas_and_readers_see_all_in_order() -> None:
    ops = MetaOps()
    async with mem_cluster(metadata=MemoryMetadataStore(before_op=ops)) as cluster:
        ns = cluster.client().namespace()
        log = await ns.create_log("bulk", compression="zstd")
        _, first = await _build(log, [b"a%d" % i for i in range(2500)], flush_records=1000)
        keys = [b"k%d" % i if i % 3 else None for i in range(1200)]
        _, second = await _build(log, [b"b%d" % i for i in range(1200)], keys)
        assert [s.records for s in first] == [2500] and first[0].last_entry == 2
        assert first[0].last_slot == 499
        assert await _read_all(log) == []  # built, not yet visible
        before = ops.counts.get("write_value", 0)
        result = await log.publish(first + second, origin="job-1")
        assert ops.counts.get("write_value", 0) - before == 1  # one CAS
        assert result.published and [s.seq for s in result.segments] == [1, 2]
        assert result.first_position == Position(1, 0, 0)
        assert result.last_position == Position(2, second[0].last_entry, second[0].last_slot)
        assert result.records == 3700
        recs = await _read_all(log)
        assert [r.data for r in recs] == ([b"a%d" % i for i in range(2500)]
                                          + [b"b%d" % i for i in range(1200)])
        assert [r.key for r in recs[2500:]] == keys
        assert all(r.key is None for r in recs[:2500])
        assert [r.position for r in recs] == sorted(r.position for r in recs)
        segs = await log.segments()
        assert [(s.state, s.origin) for s in segs] == [(COMPLETED, "job-1")] * 2


async def test_publish_waits_for_no_live_writer_unless_fencing() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer()
        await w.append_many([b"w1", b"w2"])
        _, built = await _build(log, [b"p1", b"p2"])
        md_before = await log.metadata()
        with pytest.raises(WriterConflictError, match="in-progress segment"):
            await log.publish(built)
        assert (await log.metadata()).segments == md_before.segments  # nothing changed
        await w.close()
        result = await log.publish(built)
        assert result.published
        # a writer opened after the publish writes after the published records
        async with await log.writer() as w2:
            await w2.append(b"w3")
        assert [r.data for r in await _read_all(log)] == [b"w1", b"w2", b"p1", b"p2", b"w3"]


async def test_fence_writer_completes_the_live_writers_segment_first() -> None:
    async with mem_cluster() as cluster:
        log = await cluster.client().namespace().create_log("l")
        w = await log.writer()
        acked = await w.append_many([b"w%d" % i for i in range(5)])
        _, built = await _build(log, [b"p1"])
        result = await log.publish(built, fence_writer=True)
        assert result.published
        with pytest.raises(LedgerFencedError):
            await w.append(b"late")
        recs = await _read_all(log)
        assert [r.data for r in recs] == [b"w0", b"w1", b"w2", b"w3", b"w4", b"p1"]
        assert [r.position for r in recs[:5]] == acked
        await w.close()


async def test_publish_is_idempotent_for_ledgers_origin_and_sink_batches() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l")
        _, built = await _build(log, [b"x"])
        assert (await log.publish(built, origin="o")).published
        again = await log.publish(built, origin="o")  # the same ledgers: a lost reply
        assert not again.published and again.segments[0].ledger_id == built[0].ledger_id
        _, copy = await _build(log, [b"x"])  # a re-run of the same origin: a replay
        replay = await log.publish(copy, origin="o")
        assert not replay.published and replay.segments[0].ledger_id == built[0].ledger_id
        with pytest.raises(NoSuchLedgerError):
            await client.ledger_metadata(copy[0].ledger_id)  # the replay's copy is deleted
        # a sink's batches: each once, in order; a replayed or older batch is dropped
        for batch, expect in ((3, True), (3, False), (2, False), (4, True)):
            _, seg = await _build(log, [b"s%d" % batch])
            r = await log.publish(seg, sink=("query-a", batch))
            assert r.published is expect, batch
            if not expect:
                assert r.segments == ()
                with pytest.raises(NoSuchLedgerError):
                    await client.ledger_metadata(seg[0].ledger_id)
        # an empty batch still records its id
        assert (await log.publish([], sink=("query-a", 5))).published
        md = await log.metadata()
        assert md.sinks["query-a"][0] == 5
        assert [r.data for r in await _read_all(log)] == [b"x", b"s3", b"s4"]


async def test_bad_descriptions_are_refused_before_anything_changes() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        ns = client.namespace()
        log = await ns.create_log("l")
        other = await ns.create_log("other")
        _, built = await _build(log, [b"a", b"b", b"c"])
        _, foreign = await _build(other, [b"z"])
        seg = built[0]
        before = await log.metadata()
        bad = [
            (dataclasses.replace(seg, records=4), "ends at record 3"),
            (dataclasses.replace(seg, last_slot=0), "slot 2"),
            (dataclasses.replace(seg, bytes=seg.bytes + 1), "bytes"),
            (dataclasses.replace(seg, ledger_id=10**9), "does not exist"),
            (foreign[0], "tagged for"),
        ]
        for desc, words in bad:
            with pytest.raises(ValueError, match=words):
                await log.publish([desc])
        open_lh = await client.create_ledger(3, 2, 2, custom_metadata={
            "pybk.log": b"logs/default/l"})
        await open_lh.append(b"junk")
        with pytest.raises(ValueError, match="OPEN"):
            await log.publish([BuiltSegment(open_lh.id, 0, 0, 1, 4)])
        with pytest.raises(ValueError, match="named twice"):
            await log.publish([seg, seg])
        with pytest.raises(TypeError):
            await log.publish([seg.to_doc()])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="sink batch id"):
            await log.publish([seg], sink=("s", -1))
        after = await log.metadata()
        assert after.segments == before.segments and after.next_seq == before.next_seq
        assert (await log.publish([seg])).published  # the good description still works


async def test_an_ended_log_refuses_and_retention_runs_after_a_publish() -> None:
    async with mem_cluster() as cluster:
        ns = cluster.client().namespace()
        log = await ns.create_log("kept", retention_bytes=60)  # one 38-byte segment fits
        for i in range(3):
            _, built = await _build(log, [b"r%d" % i])
            await log.publish(built)
        # retention keeps only the newest completed segment
        assert [r.data for r in await _read_all(log)] == [b"r2"]
        assert len([s for s in await log.segments() if s.state == COMPLETED]) == 1
        ended = await ns.create_log("ended")
        async with await ended.writer() as w:
            await w.append(b"last")
            await w.mark_end_of_stream()
        _, built = await _build(ended, [b"more"])
        with pytest.raises(EndOfStreamError):
            await ended.publish(built)


async def test_builder_rolls_checks_sizes_and_abort_deletes_its_ledgers() -> None:
    async with mem_cluster() as cluster:
        client = cluster.client()
        log = await client.namespace().create_log("l", roll_entries=2)
        b = await log.segment_builder(flush_records=10)
        await b.append_many([b"%d" % i for i in range(55)])
        built = await b.finish()
        assert [s.records for s in built] == [20, 20, 15]
        assert (await log.publish(built)).published
        assert [r.data for r in await _read_all(log)] == [b"%d" % i for i in range(55)]

        b = await log.segment_builder(max_envelope_bytes=1024)
        with pytest.raises(RecordTooLargeError):
            await b.append_many([b"x" * 2000])
        with pytest.raises(ValueError, match="add up"):
            await b.add_packed(2, b"\x01\x00\x00\x00\x01\x00\x00\x00", b"abc")
        with pytest.raises(TypeError):
            await b.append_many(["text"])  # type: ignore[list-item]
        await b.append_many([b"y"] * 30)
        made = b.ledger_ids
        assert made
        await b.abort()
        for lid in made:
            with pytest.raises(NoSuchLedgerError):
                await client.ledger_metadata(lid)


def test_metadata_record_keeps_origins_and_sinks_and_stays_format_1_without_them() -> None:
    plain = LogMetadata("ns", "l")
    data = plain.to_bytes()
    assert b"sinks" not in data and b"origin" not in data
    md = plain.with_changes(sinks={"q": (7, 123)})
    back = LogMetadata.from_bytes(md.to_bytes())
    assert back.sinks == {"q": (7, 123)}


async def test_create_ledger_under_an_id_taken_beforehand() -> None:
    from pybk.errors import LedgerExistsError

    async with mem_cluster() as cluster:
        client = cluster.client()
        lid = await client.store.allocate_ledger_id()
        lh = await client.create_ledger(3, 2, 2, ledger_id=lid)
        assert lh.id == lid
        await lh.append(b"x")
        await lh.close()
        with pytest.raises(LedgerExistsError):
            await client.create_ledger(3, 2, 2, ledger_id=lid)
        for bad in (-1, True, "7"):
            with pytest.raises(ValueError, match="ledger_id"):
                await client.create_ledger(3, 2, 2, ledger_id=bad)  # type: ignore[arg-type]
        assert await client.list_ledgers() == [lid]
