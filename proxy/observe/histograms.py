"""Histograms fed in batches at scrape time, and the client-side latency series.

``firstbyte_client_first_byte_seconds`` and ``firstbyte_client_duration_seconds`` are what a
client felt, per route and status: from the request's arrival to the first body byte sent
back, and to the end of the response (a stream's whole length). They are the series an SLO is
written on; ``firstbyte_first_chunk_seconds`` is the upstream's side of the same story.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from typing import cast

from aioprometheus import Histogram, Registry, histogram

__all__ = ["CLIENT_BUCKETS", "ClientLatency", "observe_many"]

CLIENT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class ClientLatency:
    """The two client-side histograms; exchanges are noted as they finish and applied per scrape."""

    def __init__(self, registry: Registry) -> None:
        self.first_byte = Histogram(
            "firstbyte_client_first_byte_seconds",
            "Time from a routed request's arrival to the first byte of its answer, as the client saw it.",
            registry=registry, buckets=CLIENT_BUCKETS)
        self.duration = Histogram(
            "firstbyte_client_duration_seconds",
            "Time from a routed request's arrival to the end of its answer (a stream's whole length).",
            registry=registry, buckets=CLIENT_BUCKETS)
        self._seen: list[tuple[str | None, int, float | None, float]] = []

    @property
    def pending(self) -> int:
        return len(self._seen)

    def note(self, route: str | None, status: int, first_byte: float | None, total: float) -> None:
        self._seen.append((route, status, first_byte, total))

    def apply(self, route_of: Callable[[str | None], str], status_of: Callable[[int], str]) -> None:
        """Hand what was noted to the histograms, labels bounded by the metrics' own rules."""
        seen, self._seen = self._seen, []
        firsts: dict[tuple[str, str], list[float]] = {}
        totals: dict[tuple[str, str], list[float]] = {}
        for route, status, first_byte, total in seen:
            key = (route_of(route), status_of(status))
            if first_byte is not None and first_byte >= 0:
                firsts.setdefault(key, []).append(first_byte)
            if total >= 0:
                totals.setdefault(key, []).append(total)
        for series, grouped in ((self.first_byte, firsts), (self.duration, totals)):
            for (route_label, status_label), values in grouped.items():
                observe_many(series, {"route": route_label, "status": status_label}, values)


def observe_many(collector: Histogram, labels: dict[str, str], values: list[float]) -> None:
    """Many observations into one labelled histogram: its label lookup once, buckets by bisection
    (``Histogram.observe`` walks every bucket and checks the labels for each value)."""
    collector.observe(labels, values[0])  # creates the series when it is new
    h = cast(histogram.Histogram, collector.get_value(labels))
    bounds = list(h.buckets)
    per_bucket = [0] * len(bounds)
    for value in values[1:]:
        per_bucket[bisect_left(bounds, value)] += 1
    running = 0
    for bound, n in zip(bounds, per_bucket, strict=True):
        running += n
        h.buckets[bound] += running
    h.sum += math.fsum(values[1:])
    h.observations += len(values) - 1
