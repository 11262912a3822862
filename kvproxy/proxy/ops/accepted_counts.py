"""What a Produce request the compiled fast accept passed costs the metrics: the counts the
Python path makes of an accepted request (batches and records by topic, the request, its proxy
latency) and the path that decided it, in a few additions to cells looked up once per topic."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvproxy.proxy.ops.metric_tallies import CounterTally
    from kvproxy.proxy.ops.metrics import ProxyMetrics

__all__ = ["AcceptedCounts"]

_ACCEPTED = ("accepted",)


class AcceptedCounts:
    """The event loop's counts of requests accepted whole by the compiled fast accept."""

    __slots__ = ("_cells", "_compiled", "_forwarded", "_latency", "_metrics")

    def __init__(self, metrics: ProxyMetrics) -> None:
        self._metrics = metrics
        self._cells: dict[str, tuple[CounterTally, CounterTally]] = {}
        """Topic -> its batches and records cells, for topics with a label of their own (at
        most the topic labels' limit)."""
        self._forwarded = metrics.child(metrics.requests, "produce", "forwarded")
        self._compiled = metrics.child(metrics.decided, "compiled")
        self._latency = metrics.proxy_latency

    def count(self, topics: tuple[tuple[str, int, int], ...], latency: float) -> None:
        """One request: each topic's (name, batches, records), and the time the proxy took."""
        cells = self._cells
        for topic, batches, records in topics:
            pair = cells.get(topic)
            if pair is None:
                self._first(topic, batches, records)
            else:
                pair[0].pending += batches
                pair[1].pending += records
        self._forwarded.pending += 1
        self._compiled.pending += 1
        self._latency.observe(latency)

    def _first(self, topic: str, batches: int, records: int) -> None:
        """Counted through the topic labels (which may hold the count until the cluster names
        the topic); its cells kept once the topic has a label of its own."""
        metrics = self._metrics
        labels = metrics.topic_labels
        labels.count(metrics.batches, topic, _ACCEPTED, batches)
        labels.count(metrics.records, topic, _ACCEPTED, records)
        batches_cell = labels.cell(metrics.batches, topic, _ACCEPTED)
        records_cell = labels.cell(metrics.records, topic, _ACCEPTED)
        if batches_cell is not None and records_cell is not None:
            if len(self._cells) >= labels.limit:
                self._cells.clear()  # bounded as the labels are
            self._cells[topic] = (batches_cell, records_cell)
