"""Prometheus metrics of bookies, clients and auto-recovery (scraped from a registry)."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pybk.client.context import ClientConfig
from pybk.cluster import LocalCluster
from pybk.ops import AutoRecoveryConfig
from pybk.stats import Histogram
from pybk.storage.memfs import MemFileSystem
from pybk.testing.metadata_helpers import wait_until


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_histogram_buckets_are_cumulative_and_bounded() -> None:
    h = Histogram((1.0, 2.0, 5.0))
    for v in (0.5, 1.0, 1.5, 3.0, 9.0):
        h.observe(v)
    h.observe(1.7, n=3)
    assert h.cumulative() == [("1.0", 2), ("2.0", 6), ("5.0", 7), ("+Inf", 8)]
    assert h.count == 8 and h.sum == 0.5 + 1 + 1.5 + 3 + 9 + 5.1
    assert h.quantile(0.5) == 2.0 and h.quantile(1.0) == float("inf")


async def test_bookie_client_and_autorecovery_metrics_move_with_the_work() -> None:
    registry = CollectorRegistry()
    client_registry = CollectorRegistry()
    fast = AutoRecoveryConfig(worker_poll_interval=0.2, retry_backoff=0.2,
                              ledger_check_interval=0.0)
    async with LocalCluster("/c", 4, metadata="memory://", fs=MemFileSystem(),
                            rng=random.Random(2), metrics=registry, autorecovery=True,
                            autorecovery_config=fast,
                            client_config=ClientConfig(add_timeout=2.0, read_timeout=2.0,
                                                       speculative_read_delay=0.0)) as c:
        client = c.client()
        from pybk.client import Client

        metered = Client(c.store, transport=c.transport, metrics=client_registry,
                         config=ClientConfig(add_timeout=2.0, read_timeout=2.0))
        lh = await metered.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        for _ in range(5):
            await lh.append(b"x" * 100)
        await lh.append_many([b"y" * 10] * 20)
        await lh.close()
        rh = await metered.open_ledger(lh.id, recovery=False)
        assert len(await rh.read(0, 24)) == 25
        opened = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await opened.append(b"z")
        await metered.open_ledger(opened.id)  # a recovery

        samples = scrape(client_registry)
        assert value(samples, "pybk_client_adds_total") == 6  # 5 appends + 1 append_many
        assert value(samples, "pybk_client_add_latency_seconds_count") == 6
        assert value(samples, "pybk_client_reads_total") == 1
        assert value(samples, "pybk_client_read_entries_total") == 25
        assert value(samples, "pybk_client_recoveries_total") == 1
        assert value(samples, "pybk_client_recovery_latency_seconds_count") == 1
        assert value(samples, "pybk_client_ledgers_created_total") == 1
        assert value(samples, "pybk_client_add_latency_seconds_bucket", le="+Inf") == 6

        samples = scrape(registry)
        bookies = lh.metadata.ensembles[0]
        for b in bookies:  # Qw = 3: every bookie of the ensemble stored all 25
            assert value(samples, "pybk_bookie_adds_total", bookie=b) >= 25
            assert value(samples, "pybk_bookie_add_bytes_total", bookie=b) >= 25 * 32
            assert value(samples, "pybk_bookie_writable", bookie=b) == 1
            assert value(samples, "pybk_bookie_state", bookie=b, state="writable") == 1
            assert value(samples, "pybk_bookie_disk_total_bytes", bookie=b) > 0
            assert value(samples, "pybk_journal_batch_records_count", bookie=b) >= 1
            assert value(samples, "pybk_journal_sync_latency_seconds_count", bookie=b) >= 1
            assert value(samples, "pybk_bookie_ledgers", bookie=b) >= 1
        reads = sum(value(samples, "pybk_bookie_reads_total", bookie=b) for b in bookies)
        assert reads >= 25
        assert sum(value(samples, "pybk_autorecovery_auditor", instance=b)
                   for b in c.bookie_ids) == 1

        # a lost bookie: the auditor marks, a worker copies, the counters say so
        await c.stop_bookie(bookies[0])

        async def copied() -> bool:
            s = scrape(registry)
            return sum(v for (n, _), v in s.items()
                       if n == "pybk_autorecovery_entries_copied_total") >= 25 and \
                not await c.store.list_under_replicated()

        await wait_until(copied, 20.0, "re-replication to show in the metrics")
        samples = scrape(registry)
        assert sum(v for (n, _), v in samples.items()
                   if n == "pybk_autorecovery_bytes_copied_total") > 0
        assert ("pybk_bookie_adds_total", (("bookie", bookies[0]),)) not in samples
        await metered.close()
