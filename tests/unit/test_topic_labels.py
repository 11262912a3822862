"""kvproxy.proxy.ops.topic_labels: the `topic` label is a name only for topics the cluster has, and
what
holds names stays bounded however many a client invents (a fake cluster answers lookups)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvproxy.proxy.ops.metrics import ProxyMetrics, start_http_endpoint
from kvproxy.proxy.ops.topic_labels import ABSENT_TTL_S, FAILURE_BACKOFF_S, TopicLabels


class FakeCluster:
    """Answers lookups from a set of topics; records every request."""

    def __init__(self, *topics: str) -> None:
        self.topics = set(topics)
        self.requests: list[list[str]] = []
        self.failing = False

    async def __call__(self, names: list[str]) -> dict[str, bool | None]:
        self.requests.append(names)
        await asyncio.sleep(0)  # an answer comes later, as over a socket
        if self.failing:
            raise ConnectionError("no bootstrap server answered Metadata: connection refused")
        return {name: name in self.topics for name in names}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def proxy_metrics(
    cluster: FakeCluster,
    limit: int = 1000,
    clock: Callable[[], float] = time.monotonic,
    **bounds: int,
) -> ProxyMetrics:
    metrics = ProxyMetrics(limit)
    metrics.topic_labels = TopicLabels(limit, metrics.child, clock=clock, **bounds)
    metrics.topic_labels.lookup = cluster
    return metrics


def batches_by_topic(metrics: ProxyMetrics) -> dict[str, float]:
    text = metrics.exposition().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kvproxy_produce_batches_total":
                topic = sample.labels["topic"]
                out[topic] = out.get(topic, 0) + sample.value
    return out


async def test_a_topic_the_cluster_has_gets_its_name_and_a_made_up_one_is_unknown() -> None:
    cluster = FakeCluster("orders")
    metrics = proxy_metrics(cluster)
    labels = metrics.topic_labels
    for name in ("orders", "made-up", "orders"):
        labels.count(metrics.batches, name, ("accepted",), 2)
    assert batches_by_topic(metrics) == {}  # held until the cluster answers
    await labels.flush(5)
    assert batches_by_topic(metrics) == {"orders": 4, "_unknown": 2}
    assert cluster.requests == [["orders", "made-up"]]  # one request for both
    labels.count(metrics.batches, "orders", ("accepted",))
    labels.count(metrics.batches, "made-up", ("accepted",))
    assert batches_by_topic(metrics) == {"orders": 5, "_unknown": 3}  # answers remembered
    assert len(cluster.requests) == 1


async def test_topics_past_the_limit_are_other() -> None:
    cluster = FakeCluster("a", "b", "c")
    metrics = proxy_metrics(cluster, limit=2)
    for name in ("a", "b", "c"):
        metrics.topic_labels.count(metrics.batches, name, ("accepted",))
    await metrics.topic_labels.flush(5)
    assert batches_by_topic(metrics) == {"a": 1, "b": 1, "_other": 1}


@pytest.mark.parametrize(
    "name",
    ["x" * 250, "x" * 32_000, "bad\nname", "with space", "", ".", "..", "caf\u00e9"],
)
async def test_a_name_that_cannot_be_a_topic_is_unknown_without_asking(name: str) -> None:
    cluster = FakeCluster(name)
    metrics = proxy_metrics(cluster)
    metrics.topic_labels.count(metrics.batches, name, ("rejected",))
    assert batches_by_topic(metrics) == {"_unknown": 1}
    assert cluster.requests == []


async def test_a_metadata_answer_relayed_to_a_client_makes_a_topic_known() -> None:
    cluster = FakeCluster()  # the proxy's own lookups would say no: they are not asked
    metrics = proxy_metrics(cluster)
    metrics.topic_labels.seen(["orders", "bad name"])
    metrics.topic_labels.count(metrics.batches, "orders", ("accepted",))
    assert batches_by_topic(metrics) == {"orders": 1}
    assert cluster.requests == []


async def test_thousands_of_invented_names_stay_in_bounded_structures() -> None:
    cluster = FakeCluster("real")
    metrics = proxy_metrics(cluster, max_known=500, max_pending=100)
    labels = metrics.topic_labels
    for start in range(0, 3_000, 200):
        labels.count(metrics.batches, "real", ("accepted",))
        for n in range(start, start + 200):  # past 100 pending: _unknown without asking
            labels.count(metrics.batches, f"invented-{n}", ("rejected",))
            labels.count(metrics.records, f"invented-{n}", ("rejected",), 10)
        sizes = labels.sizes()
        assert sizes["pending"] <= 100 and sizes["known"] <= 500, sizes
        await labels.flush(5)
    assert labels.sizes() == {"labelled": 1, "known": 500, "pending": 0}
    assert batches_by_topic(metrics) == {"_unknown": 3_000, "real": 15}
    # the families' help text is the same whatever was counted: 3,000 names add two labels
    empty = len(proxy_metrics(FakeCluster("real"), max_known=500, max_pending=100).exposition())
    assert len(metrics.exposition()) < empty + 3_000
    assert all(len(request) <= 100 for request in cluster.requests)


async def test_when_the_cluster_cannot_be_asked_names_count_as_unknown_and_it_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kvproxy")
    cluster = FakeCluster("orders")
    cluster.failing = True
    clock = FakeClock()
    metrics = proxy_metrics(cluster, clock=clock)
    labels = metrics.topic_labels
    labels.count(metrics.batches, "orders", ("accepted",))
    await labels.flush(5)
    labels.count(metrics.batches, "other", ("accepted",))  # within the backoff: not asked
    assert batches_by_topic(metrics) == {"_unknown": 2}
    assert cluster.requests == [["orders"]]
    [warning] = [r for r in caplog.records if "which topics exist" in r.getMessage()]
    assert "connection refused" in warning.getMessage()

    clock.now += FAILURE_BACKOFF_S
    labels.count(metrics.batches, "third", ("accepted",))
    await labels.flush(5)  # asked again, failing again: not logged again
    assert len([r for r in caplog.records if "which topics exist" in r.getMessage()]) == 1
    cluster.failing = False
    clock.now += FAILURE_BACKOFF_S
    labels.count(metrics.batches, "orders", ("accepted",))
    await labels.flush(5)
    assert batches_by_topic(metrics) == {"_unknown": 3, "orders": 1}


async def test_no_such_topic_is_believed_for_a_while_then_asked_again() -> None:
    cluster = FakeCluster()
    clock = FakeClock()
    metrics = proxy_metrics(cluster, clock=clock)
    labels = metrics.topic_labels
    labels.count(metrics.batches, "later", ("accepted",))
    await labels.flush(5)
    cluster.topics.add("later")  # created since
    labels.count(metrics.batches, "later", ("accepted",))
    assert batches_by_topic(metrics) == {"_unknown": 2}
    clock.now += ABSENT_TTL_S
    labels.count(metrics.batches, "later", ("accepted",))
    await labels.flush(5)
    assert batches_by_topic(metrics) == {"_unknown": 2, "later": 1}
    assert cluster.requests == [["later"], ["later"]]


async def test_closing_counts_what_is_held_and_what_comes_later_as_unknown() -> None:
    cluster = FakeCluster("orders")
    metrics = proxy_metrics(cluster)
    metrics.topic_labels.count(metrics.batches, "orders", ("accepted",))
    metrics.topic_labels.close()
    await asyncio.sleep(0)
    assert batches_by_topic(metrics) == {"_unknown": 1}
    await metrics.topic_labels.flush(5)  # nothing left to wait for
    metrics.topic_labels.count(metrics.batches, "orders", ("accepted",))  # e.g. while stopping
    assert batches_by_topic(metrics) == {"_unknown": 2}
    assert cluster.requests == []  # nothing asked once closed


async def test_a_scrape_waits_for_the_answer_about_what_was_counted_before_it() -> None:
    answer = asyncio.Event()

    async def slow_cluster(names: list[str]) -> dict[str, bool | None]:
        await answer.wait()
        return dict.fromkeys(names, True)

    metrics = ProxyMetrics(1000)
    labels = metrics.topic_labels
    labels.lookup = slow_cluster
    labels.count(metrics.batches, "orders", ("accepted",), 3)
    flush = labels.flush

    async def answer_once_the_scrape_waits(timeout: float) -> None:
        answer.set()  # the cluster answers only now: a scrape that did not wait would miss it
        await flush(timeout)

    labels.flush = answer_once_the_scrape_waits  # type: ignore[method-assign]

    async def ready() -> tuple[bool, str]:
        return True, "ready"

    server = await start_http_endpoint("127.0.0.1", 0, metrics, ready)
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        body = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        server.close()
    assert b'kvproxy_produce_batches_total{outcome="accepted",topic="orders"} 3.0' in body
