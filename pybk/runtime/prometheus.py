"""Prometheus metric families built from :mod:`pybk.stats` objects, shared by the collectors
that sit beside what they measure (:mod:`pybk.bookie.metrics`, :mod:`pybk.client.metrics`,
:mod:`pybk.ops.metrics`). Names are ``pybk_<component>_<what>`` with units in the name
(``_seconds``, ``_bytes``), counters ending in ``_total``; families are built per scrape, so
recording stays a field increment on the hot path."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from pybk.stats import Histogram

__all__ = ["counter", "gauge", "histogram_family", "labelled_counter"]


def histogram_family(name: str, doc: str, hist: Histogram,
                     labels: dict[str, str] | None = None) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), hist.cumulative(), hist.sum)
    return family


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def gauge(name: str, doc: str, labels: dict[str, str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def labelled_counter(name: str, doc: str, labels: dict[str, str],
                      value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family




def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)
