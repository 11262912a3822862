"""Counts made on the request path as plain Python numbers, handed to prometheus_client when the
registry is collected.

Every `inc` of a prometheus_client counter takes a `threading.Lock` and checks the metric's
labels; a small Produce request made about twenty of them, a tenth of its time. The event loop is
one thread, so its counts go into `CounterTally`/`HistogramTally` cells without a lock, and
`TallyFlush` (the registry's first collector) adds what each cell gathered to its prometheus
child just before the registry is read: a scrape shows every count made before it, and the
names, labels and values served are those of the prometheus metrics themselves. Only the event
loop may count into a tally (the decoding thread counts into prometheus_client directly).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import Histogram
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

__all__ = ["CounterTally", "HistogramTally", "TallyFlush"]


class CounterTally:
    """One counter child's increments since the last collection."""

    __slots__ = ("_child", "pending")

    def __init__(self, child: Any) -> None:
        self._child = child
        self.pending: float = 0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.pending += amount

    def flush(self) -> None:
        if self.pending:
            amount, self.pending = self.pending, 0
            self._child.inc(amount)


class HistogramTally:
    """A histogram's observations since the last collection: per-bucket counts and their sum,
    added to the prometheus histogram's own buckets (the same `le` rule as `observe`)."""

    __slots__ = ("_bounds", "_counts", "_histogram", "_sum")

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._bounds: list[float] = list(histogram._upper_bounds)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        self._sum += amount
        self._counts[bisect_left(self._bounds, amount)] += 1

    def flush(self) -> None:
        counts, total = self._counts, self._sum
        if not any(counts):
            return
        self._counts, self._sum = [0] * len(counts), 0.0
        buckets = self._histogram._buckets
        for index, count in enumerate(counts):
            if count:
                buckets[index].inc(count)
        self._histogram._sum.inc(total)


class TallyFlush(Collector):
    """Registered first: collecting the registry flushes every tally before the metrics are
    read (it serves no metric of its own)."""

    def __init__(self) -> None:
        self.tallies: list[CounterTally | HistogramTally] = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for tally in self.tallies:
            tally.flush()
        return iter(())
