"""The request path counts into plain Python tallies (no prometheus_client lock), and /metrics
still shows every request counted before it was asked, with the values prometheus_client
itself would have served."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.values import MutexValue

from kvproxy.protocol.framing import size_prefix
from kvproxy.proxy.ops.metric_tallies import CounterTally, HistogramTally, TallyFlush
from tests.harness.connection_pair import (
    TOPIC,
    ConnectionPair,
    connection_pair,
    produce_answer_ok,
    produce_request,
)

VERSION = 9


@pytest.fixture
def pair() -> Iterator[ConnectionPair]:
    with connection_pair() as made:
        yield made


def _exchange(pair: ConnectionPair, count: int) -> None:
    for n in range(count):
        pair.request(produce_request(VERSION, n))
        pair.answer(produce_answer_ok(VERSION, n))


def _samples(pair: ConnectionPair) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = pair.server.metrics.exposition().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_produce_request_takes_no_lock_of_prometheus_client(
    pair: ConnectionPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked: list[float] = []
    original = MutexValue.inc

    def counted(self: MutexValue, amount: float) -> None:
        locked.append(amount)
        original(self, amount)

    monkeypatch.setattr(MutexValue, "inc", counted)
    _exchange(pair, 5)
    assert pair.to_client.written  # the answers went through
    assert locked == []
    _samples(pair)  # the scrape hands the tallies over
    assert locked


def test_a_scrape_shows_every_request_counted_before_it(pair: ConnectionPair) -> None:
    request_bytes = len(size_prefix(produce_request(VERSION, 0)))
    request_bytes += len(produce_request(VERSION, 0))
    answer_bytes = len(size_prefix(b"")) + len(produce_answer_ok(VERSION, 0))
    done = 0
    for total in (7, 7 + 5, 7 + 5 + 1):
        _exchange(pair, total - done)
        done = total
        samples = _samples(pair)
        expected = {
            ("kvproxy_requests_total", (("api", "produce"), ("outcome", "forwarded"))): total,
            ("kvproxy_produce_batches_total", (("outcome", "accepted"), ("topic", TOPIC))): total,
            ("kvproxy_produce_records_total", (("outcome", "accepted"), ("topic", TOPIC))): total,
            ("kvproxy_bytes_total", (("direction", "client_in"),)): total * request_bytes,
            ("kvproxy_bytes_total", (("direction", "upstream_out"),)): total * request_bytes,
            ("kvproxy_bytes_total", (("direction", "upstream_in"),)): total * answer_bytes,
            ("kvproxy_bytes_total", (("direction", "client_out"),)): total * answer_bytes,
            ("kvproxy_produce_proxy_latency_seconds_count", ()): total,
            ("kvproxy_produce_upstream_latency_seconds_count", ()): total,
            ("kvproxy_produce_upstream_latency_seconds_bucket", (("le", "+Inf"),)): total,
        }
        assert {key: samples.get(key) for key in expected} == expected


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_a_histogram_tally_serves_what_observe_would_have() -> None:
    amounts = [0.0, 0.00005, 0.00004, 0.001, 0.0010001, 0.3, 10.0, 11.0, 1e9, 0.0025]
    buckets = (0.00005, 0.001, 0.0025, 0.5, 10.0)
    observed = CollectorRegistry()
    direct = Histogram("latency", "doc", buckets=buckets, registry=observed)
    tallied = CollectorRegistry()
    flush = TallyFlush()
    tallied.register(flush)
    tally = HistogramTally(Histogram("latency", "doc", buckets=buckets, registry=tallied))
    flush.tallies.append(tally)
    for index, amount in enumerate(amounts):
        direct.observe(amount)
        tally.observe(amount)
        if index % 4 == 3:  # scrapes in between: nothing counted twice or lost
            assert _without_created(generate_latest(tallied)) == _without_created(
                generate_latest(observed)
            )
    assert _without_created(generate_latest(tallied)) == _without_created(generate_latest(observed))


def test_a_counter_tally_refuses_a_negative_amount_as_prometheus_client_does() -> None:
    class Child:
        def inc(self, amount: float) -> None:
            raise AssertionError("not flushed yet")

    child: Any = Child()
    tally = CounterTally(child)
    with pytest.raises(ValueError, match="non-negative"):
        tally.inc(-1)
    assert tally.pending == 0
