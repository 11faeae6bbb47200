"""Knobs no bookie can run with are refused when the config is made, naming the knob."""

from __future__ import annotations

import math

import pytest

from pybk.bookie import BookieConfig
from pybk.storage.store import StoreConfig


@pytest.mark.parametrize(("knob", "value"), [
    ("journal_max_wait", -0.001),
    ("journal_max_wait", math.nan),
    ("journal_max_batch_bytes", 0),
    ("journal_max_batch_count", 0),
    ("journal_inline_sync_max", -1),
    ("journal_overlap_split_min", 0),
    ("segment_size", 0),
    ("segment_size", "64M"),
    ("segment_size", True),
    ("journal_zero_fill_below", -1.0),
    ("compaction_threshold", 1.5),
    ("compaction_threshold", -0.1),
    ("checkpoint_delta_ratio", -1.0),
    ("checkpoint_max_deltas", -1),
])
def test_a_knob_out_of_range_is_refused_by_name(knob, value):
    for cls in (StoreConfig, BookieConfig):
        with pytest.raises(ValueError, match=knob):
            cls(**{knob: value})


@pytest.mark.parametrize(("low", "high"), [(0.95, 0.9), (-0.1, 0.9), (0.9, 1.1),
                                           (math.nan, 0.9)])
def test_disk_watermarks_must_be_ordered_fractions(low, high):
    with pytest.raises(ValueError, match="disk_usage_low_water <= disk_usage_threshold"):
        BookieConfig(disk_usage_low_water=low, disk_usage_threshold=high)


def test_the_defaults_and_the_edges_are_accepted():
    BookieConfig()
    StoreConfig(segment_size=1, journal_max_wait=0.0, compaction_threshold=1.0,
                checkpoint_max_deltas=0)
    BookieConfig(disk_usage_low_water=0.0, disk_usage_threshold=0.0, disk_check_interval=-1,
                 checkpoint_interval=0)
