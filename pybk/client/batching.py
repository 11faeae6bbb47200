"""How a run of entries is cut into add batches: one rule for the writer's sends
(:mod:`pybk.client.pipeline`) and re-replication's copies (:mod:`pybk.ops.replicator`), so
both respect ``ClientConfig``'s batch limits the same way."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["batch_spans"]


def batch_spans(bodies: Sequence[bytes], max_entries: int, max_bytes: int,
                ) -> list[tuple[int, int]]:
    """The ``(start, end)`` index spans that cut ``bodies`` (in order) into add batches of
    at most ``max_entries`` entries and ``max_bytes`` bytes (``ClientConfig``'s batch limits;
    a body over ``max_bytes`` is a batch of its own): the writer's sends and re-replication's
    copies are cut the same way."""
    spans = []
    start = size = 0
    for k, body in enumerate(bodies):
        n = len(body)
        if k > start and (k - start >= max_entries or size + n > max_bytes):
            spans.append((start, k))
            start, size = k, 0
        size += n
    if bodies:
        spans.append((start, len(bodies)))
    return spans
